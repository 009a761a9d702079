"""Merge the per-shard GPU suite summaries (gpu-suite-<i>.json) into OUTDIR/gpu-suite.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(outdir: str) -> int:
    """Write the merged summary and print one line per family."""
    parts = sorted(Path(outdir).glob("gpu-suite-*.json"))
    if not parts:
        print("no GPU suite summaries found")
        return 1
    merged: dict = {}
    variants: list = []
    for p in parts:
        data = json.loads(p.read_text())
        variants += data.pop("variants", [])
        merged.update({k: v for k, v in data.items() if k not in ("examples", "worst")})
    merged["variants"] = sorted(variants, key=lambda v: v["variant"])
    merged["shards"] = len(parts)
    Path(outdir, "gpu-suite.json").write_text(json.dumps(merged, indent=1) + "\n")
    fams = sorted({v["variant"].split("_")[2] for v in variants})
    for fam in fams:
        vs = [v for v in variants if v["variant"].split("_")[2] == fam]
        worst = max(vs, key=lambda v: v["worst_ratio"] if v["worst_ratio"] is not None else 1e9)
        print(
            f"property suite {fam}: {len(vs)} variants, {sum(v['passed'] for v in vs)} passed, "
            f"{sum(v['examples'] for v in vs)} examples, worst error/bound "
            f"{worst['worst_ratio']} ({worst['variant']})"
        )
    return 0 if all(v["passed"] for v in variants) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
