"""Tuning tables: the fastest shipped variant per (d, dtype, causal) on one GPU model, read.

`flashgen tune` (flashgen.perf.tune) writes `flashgen/tuning/<gpu>.json`; `select.lookup`
reads the table of the GPU it runs on (matched by name) before the default preference.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from flashgen.generator.arch import arch_number
from flashgen.generator.spec import KernelSpec

TABLE_PACKAGE_DIR = "tuning"


def gpu_slug(gpu_name: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200' (the table's file stem)."""
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")


def entry_key(d: int, dtype: str, causal: bool) -> str:
    """The table key of a call shape, e.g. 'd64_bf16_causal'."""
    return f"d{d}_{dtype}_{'causal' if causal else 'noncausal'}"


def table_dir() -> Path:
    """The package folder holding the shipped tables."""
    return Path(str(resources.files("flashgen") / TABLE_PACKAGE_DIR))


def _read(path: Path) -> tuple[str, dict[str, Any]]:
    """(arch, entries) of one table file; ("", {}) for a file that is missing or not a table."""
    try:
        data = json.loads(path.read_text())
        arch, entries = str(data.get("arch", "")), data.get("entries", {})
    except (OSError, ValueError, AttributeError):
        return "", {}
    return arch, entries if isinstance(entries, dict) else {}


@cache
def load_table(gpu_name: str) -> dict[str, Any]:
    """The entries of the table for `gpu_name` ({} when flashgen ships none)."""
    return _read(table_dir() / f"{gpu_slug(gpu_name)}.json")[1]


@cache
def arch_table(major: int) -> tuple[str, dict[str, Any]]:
    """(file stem, entries) of the packaged table measured on a GPU of compute capability
    `major` (its "arch" field; the first such file by name), or ("", {}) when there is none.
    `select` reads it for a GPU of that architecture that flashgen ships no table for: what a
    table decides (the tile per head dim) follows the SM -- its shared memory, registers and
    tensor-core instructions -- more than the memory system, so a same-arch table is a better
    prior than the families' tile preferences."""
    for path in sorted(table_dir().glob("*.json")):
        arch, entries = _read(path)
        try:
            same = arch_number(arch) // 10 == major
        except ValueError:  # no or a malformed "arch" field
            same = False
        if same and entries:
            return path.stem, entries
    return "", {}


def table_variants() -> list[KernelSpec]:
    """Every variant named by a packaged tuning table (any GPU), valid specs only."""
    out: list[KernelSpec] = []
    for path in sorted(table_dir().glob("*.json")):
        for entry in _read(path)[1].values():
            try:
                out.append(KernelSpec.from_name(str(entry["variant"])))
            except (KeyError, TypeError, ValueError):
                continue
    return out
