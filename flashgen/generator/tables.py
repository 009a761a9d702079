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


@cache
def load_table(gpu_name: str) -> dict[str, Any]:
    """The entries of the table for `gpu_name` ({} when flashgen ships none)."""
    path = table_dir() / f"{gpu_slug(gpu_name)}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    entries = data.get("entries", {})
    return entries if isinstance(entries, dict) else {}


def table_variants() -> list[KernelSpec]:
    """Every variant named by a packaged tuning table (any GPU), valid specs only."""
    out: list[KernelSpec] = []
    for path in sorted(table_dir().glob("*.json")):
        try:
            entries = json.loads(path.read_text()).get("entries", {})
        except (OSError, ValueError, AttributeError):
            continue
        for entry in entries.values() if isinstance(entries, dict) else ():
            try:
                out.append(KernelSpec.from_name(str(entry["variant"])))
            except (KeyError, TypeError, ValueError):
                continue
    return out
