"""Issue 28's lead F1: FA4's tensor maps beside flashgen's, field by field, for one forward.

    bash scripts/dev/tma_log/run.sh [D] [T] [CAUSAL]     # GPU host, FA4 staged (.fa4)

run.sh builds tma_log.so (tma_log.c: logs every cuTensorMapEncodeTiled of the process) and
runs this file under LD_PRELOAD: one FA4 forward (flash_attn.cute) and one flashgen.torch
forward on the same (B 1, H 16, T, d, bf16) inputs, each call's encodes cut out of the log
and printed (dtype, dims, byte strides, box, element strides, interleave, swizzle, L2
promotion, OOB fill). Reading: compare box and swizzle (the smem layout the loads fill),
l2promo (0 none, 1 64B, 2 128B, 3 256B) and the dims/strides (how each kernel views Q, K, V
and O).
"""

from __future__ import annotations

import os
import sys

import torch


def _cut(log: str, start: int) -> list[str]:
    with open(log) as f:
        f.seek(start)
        return [line.rstrip() for line in f if line.startswith("encode")]


def main() -> None:
    d = int(sys.argv[1]) if len(sys.argv) > 1 else 128
    t = int(sys.argv[2]) if len(sys.argv) > 2 else 16384
    causal = (sys.argv[3] if len(sys.argv) > 3 else "1") == "1"
    log = os.environ["TMA_LOG"]
    open(log, "a").close()
    q, k, v = (torch.randn(1, t, 16, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    runs = []
    try:
        from flash_attn.cute.interface import flash_attn_func

        runs.append(("fa4", lambda: flash_attn_func(q, k, v, causal=causal)))
    except Exception as exc:  # noqa: BLE001
        print(f"fa4 not run: {exc}")
    import flashgen.torch as fgt

    runs.append(("flashgen", lambda: fgt.attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)))  # fmt: skip
    for name, fn in runs:
        fn()  # compile/JIT and first encodes
        torch.cuda.synchronize()
        start = os.path.getsize(log)
        fn()  # a steady call: the encodes it does (or none: cached maps)
        torch.cuda.synchronize()
        steady = _cut(log, start)
        print(f"== {name} (d {d}, T {t}, causal {causal}): {len(steady)} encodes in a steady call")
        for line in steady:
            print("  " + line)
    print("== every encode of the process, in order:")
    for line in _cut(log, 0):
        print("  " + line)


if __name__ == "__main__":
    main()
