"""Tuning tables: the fastest shipped variant per (d, dtype, causal) on one GPU model.

`flashgen tune` times the candidates on the current GPU and writes
`flashgen/tuning/<gpu>.json`; `select` reads the table of the GPU it runs on (matched by
name) before falling back to its default preference.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from .space import shipped
from .spec import KernelSpec

TUNE_SEQ_LENS = (4096, 16384)
TABLE_PACKAGE_DIR = "tuning"


def gpu_slug(gpu_name: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200' (the table's file stem)."""
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")


def entry_key(d: int, dtype: str, causal: bool) -> str:
    """The table key of a call shape, e.g. 'd64_bf16_causal'."""
    return f"d{d}_{dtype}_{'causal' if causal else 'noncausal'}"


def candidates(d: int, dtype: str, causal: bool, arch: str = "sm_80") -> list[KernelSpec]:
    """Every shipped tensor-core variant that serves (d, dtype, causal) and runs on `arch`:
    `mma` everywhere from sm_80, `wgmma` on Hopper (sm_90) only."""
    from .select import arch_major

    families = ("mma", "wgmma") if arch_major(arch) == 9 else ("mma",)
    return [
        s
        for f in families
        for s in shipped(f)
        if s.d == d and s.dtype == dtype and s.causal == causal
    ]


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


def lookup(gpu_name: str, d: int, dtype: str, causal: bool) -> KernelSpec | None:
    """The tuned variant for this GPU and call shape, if the table has a valid one."""
    entry = load_table(gpu_name).get(entry_key(d, dtype, causal))
    if not isinstance(entry, dict) or "variant" not in entry:
        return None
    try:
        spec = KernelSpec.from_name(str(entry["variant"]))
    except ValueError:
        return None
    return spec if spec in shipped(spec.family) else None


@dataclass(frozen=True)
class TuneOutcome:
    """The winner of one (d, dtype, causal) and every candidate's TFLOP/s per T."""

    key: str
    winner: str
    geomean_tflops: float
    table: dict[str, dict[int, float]]  # variant -> T -> TFLOP/s


def pick_winner(key: str, timings: dict[str, dict[int, float]]) -> TuneOutcome:
    """The variant with the best geometric mean TFLOP/s over every T it ran (all must run)."""
    full = {v: t for v, t in timings.items() if t and all(x > 0 for x in t.values())}
    n = max((len(t) for t in full.values()), default=0)
    scored = {
        v: math.exp(sum(math.log(x) for x in t.values()) / len(t))
        for v, t in full.items()
        if len(t) == n
    }
    if not scored:
        raise ValueError(f"{key}: no candidate produced a timing; nothing to tune")
    winner = max(scored, key=lambda v: scored[v])
    return TuneOutcome(key, winner, scored[winner], timings)


def write_table(gpu_name: str, arch: str, outcomes: list[TuneOutcome], path: Path) -> None:
    """Merge `outcomes` into the JSON table at `path` (other keys are kept)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data.update({"gpu": gpu_name, "arch": arch})
    entries = data.setdefault("entries", {})
    for o in outcomes:
        entries[o.key] = {
            "variant": o.winner,
            "geomean_tflops": round(o.geomean_tflops, 1),
            "candidates": {
                v: {str(t): round(x, 1) for t, x in sorted(ts.items())}
                for v, ts in sorted(o.table.items())
            },
        }
    data["entries"] = dict(sorted(entries.items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    load_table.cache_clear()
