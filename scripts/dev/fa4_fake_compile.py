"""Compile FA4's sm90 forward or backward on a machine with no GPU, for its PTX, cubin and SASS.

    bash scripts/dev/fa4_cpu.sh install                       # once: FA4's stack for this Python
    bash scripts/dev/fa4_cpu.sh fwd 128 16384 0 OUTDIR        # d, T, causal (0/1), where to dump
    bash scripts/dev/fa4_cpu.sh bwd 128 16384 1 OUTDIR

(the shell script sets PYTHONPATH, CUTE_DSL_ARCH=sm_90a and CUTE_DSL_KEEP, then runs this file).
FA4's interface runs under torch's FakeTensorMode: its kernels are built and compiled by CuTe
DSL (MLIR, then its own ptxas), and nothing is launched. Shapes as `flashgen bench`'s rows:
B * T = 16k tokens, H * d = 2048, bf16. The device queries FA4 makes (SM count, compute
capability) are answered for an H200 (132 SMs, sm_90). What it gives: FA4's exact kernel for a
row, on the CPU machine, to read beside ours (scripts/dev/sass_loops.py); bench/NOTES.md,
twenty-fourth session.
"""

from __future__ import annotations

import sys

import torch
from torch._subclasses.fake_tensor import FakeTensorMode


def main() -> None:
    from flash_attn.cute import interface as fa4  # noqa: PLC0415 (FA4 is on PYTHONPATH only here)

    direction, d, t, causal = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
    fa4.get_num_sms_for_selection = lambda *a, **k: 132  # an H200
    fa4._get_device_arch = lambda: 90
    b, h = max(1, 16384 // t), max(1, 2048 // d)
    with FakeTensorMode(allow_non_fake_inputs=True):
        q = torch.empty(b, t, h, d, device="cuda", dtype=torch.bfloat16)
        k, v = torch.empty_like(q), torch.empty_like(q)
        if direction == "fwd":
            fa4._flash_attn_fwd(q, k, v, causal=causal, _arch=90)
        else:
            o, do = torch.empty_like(q), torch.empty_like(q)
            lse = torch.empty(b, h, t, device="cuda", dtype=torch.float32)
            fa4._flash_attn_bwd(q, k, v, o, do, lse, causal=causal)
    print(f"compiled FA4 {direction} d{d} T{t} {'causal' if causal else 'noncausal'} (B{b} H{h})")


if __name__ == "__main__":
    main()
