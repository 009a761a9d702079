"""The serving PNG (flashgen.perf.serving_plot) of a JSON written before: scripts/decode_bench.py's
({"gpu", "rows"}), scripts/varlen_bench.py's ({"rows"}) or `flashgen bench`'s ({"env",
"serving"}); several files draw as one (their rows together).

    python3 scripts/serving_plot.py OUT.png IN.json [IN.json ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from flashgen.perf import serving_plot


def rows_of(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The serving rows a results JSON holds (see the module docstring)."""
    return list(data.get("serving") or data.get("rows") or [])


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out, files = Path(argv[0]), [Path(a) for a in argv[1:]]
    rows: list[dict[str, Any]] = []
    gpus = []
    for f in files:
        data = json.loads(f.read_text())
        rows += rows_of(data)
        gpus.append(str(data.get("gpu") or data.get("env", {}).get("gpu") or ""))
    title = ", ".join(dict.fromkeys(g for g in gpus if g))
    if not serving_plot.plot(rows, out, title):
        print(f"no timed serving rows in {', '.join(map(str, files))}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
