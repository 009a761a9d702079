"""Backward variants in bundles: their files, C API and documentation; their launchers run
against the CPU stand-ins (sources/stand_in.cpp): the three kernels in order, the argument
checks (sources/bwd_validate.cpp), the device rule and the tensor maps of the wgmma backward;
a bundle of backward variants alone."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from flashgen.bundle.emit import (
    HEADER,
    LAUNCHER,
    BundleError,
    bundle_files,
    bwd_workspace_layout,
    write_bundle,
)
from flashgen.generator.render import render
from flashgen.generator.spec import KernelSpec
from flashgen.runtime.validate import MAX_LENGTH

from ._support import (
    BWD,
    BWD_A,
    BWD_B,
    BWD_W,
    INSUFFICIENT_DRIVER,
    INVALID,
    INVALID_DEVICE_FUNCTION,
    LAUNCH_FAILURE,
    MMA,
    NOT_SUPPORTED,
    PAIR,
    STAND_IN,
    WGMMA,
    assert_declarations_match,
    bwd_symbol,
    c_program,
    cmake_args,
    compile_all,
    cuda_includes,
    dtype_enum,
    fill,
    initializer_rows,
    prose,
    rows,
    run_program,
    table_rows,
    tool,
    words,
)
from .conftest import ExampleRun, StandIns

BACKWARD = [s for s in STAND_IN if s.direction == "bwd"]
STATIC_SMEM = 48 * 1024
ULP = {"bf16": 2.0**-7, "fp16": 2.0**-10}  # the storage dtype's spacing at 1


def test_backward_variants_bundle_beside_forward_ones_with_their_own_c_api() -> None:
    """The kernels as `flashgen build --direction bwd` writes them, in the library and the
    README; their C API (tests/bundle/test_header.py compiles every declaration of a bundle
    holding both directions, with these variants)."""
    files = bundle_files([MMA, *BWD])
    kernels = {f"kernels/{s.name}.cu" for s in [MMA, *BWD]}
    assert set(files) == {"CMakeLists.txt", "README.md", "example.cu", HEADER, LAUNCHER} | kernels
    for s in BWD:
        assert files[f"kernels/{s.name}.cu"] == render(s).source
    (lib,) = cmake_args(files["CMakeLists.txt"], "add_library", "flashgen_kernels")
    assert set(lib[3:]) == kernels
    readme = files["README.md"]
    assert all(table_rows(readme)[s.name][:4] == [str(s.d), "bf16", "yes" if s.causal else "no",
                                                  "mma"] for s in BWD)  # fmt: skip
    assert "flashgen_bwd(&p, FLASHGEN_BF16, /*causal=*/1, stream);" in words(readme)


def test_backward_launcher_launches_pre_main_post_and_stops_at_a_failed_launch(
    contract: str,
) -> None:
    accepted = {r[0]: r[1:] for r in rows(contract, "bwd_accepted")}
    assert set(accepted) == {s.name for s in BACKWARD}
    assert {s.smem_bytes > STATIC_SMEM for s in BACKWARD} == {True, False}
    failed = rows(contract, "bwd_failed")
    dispatched = {r[0]: r[1:] for r in rows(contract, "bwd_dispatch")}
    for s in BACKWARD:
        opt_in = int(s.smem_bytes > STATIC_SMEM)  # the main kernel's, above 48 KiB only
        maps = 4 if s.family == "wgmma" else 0  # Q, K, V and dO
        # status, launches, opt-ins, maps encoded, the last kernel (the stand-ins check the
        # order _pre, main, _post, each one's grid, block and shared memory)
        assert accepted[s.name] == ["0", "3", str(opt_in), str(maps), f"{s.name}_post"], s.name
        # the k-th launch fails: its status is returned, no later kernel is launched
        assert [r[1:] for r in failed if r[0] == s.name] == [
            [str(k), str(LAUNCH_FAILURE), str(k)] for k in (1, 2, 3)
        ]
        # flashgen_bwd on its key (causal: any nonzero value) runs it
        assert dispatched[s.name] == ["0", f"{s.name}_post", s.name]


def test_backward_device_rules_and_the_wgmma_backward_on_another_gpu(contract: str) -> None:
    for kernel, cc, rc, why, supported, why_supported in rows(contract, "bwd_device"):
        spec = next(s for s in BACKWARD if s.name == kernel)
        exact = spec.family == "wgmma"
        if (int(cc) == 90) if exact else (int(cc) >= 80):
            assert (rc, why, supported, why_supported) == ("0", "NULL", "0", "NULL"), (kernel, cc)
            continue
        needs = "9.0 only" if exact else "8.0 or newer"
        reason = f"{kernel} (family {spec.family}) needs compute capability {needs}"
        assert int(rc) == int(supported) == INVALID_DEVICE_FUNCTION, (kernel, cc)
        assert why.startswith(reason) and why_supported == why, (kernel, cc, why)
    wrong_gpu = {r[0]: r[1:] for r in rows(contract, "bwd_wrong_gpu")}
    for s in BACKWARD:  # sm_86: the wgmma backward refuses before any map, opt-in or launch
        opt_in = str(int(s.smem_bytes > STATIC_SMEM))
        want = [str(INVALID_DEVICE_FUNCTION), "0", "0", "0"] if s.family == "wgmma" else (
            ["0", "3", opt_in, "0"]
        )  # fmt: skip
        assert wrong_gpu[s.name] == want, s.name


def test_the_example_checks_each_backward_variant_with_its_rule_and_workspace(
    stand_ins: StandIns,
) -> None:
    """Each backward problem of the example's table: the variant's key and problem, its
    dtype's ulp, whether it loads through tensor maps, its own workspace size."""
    table = initializer_rows((stand_ins.root / "example.cu").read_text(), "kBwdCases")
    problems = {True: [(2, 3, 77, 131, 3), (2, 3, 131, 77, 3), (1, 8, 65, 97, 2)],
                False: [(2, 3, 77, 131, 3), (1, 8, 65, 97, 2)]}  # fmt: skip
    want = [
        [f'"{s.name}"', dtype_enum(s), str(int(s.causal)), str(s.d), *map(str, pb),
         ULP[s.dtype], "true" if s.family == "wgmma" else "false",
         f"{bwd_symbol(s)}_bwd_workspace_bytes"]
        for s in sorted(BACKWARD, key=lambda s: s.name) for pb in problems[s.causal]
    ]  # fmt: skip
    assert [[*r[:9], float(r[9]), *r[10:]] for r in table] == want


def test_a_wgmma_backward_bundles_with_its_maps_and_its_workspace_documented() -> None:
    files = bundle_files([WGMMA, BWD_W])
    assert files[f"kernels/{BWD_W.name}.cu"] == render(BWD_W).source
    h, readme, cmake = prose(files[HEADER]), files["README.md"], files["CMakeLists.txt"]
    sym = bwd_symbol(BWD_W)
    # each variant's workspace, its size function, and the dispatch's (the most of head dim d)
    ws = (
        f"workspace ({sym}_bwd_workspace_bytes): D and LSE*log2(e) (B*H*2*TQP floats), then "
        "the dQ accumulator (B*H*TQP*d floats), TQP = Tq rounded up to 128"
    )
    assert re.search(re.escape(ws) + r"(?!\w)", h), ws
    assert "the most that any backward variant of this bundle with head dim p->d needs" in h
    assert "Backward variants of family wgmma load Q, K, V and dO with TMA" in h
    assert "(loads Q, K, V and dO with TMA: their strides must also be positive" in h
    mma = prose(bundle_files([BWD_B])[HEADER])
    assert (
        f"workspace ({bwd_symbol(BWD_B)}_bwd_workspace_bytes): D (B*H*Tq floats), then the dQ "
        "accumulator (B*H*Tq*d floats)" in mma
    )
    assert "TQP" not in mma and "and dO with TMA" not in mma
    assert "cudaErrorInsufficientDriver" not in mma
    # both wgmma kernel files in the sm_90a object library
    assert cmake_args(cmake, "add_library", "flashgen_kernels_sm90a") == [
        ["flashgen_kernels_sm90a", "OBJECT", *(f"kernels/{s.name}.cu" for s in (BWD_W, WGMMA))]
    ]
    row = table_rows(readme)[BWD_W.name]
    assert row[:5] == ["64", "fp16", "no", "wgmma", "128 x 128"], row
    assert row[-1].endswith("sm_90a: H100/H200 only")
    assert "three in the forward, four in the backward" in words(readme)
    assert "_bwd_workspace_bytes(&p)" in readme
    # a bundle of the wgmma backward alone (compiled and run by test_backward_only_bundle...):
    # none of the forward's helpers or docs
    alone = bundle_files([BWD_W])
    assert "kPersistentMaxKeyTiles" not in alone[LAUNCHER]
    assert "Variants of family wgmma load Q, K and V" not in prose(alone[HEADER])


def test_backward_only_bundle_runs_its_example_and_refuses_forward_calls(
    stand_ins: StandIns, tmp_path: Path
) -> None:
    """The wgmma backward alone, its launcher compiled as against CUDA 12.4 (the encoder looked
    up with cudaGetDriverEntryPoint): its example runs the backward on a CPU forward, and a C
    program finds no forward variant."""
    example = stand_ins.bwd_alone / "example_on_cpu"
    proc = run_program(example, MOCK_ENTRY_API="legacy")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1].startswith("PASS: 2 of 2 problems and 1 of 1 variants' parameter checks")
    assert f"  {BWD_W.name} B=2 H=3 Tq=77 Tk=131 H_kv=3 (O and LSE from the CPU)" in lines
    # it did use the legacy look-up: the stand-ins refuse it for a CUDA 12.5+ build
    newer = run_program(example)
    assert newer.returncode != 0 and "cudaGetDriverEntryPoint with CUDA 12.5" in newer.stderr
    objects = [str(stand_ins.bwd_alone / "launch.o"), stand_ins.objects[1]]
    exe = c_program(stand_ins.bwd_alone, objects, tmp_path)
    out = run_program(exe)
    assert out.returncode == 0, out.stdout + out.stderr
    assert rows(out.stdout, "fwd") == [[str(NOT_SUPPORTED), "", "0"]]  # nothing ran
    assert rows(out.stdout, "fwd_null") == [[str(INVALID)]]
    assert rows(out.stdout, "fwd_variant") == [["NULL", "NULL", "NULL"]]


def test_backward_only_bundle_and_the_backward_refusals() -> None:
    with pytest.raises(BundleError, match="both serve d=64 bf16 non-causal: flashgen_bwd"):
        bundle_files([BWD_B, BWD_B.replace(stages=1)])
    with pytest.raises(BundleError, match="gqapack variants are not bundled"):
        bundle_files([MMA.replace(features=("gqapack",), causal=False)])
    # a forward and a backward of one key live together
    fwd = KernelSpec(family="mma", d=64, dtype="bf16", causal=False)
    assert bundle_files([fwd, BWD_B])  # no clash
    # a bundle without backward variants has none of their code
    plain = bundle_files(PAIR)[LAUNCHER]
    assert "_bwd_check" not in plain and "check_bwd_common" not in plain


# label -> the words in the reason (None: accepted)
BWD_EXPECTED: dict[str, str | None] = {
    "ok": None,
    "null_params": "params is NULL",
    "null_q": "q is NULL",
    "null_k": "k is NULL",
    "null_v": "v is NULL",
    "null_o": "o is NULL",
    "null_dout": "dout is NULL",
    "null_dq": "dq is NULL",
    "null_dk": "dk is NULL",
    "null_lse": "lse is NULL",
    "null_dv": "dv is NULL",
    "null_workspace": "workspace is NULL",
    "B0": "B < 1",
    "Tk0": "Tk < 1",
    "Tq_over": "split the sequence",
    "H_grid": "grid y",
    "H_kv_3": "H_kv must divide H",
    "H_kv_neg": "H_kv must divide H",
    "d": "head dimension",
    "scale0": "scale must be finite and > 0",
    "scale_nan": "scale must be finite and > 0",
    "scale_huge": "log2(e) overflows",
    "lse_misaligned": "lse is not 4-byte aligned",
    "q_plus_8_bytes": "q is not 16-byte aligned",
    "dk_plus_2_bytes": "dk is not 16-byte aligned",
    "dout_token_stride_odd": "a dout stride is not a multiple of 8 elements",
    "dv_head_stride_4": "a dv stride is not a multiple of 8 elements",
    "o_batch_stride_12": "an o stride is not a multiple of 8 elements",
    "dq_token_stride_zero": "a dq stride is 0 on an axis longer than 1",
    "dk_head_stride_zero": "a dk stride is 0 on an axis longer than 1",
    "o_token_stride_zero": "an o stride is 0 on an axis longer than 1",
    "dq_batch_stride_zero_B1": None,  # an axis of extent 1 is never stepped
    "odd_token_strides_Tq1": None,
    "negative_q_token_stride_8": None,  # any sign, as in Python
    "dv_equals_dk": "two of dq, dk, dv start at the same address",
    "dq_equals_q": "starts where an input",
    "workspace_one_byte_short": "workspace_bytes < {sym}_bwd_workspace_bytes(p): allocate",
    "workspace_plus_4_bytes": "workspace is not 16-byte aligned",
    "workspace_on_dq": "the workspace overlaps a tensor",
    "workspace_on_lse": "the workspace overlaps lse",
    "workspace_size_overflow": "overflows size_t",
}


@pytest.fixture(scope="module")
def bwd_validate(stand_ins: StandIns) -> Callable[[KernelSpec], Path]:
    """sources/bwd_validate.cpp for a backward variant, linked with the stand-in bundle's
    launcher and stand-ins (built once per variant)."""
    root, built = stand_ins.root, {}

    def program(spec: KernelSpec) -> Path:
        exe = f"bwd_validate_{spec.family}"
        if exe not in built:
            (root / f"{exe}.cpp").write_text(
                fill("bwd_validate.cpp", D=spec.d, SYM=bwd_symbol(spec), MAX=MAX_LENGTH,
                     CAUSAL=int(spec.causal), DTYPE=dtype_enum(spec))
            )  # fmt: skip
            compile_all(
                [[tool("g++"), "-std=c++17", f"-I{root}", *cuda_includes(), f"{exe}.cpp",
                  *stand_ins.objects, "-o", exe]],
                root,
            )  # fmt: skip
            built[exe] = root / exe
        return built[exe]

    return program


@pytest.mark.parametrize("spec", [BWD_B, BWD_W], ids=["mma", "wgmma"])
def test_backward_launcher_refuses_bad_parameters_before_any_launch(
    bwd_validate: Callable[[KernelSpec], Path], spec: KernelSpec
) -> None:
    out = run_program(bwd_validate(spec))
    assert out.returncode == 0, out.stdout + out.stderr
    cases = {r[0]: r[1:] for r in rows(out.stdout, "case")}
    assert set(cases) == set(BWD_EXPECTED)
    expected = {k: v and v.format(sym=bwd_symbol(spec)) for k, v in BWD_EXPECTED.items()}
    if spec.family == "wgmma":  # its tensor maps take positive strides only
        expected["negative_q_token_stride_8"] = (
            "a q stride is not a positive multiple of 16 bytes below 2^40 (the wgmma backward "
            "loads q, k, v and dout with TMA): copy q, or bundle the family mma backward variant"
        )
    for label, (check, launched, calls, why) in cases.items():
        rule = expected[label]
        if rule is None:
            assert (int(check), why) == (0, "NULL"), (label, why)
            if label == "ok":  # pre, main, post, and the opt-in above 48 KiB
                assert (int(launched), int(calls)) == (0, 4), (label, launched, calls)
            continue
        assert (int(check), int(launched), int(calls)) == (INVALID, INVALID, 0), (label, why)
        assert rule in why, (label, why)
    # the workspace sizes against backward.scratch_shapes' (bundle.bwd_workspace_layout): the
    # dispatch's is the larger of the bundle's two d=64 variants (BWD_B mma, BWD_W wgmma)
    (bytes_row,) = rows(out.stdout, "bytes")
    b, h, tq = 2, 4, 33
    assert bwd_workspace_layout(BWD_B, b, h, tq) == (1056, 1056 + b * h * tq * 64 * 4)
    assert bwd_workspace_layout(BWD_B, 1, 1, 3) == (16, 16 + 3 * 64 * 4)  # D padded to 16 bytes
    # wgmma (its 128-row query tile at d 64): D and LSE*log2(e) over 128 rows per head (Tq = 33
    # rounded up), the dQ accumulator
    assert BWD_W.br == 128
    ws = (b * h * 2 * 128 * 4, b * h * 128 * (2 + 64) * 4)
    assert bwd_workspace_layout(BWD_W, b, h, tq) == ws
    assert bytes_row == [
        str(bwd_workspace_layout(BWD_W, b, h, tq)[1]),
        str(bwd_workspace_layout(spec, b, h, tq)[1]),
        str(bwd_workspace_layout(BWD_W, 1, 1, 1)[1]),
        str(bwd_workspace_layout(spec, 1, 1, 1)[1]),
        "0", "0", "0",
    ]  # fmt: skip
    dispatch = {r[0]: [int(x) for x in r[1:]] for r in rows(out.stdout, "dispatch")}
    assert dispatch == {
        "ok": [0, 4], "null": [INVALID], "fp32": [NOT_SUPPORTED], "mask": [NOT_SUPPORTED],
        "bad": [INVALID],
    }  # fmt: skip
    assert rows(out.stdout, "variant") == [[
        BWD_A.name, BWD_B.name, "NULL", str(NOT_SUPPORTED),
        "this bundle has no backward variant for (d, dtype, causal)",
    ]]  # fmt: skip


@pytest.mark.parametrize(
    ("env", "code"),
    [({"MOCK_CC": "86"}, INVALID_DEVICE_FUNCTION), ({"MOCK_ENCODE": "fail"}, INVALID),
     ({"MOCK_ENCODE": "missing"}, INSUFFICIENT_DRIVER)],
    ids=["sm86", "map_refused", "no_encoder"],
)  # fmt: skip
def test_wgmma_backward_launcher_refuses_another_gpu_or_map_before_any_launch(
    bwd_validate: Callable[[KernelSpec], Path], env: dict[str, str], code: int
) -> None:
    out = run_program(bwd_validate(BWD_W), **env)
    assert out.returncode == 0, out.stdout + out.stderr
    # the check needs no GPU and passes; the launch is refused with no kernel and no opt-in,
    # directly and through the dispatch
    (direct,) = [r[1:4] for r in rows(out.stdout, "case") if r[0] == "ok"]
    (dispatched,) = [r[1:] for r in rows(out.stdout, "dispatch") if r[0] == "ok"]
    assert direct == ["0", str(code), "0"] and dispatched == [str(code), "0"]


def test_wgmma_backward_maps_are_the_ones_tma_py_encodes(
    example_run: ExampleRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The C launcher's four tensor maps of each backward call in the example, field for field
    as the driver received them, against what tma.backward_tensor_maps (the Python path) asks
    the driver for on the same problem (same pointers, sizes and strides)."""
    from flashgen.runtime import backward, tma
    from flashgen.runtime.validate import Problem

    assert example_run.proc.returncode == 0, example_run.proc.stdout + example_run.proc.stderr
    lines = example_run.maps.splitlines()
    assert [ln.split("|")[0] for ln in lines] == [BWD_W.name] * 2  # its two problems

    encoded: list[tuple[int, ...]] = []

    class FakeDriver:  # records cuTensorMapEncodeTiled's arguments as the C stand-in does
        @staticmethod
        def cuTensorMapEncodeTiled(tmap, dtype, rank, ptr, dims, strides, box, unit, *modes):
            encoded.append((
                ptr.value, dtype, rank, *dims[:rank], *strides[: rank - 1], *box[:rank],
                *unit[:rank], *modes,
            ))  # fmt: skip
            return 0

    monkeypatch.setattr(tma, "_libcuda", lambda: FakeDriver)
    monkeypatch.setattr(tma, "_bwd_maps", tma.OrderedDict())
    for line in lines:
        _, b, h, hkv, tq, tk, ptrs, strides, *maps = line.split("|")
        q, k, v, do = (int(x) for x in ptrs.split(","))
        s = [int(x) for x in strides.split(",")]
        three = [tuple(s[i : i + 3]) for i in range(0, 24, 3)]
        fwd = Problem(int(b), int(h), int(tq), int(tk), BWD_W.d, BWD_W.dtype, three[0], three[1],
                      three[2], three[3], h_kv=int(hkv))  # fmt: skip
        bp = backward.BackwardProblem(fwd, three[4], *three[5:], 0, 0, 0, 0)
        encoded.clear()
        tma.backward_tensor_maps(BWD_W, bp, q, k, v, do)
        assert [tuple(int(x) for x in m.split(",")) for m in maps] == encoded, line


@pytest.mark.compile_all  # nvcc-heavy: runs with the compile-everything check
def test_backward_launcher_declarations_match_the_kernel_definitions(tmp_path: Path) -> None:
    """As for the forward: the three declarations beside the kernels' definitions compile, and
    a changed one does not (wgmma: with its four tensor maps first)."""
    write_bundle(bundle_files([BWD_A, BWD_W]), tmp_path)
    assert_declarations_match(tmp_path, [BWD_A, BWD_W], "kv_group")
