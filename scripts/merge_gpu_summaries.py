"""Merge the per-shard GPU suite summaries (gpu-suite-<i>.json) into OUTDIR/gpu-suite.json."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def main(outdir: str) -> int:
    """Write the merged summary, print one line per family; 1 when a variant failed."""
    parts = sorted(Path(outdir).glob("gpu-suite-[0-9]*.json"))
    if not parts:
        print("no GPU suite summaries found")
        return 1
    merged: dict[str, Any] = {}
    variants: list[dict[str, Any]] = []
    for p in parts:
        data = json.loads(p.read_text())
        variants += data.pop("per_variant", [])
        merged.update(data)
    merged["commit"] = os.environ.get("FLASHGEN_COMMIT", merged.get("commit"))
    merged["shards"] = len(parts)
    merged["variants"] = len(variants)
    merged["passed"] = sum(v["passed"] for v in variants)
    merged["failed"] = len(variants) - merged["passed"]
    merged["examples"] = sum(v["examples"] for v in variants)
    ratios = [v["worst_ratio"] for v in variants if v["worst_ratio"] is not None]
    merged["worst_ratio"] = max(ratios) if ratios else None
    merged["per_variant"] = sorted(variants, key=lambda v: v["variant"])
    Path(outdir, "gpu-suite.json").write_text(json.dumps(merged, indent=1) + "\n")
    for fam in sorted({v["variant"].split("_")[2] for v in variants}):
        vs = [v for v in variants if v["variant"].split("_")[2] == fam]
        worst = max(vs, key=lambda v: v["worst_ratio"] if v["worst_ratio"] is not None else 1e9)
        print(
            f"property suite {fam}: {len(vs)} variants, {sum(v['passed'] for v in vs)} passed, "
            f"{sum(v['examples'] for v in vs)} examples, worst error/bound "
            f"{worst['worst_ratio']} ({worst['variant']})"
        )
    return 0 if merged["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
