"""Leading by-value kernel arguments per family, registered by the module that builds them.

The `wgmma` kernels take TMA tensor maps ahead of the C ABI every family shares (forward: three;
backward: four). launch.py (forward) and backward.py keep one registry each: a family's builder
comes from its provider module (imported on the family's first launch) with the pointers it
depends on, so a call rebuilds the arguments only when one of those pointers moved.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Generic, TypeVar

BuilderT = TypeVar("BuilderT")


class PrefixRegistry(Generic[BuilderT]):
    """Leading by-value kernel arguments per family (the wgmma family's TMA tensor maps): a
    builder registered by the module that makes them, imported on the family's first use, and
    the pointers (of `pointers`) whose change makes it build again."""

    def __init__(self, pointers: tuple[str, ...], providers: dict[str, str], owner: str) -> None:
        self.pointers, self.providers, self.owner = pointers, providers, owner
        self.builders: dict[str, tuple[BuilderT, tuple[int, ...]]] = {}

    def register(self, family: str, builder: BuilderT, uses: Sequence[str]) -> None:
        """Make `builder` supply `family`'s leading arguments; `uses` names the pointers they
        depend on (the builder runs again only when one of those changes)."""
        bad = [u for u in uses if u not in self.pointers]
        if bad or not uses:
            raise ValueError(f"uses={tuple(uses)!r}: name some of {', '.join(self.pointers)}")
        self.builders[family] = (builder, tuple(self.pointers.index(u) for u in uses))

    def get(self, family: str) -> tuple[BuilderT, tuple[int, ...]] | None:
        """(builder, indices of the pointers it uses), importing its provider first; None for a
        family whose kernels take no leading arguments."""
        if family not in self.builders and family in self.providers:
            importlib.import_module(self.providers[family])
            if family not in self.builders:
                raise RuntimeError(
                    f"family {family}: its {self.owner} take leading arguments, but "
                    f"{self.providers[family]} registered no builder; call "
                    "register_prefix_args there"
                )
        return self.builders.get(family)
