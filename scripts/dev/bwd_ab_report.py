"""Medians per (variant, T) of scripts/dev/bwd_ab.sh's rounds, each tree beside base.

    python3 scripts/dev/bwd_ab_report.py OUTDIR base LABEL ...
"""

from __future__ import annotations

import collections
import json
import statistics
import sys
from pathlib import Path


def main(out: str, trees: list[str]) -> None:
    """Print one row per (variant, T): each tree's median TFLOP/s and its ratio to base."""
    med: dict[str, dict[tuple[str, int], tuple[float, int]]] = {}
    for t in trees:
        vals: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
        # ab-<tree>-<round>.json: the round digits keep one tree's name from matching another's
        # prefix (dk-carry vs dk-carry-rs)
        for f in sorted(Path(out).glob(f"ab-{t}-[0-9]*.json")):
            for r in json.loads(f.read_text())["rows"]:
                if r.get("tflops"):
                    vals[(r["variant"], r["t"])].append(r["tflops"])
        med[t] = {k: (statistics.median(v), len(v)) for k, v in vals.items()}
    print(f"{'variant':52} {'T':>6} " + " ".join(f"{t:>22}" for t in trees))
    # every (variant, T) any tree timed: a patch's new variant has no base (its ratio is "-")
    for k in sorted(set().union(*(med[t] for t in trees))):
        b = med["base"][k][0] if k in med["base"] else None
        cells = [
            (f"{med[t][k][0]:7.1f} ({med[t][k][0] / b:5.3f}) n={med[t][k][1]}" if b else
             f"{med[t][k][0]:7.1f} (  -  ) n={med[t][k][1]}")
            if k in med[t]
            else "-"
            for t in trees
        ]  # fmt: skip
        print(f"{k[0]:52} {k[1]:6} " + " ".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
