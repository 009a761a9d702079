"""Bundles of varlen (packed sequences) and decode (K/V cache) variants: the refusals that remain,
the header and launcher text, and the C API end to end on the CPU stand-ins
(sources/stand_in.cpp plays the kernels from the very arguments the launchers pass): the bundle's
example passes against its float64 reference, fails when an output is wrong, and the launchers'
grids, split counts and workspaces are the Python runtime's (sm_90 code: the decode kernel a
programmatic dependent, and its merge kernel after it; older code: plain launches, merged inside),
asking the kernel's code once per variant and device. The tests that build the launcher
and example (g++, nvcc) and the nvcc builds of the real kernels (the declarations against
their definitions, CMake) are compile_all tests: CI runs them, the default command stays fast."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

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
from flashgen.generator.families.mma.decode import combine_name
from flashgen.generator.features import WINDOW
from flashgen.generator.schedulers import VARLEN_PERSISTENT
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import launch
from flashgen.runtime.decode import (
    COMBINE_ENV,
    COMBINE_THREADS,
    DECODE_MIN_TILES_PER_WARP_MERGED,
    choose_splits,
    row_tiles,
    scratch_sizes,
)
from flashgen.runtime.decode_call import choose_launch

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
    words,
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


def _function(source: str, name: str) -> str:
    """The text of C function `name` in `source`: its signature to the closing brace of its
    body (the first line that is just "}")."""
    m = re.search(rf"^[^\n]*\b{re.escape(name)}\([^;{{]*\)\s*{{.*?^}}", source, re.S | re.M)
    assert m is not None, f"no definition of {name}"
    return m.group(0)


def test_a_decode_launcher_merges_in_the_merge_kernel_by_the_code_that_runs() -> None:
    # the rule comes from the kernel's code as the runtime reports it (SASS and the PTX it came
    # from: sm_80 PTX JIT-compiled on an H100 says binaryVersion 90), never the device's
    # compute capability, asked once per (variant, device); the finer split count and the merge
    # kernel's block are runtime/decode's; sm_90 code is launched as a programmatic dependent
    launcher = bundle_files([DECODE])[LAUNCHER]
    symbol, combine = decode_symbol(DECODE), combine_name(DECODE)
    text = prose(launcher)
    merged = DECODE_MIN_TILES_PER_WARP_MERGED
    assert f"constexpr int kDecodeMinTilesPerWarpMerged = {merged};" in text
    assert f"constexpr int kDecodeCombineThreads = {COMBINE_THREADS};" in text
    assert "constexpr int kDecodeCombineArch = 90;" in text
    assert "constexpr int kDecodeGateDevices = 64;" in text
    gate = words(_function(launcher, "decode_code_sm90"))
    asked = [
        "cudaGetDevice(&device)",
        "const bool kept = device >= 0 && device < kDecodeGateDevices;",
        "const signed char known = kept ? cache[device].load(std::memory_order_relaxed) : 0;",
        "if (known != 0) { *sm90 = known == 2; return cudaSuccess; }",
        "cudaFuncGetAttributes(&attr, kernel)",
        "*sm90 = attr.binaryVersion >= kDecodeCombineArch && "
        "attr.ptxVersion >= kDecodeCombineArch;",
        "if (kept) cache[device].store(*sm90 ? 2 : 1, std::memory_order_relaxed);",
    ]
    at = [gate.find(step) for step in asked]
    assert -1 not in at and at == sorted(at), list(zip(asked, at, strict=True))
    kept = words(_function(launcher, f"{symbol}_decode_sm90"))
    assert "static std::atomic<signed char> cache[kDecodeGateDevices];" in kept
    assert f"decode_code_sm90(reinterpret_cast<const void*>({DECODE.name}), cache, sm90)" in kept
    splits = words(_function(launcher, f"{symbol}_decode_splits"))
    assert "ComputeCapability" not in splits and "cudaGetDeviceProperties" not in splits
    assert "cudaFuncGetAttributes" not in splits  # only through the per-device answer
    # a forced count: the merge kernel with more than one split
    assert f"return *splits > 1 ? {symbol}_decode_sm90(apart) : cudaSuccess;" in splits
    # a chosen one: redone finer with the merge kernel, taken while blocks x splits <= SMs
    chosen = [
        "*splits = decode_splits(0, p->Tk, BC, WARPS, blocks, slots);",
        "if (*splits == 1) return cudaSuccess;",
        f"err = {symbol}_decode_sm90(apart); if (err != cudaSuccess || !*apart) return err;",
        "const int finer = decode_splits(0, p->Tk, BC, WARPS, blocks, slots, "
        "kDecodeMinTilesPerWarpMerged); if (blocks * finer <= sms) *splits = finer;",
    ]
    at = [splits.find(step) for step in chosen]
    assert -1 not in at and at == sorted(at), list(zip(chosen, at, strict=True))
    # the workspace is sized from the same split count the launch takes
    sized = words(_function(launcher, f"{symbol}_decode_workspace_bytes"))
    assert f"{symbol}_decode_splits(p, &splits, &apart)" in sized
    run = words(_function(launcher, f"{symbol}_decode"))
    assert "cudaFuncGetAttributes" not in run  # only through the per-device answer
    # the decode kernel's arguments, the same in both of its launches
    args = (
        "static_cast<const T*>(p->q), static_cast<const T*>(p->k_cache), "
        "static_cast<const T*>(p->v_cache), static_cast<T*>(p->o), p->lse, o_part, lse_part, "
        "counters, p->cache_seqlens, p->block_table,"
    )
    steps = [
        f"{symbol}_decode_splits(p, &splits, &apart)",
        f"err = {symbol}_decode_sm90(&sm90); if (err != cudaSuccess) return err;",
        "int* counters = splits > 1 && !apart ? reinterpret_cast<int*>(ws + s.counters_at) "
        ": nullptr;",
        "if (counters != nullptr) {",
        "cudaMemsetAsync(counters, 0, s.counters_bytes, stream)",
        "dependent[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;",
        "dependent[0].val.programmaticStreamSerializationAllowed = 1;",
        "config.stream = stream; config.attrs = dependent; config.numAttrs = 1;",
        # sm_90 code: the decode kernel a programmatic dependent; older code: a plain launch
        "if (sm90) {",
        "config.gridDim = grid; config.blockDim = dim3(THREADS); "
        "config.dynamicSmemBytes = SMEM_BYTES;",
        f"err = cudaLaunchKernelEx(&config, {DECODE.name}, {args}",
        "} else {",
        f"{DECODE.name}<<<grid, THREADS, SMEM_BYTES, stream>>>( {args}",
        "err = cudaGetLastError(); }",
        "if (err != cudaSuccess || !apart) return err;",
        "config.gridDim = dim3(static_cast<unsigned>(p->Tq * (p->H / hkv)), "
        "static_cast<unsigned>(hkv), static_cast<unsigned>(p->B));",
        "config.blockDim = dim3(kDecodeCombineThreads);",
        "config.dynamicSmemBytes = 0;",
        f"return cudaLaunchKernelEx( &config, {combine}, static_cast<T*>(p->o), p->lse, "
        "static_cast<const float*>(o_part), static_cast<const float*>(lse_part), p->Tq, splits, "
        "p->o_batch_stride, p->o_head_stride, p->o_token_stride, p->H / hkv);",
    ]
    at = [run.find(step) for step in steps]
    assert -1 not in at and at == sorted(at), list(zip(steps, at, strict=True))


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
def test_the_example_passes_with_the_decode_splits_merged_in_the_launch_too(seq: SeqBuild) -> None:
    # the run above takes the merge kernel (sm_90 code: the stand-in decode kernel then stores
    # only its splits); sm_80 PTX JIT-compiled on the same GPU merges in the decode launch,
    # through the counters the launcher zeroes (the stand-in dies on NULL counters there)
    proc = seq.run(MOCK_PTX="80")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("PASS: 10 of 10 problems")


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


class _Driver:
    """The stand-ins' occupancy, as `launch.Driver.resident_blocks` would report it."""

    def resident_blocks(self, function: object, threads: int, smem: int) -> int:
        return OCCUPANCY


def _runtime_splits(
    monkeypatch: pytest.MonkeyPatch, blocks: int, tk: int, forced: int, arch: str
) -> int:
    """The split count runtime/decode_call.choose_launch gives DECODE (the caller's variant,
    as a bundle's is) for `blocks` row tiles on the stand-ins' GPU, its code built for `arch`."""
    monkeypatch.setattr(launch, "driver", _Driver)
    monkeypatch.delenv(COMBINE_ENV, raising=False)
    plan = cast(Any, SimpleNamespace(sms=SMS, arch=arch, function=None, smem=DECODE.smem_bytes))
    spec, _, splits = choose_launch(DECODE, True, lambda s: plan, blocks, tk, forced)
    assert spec == DECODE
    return splits


@pytest.mark.compile_all  # g++/nvcc builds of the launcher and example: CI's compile check
@pytest.mark.parametrize(("binary", "ptx"), [("90", "90"), ("90", "80"), ("80", "80")])
def test_launch_grids_splits_and_workspaces_are_the_python_runtimes(
    seq: SeqBuild, binary: str, ptx: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the decode kernel's code built for sm_90 (a programmatic dependent, the merge kernel after
    # it), sm_80 PTX that the H100 stand-in JIT-compiles (binaryVersion 90, ptxVersion 80), or
    # sm_80 SASS (both older code: plain launches, merged in the launch)
    sm90 = binary == ptx == "90"
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
    # (B, Tq, H, H_kv, Tk, num_splits): chosen (one split for short caches, many for long; one
    # block, whose splits the merge kernel cuts finer), forced
    decode = [
        (4, 1, 8, 8, 200, 0),
        (1, 1, 8, 2, 65536, 0),
        (2, 4, 16, 4, 5000, 0),
        (1, 1, 8, 1, 2048, 0),
        (1, 1, 4, 4, 4096, 300),
        (2, 2, 8, 2, 1000, 5),
    ]
    log = seq.root / "grids.txt"
    log.unlink(missing_ok=True)
    program = _grid_program(seq, [_varlen_row(s, *pb) for s, *pb in varlen], decode)
    out = run_program(
        program, MOCK_GRID_ONLY=str(log), MOCK_OCCUPANCY=str(OCCUPANCY), MOCK_BINARY=binary,
        MOCK_PTX=ptx,
    )  # fmt: skip
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
    # each decode call: its kernel (a programmatic dependent exactly when its code is sm_90's,
    # one split or many), then with splits on sm_90 code the merge kernel, grid (Tq x group,
    # H_kv, B), given Tq and the split count (the stand-in checks the rest against the decode
    # launch: scratch, o, lse, o's strides, stream, the dependent launch)
    rest = iter(launches[len(varlen) :])
    counts, finer = [], 0
    for (b, tq, h, h_kv, tk, forced), shown in zip(decode, printed[len(varlen) :], strict=True):
        got = next(rest)
        tiles = row_tiles(DECODE, tq, h // h_kv)
        splits = _runtime_splits(monkeypatch, b * h_kv * tiles, tk, forced, f"sm_{ptx}")
        assert got[0] == DECODE.name, got
        assert int(got[1]) == splits and int(got[2]) == tiles * h_kv and int(got[3]) == b, got
        assert got[11] == str(int(sm90)), got  # launched as a programmatic dependent
        assert int(shown[1]) == decode_workspace_layout(DECODE, b, h_kv, tiles, splits)[-1]
        if splits > 1 and sm90:
            want = [combine_name(DECODE), *map(str, (tq * (h // h_kv), h_kv, b, tq, splits))]
            assert next(rest) == want
        counts.append(splits)
        finer += splits != choose_splits(DECODE, b * h_kv * tiles, tk, SMS * OCCUPANCY, forced)
    assert next(rest, None) is None  # no other launch
    assert set(counts) >= {1, 256}  # both ends of the rule
    assert finer == (1 if sm90 else 0)  # the finer count: the merge kernel's alone


@pytest.mark.compile_all  # g++/nvcc builds of the launcher and example: CI's compile check
@pytest.mark.parametrize("ptx", ["90", "80"])
def test_a_decode_variant_asks_for_its_kernels_code_once_per_device(
    seq: SeqBuild, ptx: str
) -> None:
    # (step, attribute queries it adds: None past the kept devices, where every call asks):
    # DECODE ("a") and DECODE_F ("f") with n splits forced on devices 0, 1, 0, 63 and 64; one
    # split asks only at the launch (whether its kernel is a programmatic dependent)
    steps = [
        ("a", 4, 1), ("a", 4, 0), ("a", 1, 0), ("f", 4, 1),
        ("d", 1, 0), ("a", 4, 1), ("a", 1, 0), ("f", 1, 1), ("f", 4, 0),
        ("d", 0, 0), ("a", 4, 0), ("f", 1, 0),
        ("d", 63, 0), ("a", 1, 1), ("a", 4, 0),
        ("d", 64, 0), ("a", 4, None), ("a", 4, None), ("f", 1, None),
    ]  # fmt: skip
    src = seq.root / "decode_gate.cpp"
    src.write_text(
        fill(
            "decode_gate.cpp",
            STEPS="\n".join(f"  {{'{w}', {n}}}," for w, n, _ in steps),
            D=DECODE.d,
            D_F=DECODE_F.d,
            SYMBOL=decode_symbol(DECODE),
            SYMBOL_F=decode_symbol(DECODE_F),
        )
    )
    compile_all(
        [[tool("g++"), "-std=c++17", f"-I{seq.root}", *cuda_includes(), str(src), *seq.objects,
          "-o", "decode_gate"]],
        seq.root,
    )  # fmt: skip
    log = seq.root / f"gate_grids_{ptx}.txt"
    log.unlink(missing_ok=True)
    out = run_program(seq.root / "decode_gate", MOCK_GRID_ONLY=str(log), MOCK_PTX=ptx)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [ln.split("|") for ln in out.stdout.splitlines()]
    assert [r[0] for r in rows] == [f"{w}{n}" for w, n, _ in steps]
    assert all(r[1] == "0" for r in rows), rows  # every call launched
    asked = [int(r[2]) for r in rows]
    added = [b - a for a, b in zip([0, *asked], asked, strict=False)]
    for (w, n, want), got in zip(steps, added, strict=True):
        assert got == want if want is not None else got > 0, (w, n, added)
    # each launch as the answer says: the decode kernel a programmatic dependent on sm_90 code
    # (one split too), its merge kernel after it with splits; older code neither
    sm90 = ptx == "90"
    calls = [(w, n) for w, n, _ in steps if w != "d"]
    launches = iter(ln.split("|") for ln in log.read_text().splitlines())
    for w, n in calls:
        got = next(launches)
        assert got[0] == (DECODE_F if w == "f" else DECODE).name and got[1] == str(n), got
        assert got[11] == str(int(sm90)), got
        if n > 1 and sm90:
            assert next(launches)[0] == combine_name(DECODE_F if w == "f" else DECODE)
    assert next(launches, None) is None


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
