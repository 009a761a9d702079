"""Where a decode call's time goes, block by block (GPU host; needs
bench/experiments/decode-timeline.patch applied: the kernel then records %globaltimer and clock64
at each point of its chain into a `fg_timeline` device array).

    python3 scripts/dev/decode_timeline.py OUT.json [B,TK,H,H_KV ...]

Per row (bf16, d 128, Tq 1, cache_seqlens given, as `flashgen bench --serving`): warm up, then
`CALLS` single calls, each with the array zeroed before and read back after
(cuModuleGetGlobal on the loaded decode module). Printed per row: the grid, the kernel's span
(first block's entry to the last block's last point, globaltimer ns), the spread of block starts,
and per stage the median and max over blocks of its length in SM cycles (clock64) -- stages:
  wait    entry -> past griddepcontrol.wait
  issue   -> the first K/V tiles issued (cache_seqlens read: the tile range depends on it)
  q       -> Q landed in shared memory (every thread)
  tile0   -> thread 0's first K/V tile landed
  tiles   -> thread 0's last tile computed
  wmerge  -> the warps' results merged, the split's scratch written (or O stored: one split)
  count   -> counted in (fence + atomic; every block)
  gmerge  -> the group merged (its last block only)
  count2, fmerge -> the same for the groups (the final merge, two-level only)
Also the mean time per call of 50 back-to-back calls (CUDA events) beside SDPA's.
Why: issue 26's small rows run 0.69-0.94x SDPA at a fixed ~10 us (bench/NOTES.md, session 30).
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from kernel_globals import libcuda, recorded_call  # scripts/dev, beside this file

from flashgen.kvcache import attention_with_kvcache

TL_BLOCKS, TL_POINTS = 4096, 12  # the patch's fg_timeline[TL_BLOCKS][TL_POINTS][2]
STAGES = [("wait", 0, 1), ("issue", 1, 2), ("q", 2, 3), ("tile0", 3, 4), ("tiles", 4, 5),
          ("wmerge", 5, 6), ("count", 6, 7), ("gmerge", 7, 8), ("count2", 8, 9),
          ("fmerge", 9, 10), ("store1", 5, 11)]  # fmt: skip
ROWS = [(1, 4096, 8, 1), (1, 32768, 8, 1), (1, 4096, 32, 8), (8, 4096, 32, 8), (32, 32768, 32, 8)]
CALLS = 5


def _per_call(raw: np.ndarray) -> dict[str, Any]:
    """One call's summary from fg_timeline (blocks that recorded their entry)."""
    blocks = [b for b in range(TL_BLOCKS) if raw[b, 0, 0] != 0]
    g, c = raw[:, :, 0].astype(np.int64), raw[:, :, 1].astype(np.int64)
    starts = [int(g[b, 0]) for b in blocks]
    ends = [int(max(g[b, p] for p in range(TL_POINTS) if raw[b, p, 0] != 0)) for b in blocks]
    out: dict[str, Any] = {
        "blocks": len(blocks),
        "span_ns": max(ends) - min(starts),
        "start_spread_ns": max(starts) - min(starts),
    }
    for name, a, b in STAGES:
        d = [int(c[x, b] - c[x, a]) for x in blocks if raw[x, a, 0] != 0 and raw[x, b, 0] != 0]
        if d:
            out[name] = {"n": len(d), "median_cyc": statistics.median(d), "max_cyc": max(d)}
    return out


def _event_us(call: Any, n: int = 50) -> float:
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    for _ in range(5):
        call()
    start.record()
    for _ in range(n):
        call()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) * 1000.0 / n


def main() -> None:
    out_path = sys.argv[1]
    rows = [tuple(int(x) for x in a.split(",")) for a in sys.argv[2:]] or ROWS
    lib = libcuda()
    results = []
    for b, tk, h, h_kv in rows:
        d, dt = 128, torch.bfloat16
        q = torch.randn(b, 1, h, d, device="cuda", dtype=dt)
        k = torch.randn(b, tk, h_kv, d, device="cuda", dtype=dt)
        v = torch.randn_like(k)
        lens = torch.full((b,), tk, device="cuda", dtype=torch.int32)

        def call() -> object:
            return attention_with_kvcache(q, k, v, lens)  # noqa: B023

        qs, ks, vs = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

        def sdpa() -> object:
            return F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)  # noqa: B023

        for _ in range(3):
            call()
        torch.cuda.synchronize()
        host = np.zeros((TL_BLOCKS, TL_POINTS, 2), dtype=np.uint64)
        calls, name = [], ""
        for _ in range(CALLS):
            name = recorded_call(lib, call, host, "flash_decode", b"fg_timeline")
            calls.append(_per_call(host))
        row: dict[str, Any] = {
            "row": [b, tk, h, h_kv], "kernel": name, "calls": calls,
            "event_us": _event_us(call), "sdpa_event_us": _event_us(sdpa),
        }  # fmt: skip
        results.append(row)
        span = statistics.median(cl["span_ns"] for cl in calls) / 1000
        spread = statistics.median(cl["start_spread_ns"] for cl in calls) / 1000
        print(f"== B{b} Tk{tk} {h}/{h_kv}: {name}, {calls[0]['blocks']} blocks; kernel span "
              f"{span:.2f} us, starts spread {spread:.2f} us; 50 calls: "
              f"{row['event_us']:.2f} us a call (SDPA {row['sdpa_event_us']:.2f})")  # fmt: skip
        for stage, _, _ in STAGES:
            got = [cl[stage] for cl in calls if stage in cl]
            if got:
                print(f"   {stage:7s} n={got[0]['n']:4d}  median "
                      f"{statistics.median(x['median_cyc'] for x in got):8.0f} cyc  max "
                      f"{statistics.median(x['max_cyc'] for x in got):8.0f} cyc")  # fmt: skip
        with open(out_path, "w") as f:  # after every row: a timed-out run keeps its rows
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
