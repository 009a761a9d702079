"""Where a wgmma forward block's time goes, item by item (GPU host; needs
bench/experiments/wgmma-fwd-timeline.patch applied: consumer 0's first thread then records
%globaltimer and clock64 at each point of every item into a `fg_ftl` device array).

    python3 scripts/dev/fwd_timeline.py OUT.json

Rows (bf16, as `flashgen bench`): d 128 B 1 H 16 T 16384 causal, the same with the window 4096
back (issue 28's window row), d 128 non-causal, and d 64 B 4 H 32 T 4096 causal (a persistent
grid). Per row, `CALLS` single calls, each with the array zeroed before and read back after. Per
item (a query tile of a head), in consumer 0's SM cycles:
  load    item start -> its first K landed (Q and K's first tile; 0 when loaded under the
          previous item)
  first   -> the first tile's S and softmax done (nothing to overlap with)
  steady  -> the steady steps done; `per_step` = steady / (tiles - 1)
  drain   -> the last O += P V done
  epi     -> the epilogue done (O stored)
and `fixed` = load + first + drain + epi in units of one steady step: what an item pays beyond
its steps. Rows marked persistent force the persistent grid (PERSISTENT_MAX_KEY_TILES raised
for the row: the scheduler reads it at each call). Also the kernel span, the consumers' busy
share (item time over span x SMs used) and the gaps between consecutive items on one SM (block
start and end, in ns).
Why: the causal window runs 0.885-0.908x the plain causal kernel (issue 28's bar: 0.95), with
33 steps an item against 64.5: the fixed cost per item is the suspect (bench/NOTES.md).
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

import numpy as np
import torch
from kernel_globals import libcuda, recorded_call  # scripts/dev, beside this file

from flashgen import torch as fg
from flashgen.generator import schedulers

FTL_ITEMS = 16384  # the patch's fg_ftl[FTL_ITEMS][8][2]
ROWS: list[dict[str, Any]] = [
    {"name": "d128 causal T16k", "b": 1, "h": 16, "t": 16384, "d": 128, "causal": True},
    {"name": "d128 window4096 T16k", "b": 1, "h": 16, "t": 16384, "d": 128, "causal": True,
     "window": (4096, 0)},
    {"name": "d128 noncausal T16k", "b": 1, "h": 16, "t": 16384, "d": 128, "causal": False},
    {"name": "d64 causal T4k", "b": 4, "h": 32, "t": 4096, "d": 64, "causal": True},
    # the window and plain causal rows again on the persistent grid (forced): where its 7-10%
    # loss on the window (bench/NOTES.md, "Window cost (issue 12)") goes, stage by stage. B 2 x
    # H 8 (the same 2048 items): a launch plan is cached per shape, so the rows above' shapes
    # would keep their block-per-tile grid (session 31's first try did exactly that)
    {"name": "d128 window4096 T16k persistent", "b": 2, "h": 8, "t": 16384, "d": 128,
     "causal": True, "window": (4096, 0), "persistent": True},
    {"name": "d128 causal T16k persistent", "b": 2, "h": 8, "t": 16384, "d": 128,
     "causal": True, "persistent": True},
]  # fmt: skip
CALLS = 3


def _med(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def _per_call(raw: np.ndarray) -> dict[str, Any]:
    """One call's summary (items whose consumer 0 recorded start and end)."""
    g, c = raw[:, :, 0].astype(np.int64), raw[:, :, 1].astype(np.int64)
    items = [i for i in range(FTL_ITEMS) if raw[i, 0, 0] and raw[i, 5, 0] and raw[i, 4, 0]]
    if not items:
        return {"items": 0}
    stage: dict[str, list[float]] = {k: [] for k in
                                     ("load", "first", "steady", "drain", "epi", "per_step",
                                      "fixed_steps", "item", "tiles")}  # fmt: skip
    by_sm: dict[int, list[tuple[int, int]]] = {}
    for i in items:
        tiles = int(raw[i, 6, 0])
        load, first = c[i, 1] - c[i, 0], c[i, 2] - c[i, 1]
        steady, drain, epi = c[i, 3] - c[i, 2], c[i, 4] - c[i, 3], c[i, 5] - c[i, 4]
        for k, v in (("load", load), ("first", first), ("steady", steady), ("drain", drain),
                     ("epi", epi), ("item", c[i, 5] - c[i, 0]), ("tiles", tiles)):  # fmt: skip
            stage[k].append(float(v))
        if tiles > 1:
            per = steady / (tiles - 1)
            stage["per_step"].append(float(per))
            stage["fixed_steps"].append(float(load + first + drain + epi) / per)
        by_sm.setdefault(int(raw[i, 7, 1]), []).append((int(g[i, 0]), int(g[i, 5])))
    gaps = []
    for spans in by_sm.values():
        spans.sort()
        gaps += [b0 - a1 for (_, a1), (b0, _) in zip(spans, spans[1:], strict=False)]
    t0 = min(int(g[i, 0]) for i in items)
    t1 = max(int(g[i, 5]) for i in items)
    busy = sum(int(g[i, 5] - g[i, 0]) for i in items) / max(1, (t1 - t0) * len(by_sm))
    out: dict[str, Any] = {"items": len(items), "sms": len(by_sm), "span_ns": t1 - t0,
                           "busy": busy, "gap_ns_median": _med([float(x) for x in gaps]),
                           "gap_ns_max": max(gaps) if gaps else 0}  # fmt: skip
    for k, v in stage.items():
        out[k] = {"median": _med(v), "max": max(v) if v else float("nan")}
    return out


def main() -> None:
    out_path = sys.argv[1]
    lib = libcuda()
    host = np.zeros((FTL_ITEMS, 8, 2), dtype=np.uint64)
    results = []
    shipped_max = schedulers.PERSISTENT_MAX_KEY_TILES
    for row in ROWS:
        schedulers.PERSISTENT_MAX_KEY_TILES = 1 << 30 if row.get("persistent") else shipped_max
        b, h, t, d = row["b"], row["h"], row["t"], row["d"]
        x = [torch.randn(b, t, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
             for _ in range(3)]  # fmt: skip
        kw: dict[str, Any] = {"causal": row["causal"]}
        if "window" in row:
            kw["window"] = row["window"]

        def call() -> object:
            return fg.attention(x[0], x[1], x[2], **kw)  # noqa: B023

        for _ in range(3):
            call()
        calls, name = [], ""
        for _ in range(CALLS):
            name = recorded_call(lib, call, host, "flash_fwd_wgmma", b"fg_ftl")
            calls.append(_per_call(host))
        results.append({"row": row["name"], "kernel": name, "calls": calls})
        mid = calls[len(calls) // 2]
        print(f"== {row['name']}: {name}, {mid['items']} items on {mid['sms']} SMs; span "
              f"{_med([cl['span_ns'] for cl in calls]) / 1000:.1f} us, busy "
              f"{_med([cl['busy'] for cl in calls]):.3f}, gap between items on an SM median "
              f"{_med([cl['gap_ns_median'] for cl in calls]):.0f} ns max "
              f"{_med([float(cl['gap_ns_max']) for cl in calls]):.0f} ns")  # fmt: skip
        for k in ("tiles", "load", "first", "steady", "per_step", "drain", "epi", "item",
                  "fixed_steps"):  # fmt: skip
            print(f"   {k:12s} median {_med([cl[k]['median'] for cl in calls]):10.1f}  max "
                  f"{_med([cl[k]['max'] for cl in calls]):10.1f}")  # fmt: skip
        with open(out_path, "w") as f:  # after every row: a timed-out run keeps its rows
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
