"""Which variant a hooked forward call runs, for every front door that takes hooks
(`flashgen.torch.attention`, `flashgen.attention`): the variant an unhooked call would run,
compiled with the hooks and the call's features, or the nearest one that takes them."""

from __future__ import annotations

from typing import Any

from flashgen.generator.select import select
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec, SpecError

HOOK_FAMILY = "mma"
"""The family whose kernels compile every hook in, forward and backward."""


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
            return plain.replace(features=tokens)
        except SpecError:
            pass  # the family's hook rules refuse this tile (the H200's tuned d64 br=192)
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
