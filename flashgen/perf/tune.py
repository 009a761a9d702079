"""Tuning: time the candidates of each (d, dtype, causal) on this GPU and write the winners.

`flashgen tune` runs it; the tables it writes are read by `flashgen.generator.select.lookup`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from flashgen.generator.families import FAMILIES
from flashgen.generator.policy import arch_major
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec
from flashgen.generator.tables import load_table

TUNE_SEQ_LENS = (4096, 16384)


def candidates(d: int, dtype: str, causal: bool, arch: str = "sm_80") -> list[KernelSpec]:
    """Every shipped tensor-core variant that serves (d, dtype, causal) and runs on `arch`
    (the families whose `preference` spans its compute capability: mma from sm_80, wgmma on
    Hopper only), plain: a table entry answers calls without features, and the shipped feature
    variants (window, softcap, alibi, gqapack) are the plain choice's companions, not rivals
    (timed without their feature, one could win on noise; gqapack reads another layout)."""
    major = arch_major(arch)
    families = [
        f.name for f in FAMILIES.values()
        if f.tensor_cores and f.preference.min_major <= major <= f.preference.max_major
    ]  # fmt: skip
    return [
        s
        for f in families
        for s in shipped(f)
        if s.d == d and s.dtype == dtype and s.causal == causal and not s.features
    ]


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
