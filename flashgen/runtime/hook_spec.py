"""Which variant a hooked forward call runs, for every front door that takes hooks
(`flashgen.torch.attention`, `flashgen.attention`): the variant an unhooked call would run,
compiled with the hooks and the call's features, or the nearest one that takes them."""

from __future__ import annotations

from typing import Any

from flashgen.generator.features.hook import hooks_of, summary_slots
from flashgen.generator.select import select
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec, SpecError
from flashgen.runtime import gpu

HOOK_FAMILY = "mma"
"""The family whose kernels compile every hook in, forward and backward."""


def _reads_tables_at_ranges(tokens: tuple[str, ...]) -> bool:
    """Whether a hook among `tokens` reads an aux table at ranges of indices (its tile
    verdicts take range summaries: `features.hook.summary_slots`)."""
    return bool(summary_slots(hooks_of(tokens)))


def forward_spec(
    problem: Any, causal: bool, arch: str, gpu_name: str | None, tokens: tuple[str, ...]
) -> KernelSpec:
    """The variant an unhooked call of `problem` (runtime.validate.Problem: d, dtype, value_dim,
    alignment) would run on a GPU of `arch` named `gpu_name` (`select`: family wgmma's tile on
    Hopper), compiled with `tokens` (the hooks' and features' tokens); where that tile refuses
    them (wgmma's br=192 tiles: `WgmmaFamily.hook_rule`), the family's best other shipped tile;
    where the family refuses them, family mma's shipped tile, which takes every hook. Why the
    first: on the H200 wgmma's hooked forward runs 0.94-1.00x its built-in twins where mma's
    ran 0.2-0.4x of them (bench/NOTES.md, session 18)."""
    align = problem.alignment(pointers=True)
    plain = select(
        problem.d, problem.dtype, causal, arch, alignment=align, gpu_name=gpu_name,
        dv=problem.value_dim,
    )  # fmt: skip
    if plain.family != HOOK_FAMILY:
        try:
            hooked = plain.replace(features=tokens)
            # a tile at its register limit (wgmma br=192 takes mask_mods) may spill with the
            # hook: ptxas' report decides, and the family's other tiles take a spilling one.
            # A mask reading a table at ranges (document ids) stays on the smaller tile: 192
            # rows straddle more document edges, and on the H200 br=192 ran 0.71-0.93x br=128
            # on 256-token documents and at T 4096 (1.11x only on 16 documents in 16k tokens)
            # where table-free masks gained 8-16% (bench/NOTES.md, twentieth session)
            if plain.br < 192 or (
                not _reads_tables_at_ranges(tokens) and not gpu.spill_bytes(hooked, arch)
            ):
                return hooked
        except SpecError:
            pass  # the family's hook rules refuse this tile (wgmma br=192 and a score_mod)
        others = [s for s in shipped(plain.family) if s.br != plain.br]
        try:  # the family's other shipped tiles, as select ranks them
            return select(
                problem.d, problem.dtype, causal, arch, alignment=align, candidates=others,
                dv=problem.value_dim,
            ).replace(features=tokens)  # fmt: skip
        except ValueError:  # SpecError too: no other tile of the family takes the call
            pass
    fallback = select(
        problem.d, problem.dtype, causal, arch, alignment=align,
        candidates=shipped(HOOK_FAMILY), dv=problem.value_dim,
    )  # fmt: skip
    return fallback.replace(features=tokens)
