"""Kernel families: each owns its validation rules, its knobs and its derived sizes.

The registry: one line per family (its folder holds the rest). Nothing else names a family.
"""

from __future__ import annotations

from flashgen.generator.families.base import Family, Preference
from flashgen.generator.families.mma import MMA, MmaFamily
from flashgen.generator.families.simt import SIMT, SimtFamily
from flashgen.generator.families.wgmma import WGMMA, WGMMA_REGS, WgmmaFamily

FAMILIES: dict[str, Family] = {f.name: f for f in (SIMT, MMA, WGMMA)}
"""Every family by name, in preference-neutral order (simt, mma, wgmma)."""


def family_of(name: str) -> Family:
    """Return the family called `name`; KeyError carries a message naming the choices."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(
            f"family={name!r}: unknown family; choose one of {', '.join(FAMILIES)}"
        ) from None


__all__ = [
    "FAMILIES", "WGMMA_REGS", "Family", "MmaFamily", "Preference", "SimtFamily", "WgmmaFamily",
    "family_of",
]
