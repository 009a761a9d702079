"""Time explicit backward variants through flashgen.torch (a dev tool for picking tiles).

    python3 scripts/bwd_sweep.py OUT.json NAME [NAME ...] [--t 4096,16384] [--peers]

Each NAME is a backward variant (`flash_bwd_mma_...`); it runs on the bench's problem for its
d, dtype and causal flag (B*T = 16384, H*d = 2048) at every --t, with the protocol of
scripts/bwd_bench.py (forward once, `torch.autograd.grad` timed, FLOPs = 2.5 x forward).
`--peers` adds SDPA's FA2 backward for the same rows. The torch op normally picks the family
default backward; here its plan lookup is pointed at NAME for the duration of the rows.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashgen.torch as fgt
from flashgen.generator import launch, runtime
from flashgen.generator.bench import time_ms
from flashgen.generator.compile import compile_kernel
from flashgen.generator.spec import KernelSpec

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def use_variant(spec: KernelSpec) -> None:
    """Make flashgen.torch's backward run `spec`, of either family (its caches are cleared)."""

    def plan(
        dev: int, d: int, dtype: str, causal: bool, deterministic: bool = False,
        family: str = "mma",
    ) -> Any:  # fmt: skip
        with runtime.for_device_arch(fgt._device_arch(dev)):
            karch = runtime.kernel_arch(spec)
        hit = launch.plan(spec, lambda: compile_kernel(spec, karch).cubin, karch, dev)
        return hit.spec, hit

    fgt._bwd_plan = plan  # type: ignore[assignment]
    fgt._bwd_entries.clear()


def tflops(impl: str, spec: KernelSpec, t: int) -> float:
    b, h, d = 16384 // t, 2048 // spec.d, spec.d
    q, k, v = (torch.randn(b, h, t, d, device="cuda", dtype=DTYPES[spec.dtype],
                           requires_grad=True) for _ in range(3))  # fmt: skip
    do = torch.randn(b, h, t, d, device="cuda", dtype=DTYPES[spec.dtype])
    if impl == "flashgen":
        o = fgt.attention(q, k, v, causal=spec.causal)
    else:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=spec.causal)
    ms = time_ms(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
    flops = 2.5 * 4 * b * h * t * t * d * (0.5 if spec.causal else 1.0)
    return flops / ms / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("names", nargs="+")
    ap.add_argument("--t", default="4096,16384")
    ap.add_argument("--peers", action="store_true")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    seen_peer: set[tuple[Any, ...]] = set()
    for name in args.names:
        spec = KernelSpec.from_name(name)
        for t in (int(x) for x in args.t.split(",")):
            row: dict[str, Any] = {"variant": name, "t": t}
            try:
                use_variant(spec)
                row["tflops"] = tflops("flashgen", spec, t)
            except Exception as exc:  # a variant that does not build or launch: say so
                row["error"] = str(exc)[:300]
            rows.append(row)
            print(json.dumps(row), flush=True)
            peer_key = (spec.d, spec.dtype, spec.causal, t)
            if args.peers and peer_key not in seen_peer:
                seen_peer.add(peer_key)
                prow = {"variant": f"fa2_d{spec.d}_{spec.dtype}_causal{int(spec.causal)}", "t": t,
                        "tflops": tflops("fa2", spec, t)}  # fmt: skip
                rows.append(prow)
                print(json.dumps(prow), flush=True)
    with open(args.out, "w") as fh:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)
    for r in rows:
        print(f"{r['variant']:55} {r['t']:6} {r.get('tflops') or 0:7.1f}")


if __name__ == "__main__":
    main()
