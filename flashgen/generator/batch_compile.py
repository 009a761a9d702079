"""Check that many variants compile, one nvcc run per batch of them (the compile-everything check).

Every nvcc run pays ~0.4 s before it reaches a kernel: the preprocessor and cicc parse the CUDA
headers (~40k lines) and start up. For the compile-everything check (1,500+ compiles, CI's
longest step) that fixed cost is a third to a half of the time. So the check puts a batch of
variants into one translation unit, each variant's source inside a namespace of its own (their
kernels are `extern "C"`, so each keeps its symbol; their constants and helpers stay apart), and
reads every kernel's registers and spills from the one ptxas report: ptxas allocates registers
per kernel, so the report of a kernel does not depend on its neighbours
(tests/generator/test_compile.py compares batched and single reports).

Only for checking: the batch's cubin is not cached, and launches still compile one variant at a
time (compile.compile_kernel). A batch that nvcc rejects is compiled again variant by variant,
so an error is pinned on the variant that has it, and a failure caused only by the batching
(two variants' text that cannot share a file) does not count against either.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from flashgen.generator.arch import check_target
from flashgen.generator.compile import (
    CompileError,
    compile_kernel,
    cubin_flags,
    run_nvcc,
    stop_nvcc_on_signals,
)
from flashgen.generator.render import render
from flashgen.generator.report import ResourceReport, parse_ptxas
from flashgen.generator.spec import KernelSpec

BATCH = 8  # variants per nvcc run: ~2-3x fewer seconds than one at a time (simt, mma, wgmma)

Outcome = ResourceReport | Exception


def batch_source(sources: Sequence[str]) -> str:
    """One translation unit of several kernels' sources: their `#include` lines once, at the
    top, and each source's other lines inside `namespace fg_batch_<i>`."""
    includes: list[str] = []
    bodies: list[str] = []
    for i, src in enumerate(sources):
        kept = []
        for line in src.splitlines():
            if line.startswith("#include"):
                if line not in includes:
                    includes.append(line)
            else:
                kept.append(line)
        bodies.append(f"namespace fg_batch_{i} {{\n" + "\n".join(kept) + f"\n}}  // fg_batch_{i}\n")
    return "\n".join(includes) + "\n\n" + "\n".join(bodies)


def _one_by_one(specs: Sequence[KernelSpec], arch: str) -> dict[KernelSpec, Outcome]:
    out: dict[KernelSpec, Outcome] = {}
    for spec in specs:
        try:
            out[spec] = compile_kernel(spec, arch).report
        except Exception as exc:  # collected per variant, like every other outcome
            out[spec] = exc
    return out


def compile_batch(specs: Sequence[KernelSpec], arch: str) -> dict[KernelSpec, Outcome]:
    """Compile `specs` for `arch` in one nvcc run; each variant's ptxas report, or its error.

    Every spec must be able to target `arch` (arch.check_target's rules); a spec that cannot
    gets its ArchError as its outcome and the rest still compile."""
    outcomes: dict[KernelSpec, Outcome] = {}
    ok: list[KernelSpec] = []
    gencode = None
    for spec in specs:
        try:
            info = check_target(spec.name, spec.family, spec.archs, spec.smem_bytes, arch)
        except Exception as exc:
            outcomes[spec] = exc
            continue
        if gencode not in (None, info.gencode):  # one run compiles for one target
            raise ValueError(f"batch mixes targets {gencode} and {info.gencode} for {arch}")
        gencode = info.gencode
        ok.append(spec)
    if not ok:
        return outcomes
    flags = cubin_flags(str(gencode))
    source = batch_source([render(s).source for s in ok])
    try:
        cubin, log = run_nvcc(flags, source, what=f"a batch of {len(ok)} variants for {arch}")
    except CompileError:
        outcomes.update(_one_by_one(ok, arch))
        return outcomes
    for spec in ok:
        try:
            if spec.name.encode() not in cubin:
                raise CompileError(f"the batch cubin has no symbol {spec.name}")
            outcomes[spec] = parse_ptxas(log, spec.name, arch)
        except Exception as exc:
            outcomes[spec] = exc
    return outcomes


def check_compiles(
    jobs: Iterable[tuple[KernelSpec, str]], *, batch: int = BATCH, workers: int = 2
) -> dict[tuple[KernelSpec, str], Outcome]:
    """Compile every (variant, arch) of `jobs`, `batch` variants per nvcc run, `workers` runs at
    a time (nvcc is a subprocess: threads keep every core busy); the report or error of each."""
    groups: dict[tuple[str, str], list[KernelSpec]] = {}  # (arch, family): one nvcc target
    for spec, arch in jobs:
        groups.setdefault((arch, spec.family), []).append(spec)
    chunks = [
        (arch, specs[i : i + batch])
        for (arch, _), specs in groups.items()
        for i in range(0, len(specs), max(1, batch))
    ]
    results: dict[tuple[KernelSpec, str], Outcome] = {}
    # the workers' nvcc runs are stopped by a signal only through the main thread's handlers
    with stop_nvcc_on_signals(), ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for (arch, _), got in zip(
            chunks, pool.map(lambda c: compile_batch(c[1], c[0]), chunks), strict=True
        ):
            for spec, outcome in got.items():
                results[(spec, arch)] = outcome
    return results
