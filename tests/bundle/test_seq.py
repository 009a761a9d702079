"""Bundles of varlen (packed sequences) and decode (K/V cache) variants: the refusals that remain,
the header and launcher text, and the C API end to end on the CPU stand-ins
(sources/stand_in.cpp plays the kernels from the very arguments the launchers pass): the bundle's
example passes against its float64 reference, fails when an output is wrong, and the launchers'
grids, split counts and workspaces are the Python runtime's. The tests that build the launcher
and example (g++, nvcc) and the nvcc builds of the real kernels (the declarations against
their definitions, CMake) are compile_all tests: CI runs them, the default command stays fast."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from flashgen.bundle.emit import (
    BWD_WORKSPACE_ALIGN,
    EXAMPLE_DECODE,
    LAUNCHER,
    BundleError,
    bundle_context,
    bundle_files,
    decode_workspace_layout,
    write_bundle,
)
from flashgen.generator.features import WINDOW
from flashgen.generator.schedulers import VARLEN_PERSISTENT
from flashgen.generator.spec import KernelSpec
from flashgen.runtime.decode import choose_splits, row_tiles, scratch_sizes

from ._support import (
    DECODE,
    DECODE_F,
    INVALID,
    NOT_SUPPORTED,
    PAIR,
    SEQ,
    VARLEN,
    VARLEN_F,
    assert_declarations_match,
    build_example_on_stand_ins,
    cmake_args,
    compile_all,
    cuda_includes,
    fill,
    prose,
    require_nvcc,
    run_program,
    symbol,
    tool,
)

SMS, OCCUPANCY = 132, 3  # the stand-ins' H200: SMs, and the blocks one SM holds (MOCK_OCCUPANCY)


def decode_symbol(spec: KernelSpec) -> str:
    """The prefix of a decode variant's C functions."""
    return "flashgen_" + spec.name.removeprefix("flash_decode_")


# ---- the refusals that remain --------------------------------------------------------------------
def test_a_varlen_backward_variant_is_refused_with_the_rule_and_the_fix() -> None:
    spec = KernelSpec(family="wgmma", d=64, dtype="bf16", direction="bwd", features=("varlen",))
    with pytest.raises(BundleError) as err:
        bundle_context([spec])
    msg = str(err.value)
    assert msg.startswith(f"{spec.name}: varlen backward variants are not bundled yet")
    assert "bundle the varlen forward, or the backward without varlen" in msg


def test_a_hooked_variant_whose_hook_is_unknown_is_refused_with_the_fix() -> None:
    # a hook token parses without its hook registered (the spec only names it by digest);
    # hooked forward variants bundle (tests/bundle/test_hooks.py) once their hook is known
    hooked = KernelSpec(family="wgmma", d=64, dtype="bf16", features=("scoremod0123456789ab",))
    with pytest.raises(BundleError) as err:
        bundle_context([hooked])
    msg = str(err.value)
    assert msg.startswith(f"{hooked.name}: its hook scoremod0123456789ab cannot be rendered")
    assert "pass the hooks with --score-mod / --mask-mod FILE:NAME" in msg


def test_varlen_and_decode_variants_are_bundled_beside_dense_ones() -> None:
    ctx = bundle_context([*PAIR, *SEQ])
    assert [c["kernel"] for c in ctx["variants"]] == sorted(s.name for s in PAIR)
    assert [c["kernel"] for c in ctx["varlen_variants"]] == sorted([VARLEN.name, VARLEN_F.name])
    assert [c["kernel"] for c in ctx["decode_variants"]] == sorted([DECODE.name, DECODE_F.name])
    assert ctx["num_variants"] == len(PAIR) + len(SEQ)
    # every kernel file is built: wgmma ones for sm_90a, the decode ones with the plain archs
    assert {c["kernel"] for c in ctx["arch_specific_variants"]} == {VARLEN.name, VARLEN_F.name}
    assert {DECODE.name, DECODE_F.name} <= {c["kernel"] for c in ctx["plain_variants"]}


def test_a_bundle_without_them_says_nothing_of_varlen_or_decode() -> None:
    files = bundle_files(PAIR)
    for name in ("flashgen_attention.h", LAUNCHER, "example.cu", "README.md"):
        assert "varlen" not in files[name] and "decode" not in files[name].lower(), name


# ---- the header and the launcher ---------------------------------------------------------------
def test_the_header_declares_the_entry_points_of_each_variant() -> None:
    header = prose(bundle_files(SEQ)["flashgen_attention.h"])
    for name in ("flashgen_varlen_fwd", "flashgen_decode", "flashgen_decode_workspace_bytes",
                 "flashgen_varlen_params_packed", "flashgen_decode_params_contiguous",
                 "flashgen_decode_params_paged"):  # fmt: skip
        assert f"{name}(" in header, name
    for spec in (VARLEN, VARLEN_F):
        s = symbol(spec)
        assert (
            f"cudaError_t {s}_fwd(const flashgen_varlen_params* p, cudaStream_t stream);" in header
        )
        assert (
            f"cudaError_t {s}_check(const flashgen_varlen_params* p, const char** why);" in header
        )
    for spec in (DECODE, DECODE_F):
        s = decode_symbol(spec)
        assert (
            f"cudaError_t {s}_decode(const flashgen_decode_params* p, cudaStream_t stream);"
            in header
        )
        ws = f"cudaError_t {s}_decode_workspace_bytes(const flashgen_decode_params* p, "
        assert ws + "size_t* bytes);" in header
    assert "#define FLASHGEN_NUM_VARLEN_VARIANTS 2" in header
    assert "#define FLASHGEN_NUM_DECODE_VARIANTS 2" in header


def test_the_launcher_builds_varlen_maps_over_the_packed_totals_and_passes_the_sequences() -> None:
    launcher = prose(bundle_files([VARLEN])[LAUNCHER])
    # maps of one batch over the totals (flashgen.varlen's (1, H, total, d) views)
    q_map = "encode_map(encode, &maps[0], p->q, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 1, p->H, "
    assert q_map + "p->total_q, 64," in launcher
    assert "p->cu_seqlens_q, p->cu_seqlens_k, p->n_seqs, counter);" in launcher
    assert "window_side(p->use_window, p->window_left, p->total_k)" in launcher
    # VARLEN stores O with the TMA (O_TMA_STORE): O's map over the packed rows as Q's, 64-row
    # boxes, passed after V's; O's strides checked as a map's, the fix naming the packed layout
    assert VARLEN.fam.o_tma_store(VARLEN)
    o_map = "encode_map(encode, &maps[3], p->o, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 1, p->H, "
    assert o_map + "p->total_q, 64, 0, p->o_head_stride, p->o_token_stride, 2, 64);" in launcher
    assert "maps[0], maps[1], maps[2], maps[3], p->H, n_batch= 1," in launcher
    assert '"varlen kernel stores o with TMA): pass a packed (total_q, H, dv) o, as "' in launcher


def test_a_varlen_launcher_gives_each_call_zeroed_counters_of_its_own_on_the_stream() -> None:
    """The dynamic tile scheduler's two words: per call from the stream-ordered pool (calls on
    other streams may run at the same time), zeroed on the stream before the kernel, freed on
    it after; nothing synchronises (a CUDA graph captures the three as nodes)."""
    launcher = prose(bundle_files([VARLEN])[LAUNCHER])
    steps = [
        "cudaMallocAsync(reinterpret_cast<void**>(&counter), 2 * sizeof(int), stream);",
        "cudaMemsetAsync(counter, 0, 2 * sizeof(int), stream);",
        "p->n_seqs, counter);",
        "cudaFreeAsync(counter, stream);",
    ]
    at = [launcher.rfind(step) for step in steps]  # the free's last: after the launch
    assert -1 not in at and at == sorted(at), at
    # the memset's failure gives the words back too, before returning
    assert launcher.count("cudaFreeAsync(counter, stream);") == 2
    for sync in ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaMemcpy("):
        assert sync not in launcher


def test_a_decode_launcher_zeroes_its_counters_on_the_stream_and_never_synchronises() -> None:
    launcher = bundle_files([DECODE])[LAUNCHER]
    assert "cudaMemsetAsync(counters, 0, s.counters_bytes, stream)" in launcher
    for sync in ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaMemcpy("):
        assert sync not in launcher


def test_decode_workspace_layout_is_the_runtime_scratch_aligned() -> None:
    for b, tq, h, h_kv, columns, page, _, splits in EXAMPLE_DECODE:
        tk = columns * (page or 1)
        tiles = row_tiles(DECODE, tq, h // h_kv)
        n = choose_splits(DECODE, b * h_kv * tiles, tk, 0, splits or 7)
        n_o, n_l, n_c = scratch_sizes(DECODE, b, h_kv, tiles, n)
        lse_at, counters_at, total = decode_workspace_layout(DECODE, b, h_kv, tiles, n)
        assert (
            lse_at >= n_o * 4 and counters_at >= lse_at + n_l * 4 and total == counters_at + n_c * 4
        )
        assert lse_at % BWD_WORKSPACE_ALIGN == 0 and counters_at % BWD_WORKSPACE_ALIGN == 0
    assert decode_workspace_layout(DECODE, 2, 2, 1, 1) == (0, 0, 0)  # one split: no scratch


@pytest.mark.compile_all  # nvcc's front end over every kernel: the compile-everything check
def test_launcher_declarations_match_the_varlen_and_decode_kernels(tmp_path: Path) -> None:
    write_bundle(bundle_files(SEQ), tmp_path)
    assert_declarations_match(tmp_path, [VARLEN, VARLEN_F], "n_seqs")
    assert_declarations_match(tmp_path, [DECODE, DECODE_F], "n_pages")


# ---- end to end on the CPU stand-ins -------------------------------------------------------------
@dataclass(frozen=True)
class SeqBuild:
    root: Path

    @property
    def objects(self) -> list[str]:
        return [str(self.root / "launch.o"), str(self.root / "stand_in.o")]

    def run(self, **env: str) -> subprocess.CompletedProcess[str]:
        return run_program(self.root / "example_on_cpu", **env)


@pytest.fixture(scope="module")
def seq(tmp_path_factory: pytest.TempPathFactory) -> SeqBuild:
    """The SEQ bundle's launcher (nvcc) and example (g++) linked with the CPU stand-ins."""
    root = tmp_path_factory.mktemp("seq")
    build_example_on_stand_ins(root, SEQ)
    return SeqBuild(root)


@pytest.mark.compile_all  # g++/nvcc builds of the launcher and example: CI's compile check
def test_the_example_runs_varlen_and_decode_against_its_reference(seq: SeqBuild) -> None:
    proc = seq.run()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    # 2 varlen problems per varlen variant, 3 decode problems per decode variant
    assert lines[-1].startswith("PASS: 10 of 10 problems and 4 of 4 variants' parameter checks")
    assert sum(ln.endswith("  ok") for ln in lines) == 10 + 4
    for spec, n in ((VARLEN, 11), (VARLEN_F, 11), (DECODE, 12), (DECODE_F, 12)):
        assert (
            f"  {spec.name}: {n} of {n} invalid parameter sets refused before launch  ok" in lines
        )
    # the given lengths (an empty sequence, Tq > Tk, 3 padded rows) and 24 random ones
    assert any("n_seqs=5 total_q=252 total_k=319" in ln for ln in lines)
    assert any("n_seqs=24" in ln for ln in lines)
    assert any("page_size=7 (0: contiguous) num_splits=20" in ln for ln in lines)


@pytest.mark.compile_all  # g++/nvcc builds of the launcher and example: CI's compile check
def test_the_example_fails_when_an_output_is_wrong(seq: SeqBuild) -> None:
    proc = seq.run(MOCK_BUG="perturb")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("FAIL: 0 of 10 problems")


@pytest.mark.compile_all  # g++/nvcc builds of the launcher and example: CI's compile check
def test_varlen_variants_refuse_a_gpu_other_than_9_0_and_decode_ones_run(seq: SeqBuild) -> None:
    proc = seq.run(MOCK_CC="80")
    assert proc.returncode == 1
    refused = [ln for ln in proc.stdout.splitlines() if "not runnable on this GPU" in ln]
    assert len(refused) == 4 and all("refused, as it must" in ln for ln in refused), proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("FAIL: 6 of 10 problems")


@pytest.mark.compile_all  # g++/nvcc builds of the launcher and example: CI's compile check
def test_the_header_helpers_work_from_c99(seq: SeqBuild) -> None:
    gcc, gxx = tool("gcc"), tool("g++")
    flags = ["-std=c99", "-Wall", "-Wextra", "-Werror", f"-I{seq.root}", *cuda_includes()]
    src = str(Path(__file__).parent / "sources" / "seq_header.c")
    compile_all([[gcc, *flags, "-c", src, "-o", "seq_header.o"]], seq.root)
    compile_all([[gxx, "seq_header.o", *seq.objects, "-o", "seq_header"]], seq.root)
    out = run_program(seq.root / "seq_header")
    assert out.returncode == 0, out.stderr
    rows = {ln.split("|")[0]: ln.split("|")[1:] for ln in out.stdout.splitlines()}
    # (total, H, d) packed: head stride d, token stride H*d (k: H_kv*d); every feature off
    assert rows["varlen"] == ["64", "512", "128", "512", "64", "-1", "0", "0"]
    # paged: Tk = 5 pages of 16, table rows 5 apart, the cache's batch stride a page
    assert rows["decode"][:7] == [
        "80",
        "5",
        str(16 * 2 * 128),
        str(8 * 128),
        str(2 * 8 * 128),
        "0",
        "-1",
    ]
    assert rows["decode"][7] in ("(nil)", "0x0", "0")
    assert rows["refused"] == [str(INVALID), str(INVALID), str(NOT_SUPPORTED), "0"]


def _grid_program(
    seq: SeqBuild, varlen: list[tuple[object, ...]], decode: list[tuple[int, ...]]
) -> Path:
    src = seq.root / "seq_grids.cpp"
    src.write_text(
        fill(
            "seq_grids.cpp",
            VARLEN_PROBLEMS="\n".join("  {" + ", ".join(map(str, c)) + "}," for c in varlen),
            DECODE_PROBLEMS="\n".join("  {" + ", ".join(map(str, c)) + "}," for c in decode),
            DECODE_D=DECODE.d,
            DECODE_SYMBOL=decode_symbol(DECODE),
        )  # fmt: skip
    )
    compile_all(
        [[tool("g++"), "-std=c++17", f"-I{seq.root}", *cuda_includes(), str(src), *seq.objects,
          "-o", "seq_grids"]],
        seq.root,
    )  # fmt: skip
    return seq.root / "seq_grids"


def _varlen_row(spec: KernelSpec, *problem: int) -> tuple[object, ...]:
    """A seq_grids.cpp VarlenProblem of `spec` (softcap 30 when it has it: its tanh has no off)."""
    cap = "30.0f" if "softcap" in spec.features else "0.0f"
    return (spec.d, spec.dv, f"FLASHGEN_{spec.dtype.upper()}", int(spec.causal), cap, *problem)


@pytest.mark.compile_all  # g++/nvcc builds of the launcher and example: CI's compile check
def test_launch_grids_splits_and_workspaces_are_the_python_runtimes(seq: SeqBuild) -> None:
    # (spec, n_seqs, total_q, total_k, max_q, max_k, H, use_window, left, right): few tiles (a
    # block each), many short ones (persistent), long sequences (a block each again), a window
    # that makes long ones cheap (persistent), a right side reaching every row (unbounded)
    varlen = [
        (VARLEN, 3, 300, 300, 128, 128, 2, 0, -1, -1),
        (VARLEN, 40, 8000, 8000, 200, 200, 4, 0, -1, -1),
        (VARLEN, 4, 40000, 40000, 10000, 10000, 4, 0, -1, -1),
        (VARLEN_F, 4, 40000, 40000, 10000, 10000, 4, 0, -1, -1),
        (VARLEN_F, 4, 40000, 40000, 10000, 10000, 4, 1, 256, 0),
        (VARLEN_F, 2, 500, 700, 300, 400, 8, 1, 10, 600),
    ]
    # (B, Tq, H, H_kv, Tk, num_splits): chosen (one split for short caches, many for long), forced
    decode = [
        (4, 1, 8, 8, 200, 0),
        (1, 1, 8, 2, 65536, 0),
        (2, 4, 16, 4, 5000, 0),
        (1, 1, 4, 4, 4096, 300),
        (2, 2, 8, 2, 1000, 5),
    ]
    log = seq.root / "grids.txt"
    log.unlink(missing_ok=True)
    program = _grid_program(seq, [_varlen_row(s, *pb) for s, *pb in varlen], decode)
    out = run_program(program, MOCK_GRID_ONLY=str(log), MOCK_OCCUPANCY=str(OCCUPANCY))
    assert out.returncode == 0, out.stdout + out.stderr
    launches = [ln.split("|") for ln in log.read_text().splitlines()]
    printed = [ln.split("|") for ln in out.stdout.splitlines()]
    assert [p[-1] for p in printed] == ["0"] * (len(varlen) + len(decode))  # all launched
    # each varlen call freed the scheduler counter it took (and the stand-in kernel found it
    # zeroed: it dies otherwise)
    assert [p[1] for p in printed[: len(varlen)]] == ["0"] * len(varlen)
    for (spec, n, tq, tk, mq, mk, h, use, left, right), got in zip(
        varlen, launches[: len(varlen)], strict=True
    ):
        sides = WINDOW.kernel_args((left, right), tq, tk) if use else (-1, -1)
        want = VARLEN_PERSISTENT.varlen_grid(spec, n, h, tq, mq, mk, SMS, sides)
        assert got[0] == spec.name and int(got[1]) == want[0], (n, tq, mq, mk, got)
        assert (int(got[6]), int(got[7])) == sides
    assert {int(g[1]) for g in launches[: len(varlen)]} > {SMS}  # persistent and not
    for (b, tq, h, h_kv, tk, forced), got, shown in zip(
        decode, launches[len(varlen) :], printed[len(varlen) :], strict=True
    ):
        tiles = row_tiles(DECODE, tq, h // h_kv)
        splits = choose_splits(DECODE, b * h_kv * tiles, tk, SMS * OCCUPANCY, forced)
        assert int(got[1]) == splits and int(got[2]) == tiles * h_kv and int(got[3]) == b, got
        assert int(shown[1]) == decode_workspace_layout(DECODE, b, h_kv, tiles, splits)[-1]
    assert {int(g[1]) for g in launches[len(varlen) :]} >= {1, 256}  # both ends of the rule


# ---- the real kernels through nvcc and CMake ----------------------------------------------------
def test_the_cmake_lists_build_the_varlen_kernels_for_sm90a_and_decode_with_the_others() -> None:
    cmake = bundle_files(SEQ)["CMakeLists.txt"]
    (objs,) = cmake_args(cmake, "add_library", "flashgen_kernels_sm90a")
    assert sorted(objs[2:]) == sorted(f"kernels/{s.name}.cu" for s in (VARLEN, VARLEN_F))
    (lib,) = cmake_args(cmake, "add_library", "flashgen_kernels")
    assert {f"kernels/{s.name}.cu" for s in (DECODE, DECODE_F)} <= set(lib)


@pytest.mark.compile_all  # the real kernels through nvcc (minutes): the compile-everything check
def test_cmake_builds_the_seq_bundle_and_its_example(tmp_path: Path) -> None:
    nvcc, cmake = require_nvcc(), tool("cmake")
    write_bundle(bundle_files(SEQ), tmp_path)
    build = tmp_path / "build"
    for cmd in (
        [cmake, "-S", str(tmp_path), "-B", str(build), f"-DCMAKE_CUDA_COMPILER={nvcc}",
         "-DFLASHGEN_CUDA_ARCHITECTURES=90-real"],
        [cmake, "--build", str(build), "-j", "4"],
    ):  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert (build / "example").is_file()
