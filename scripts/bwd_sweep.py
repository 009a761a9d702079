"""Time explicit backward variants through flashgen.torch (a dev tool for picking tiles).

    python3 scripts/bwd_sweep.py OUT.json NAME [NAME ...] [--t 4096,16384] [--peers]

Each NAME is a backward variant (`flash_bwd_mma_...`); it runs on the bench's problem for its
d, dtype and causal flag (B*T = 16384, H*d = 2048) at every --t, with the protocol of
`bench.bench_backward_case` (forward once, `torch.autograd.grad` timed, FLOPs = 2.5 x forward).
`--peers` adds SDPA's FA2 backward for the same rows. The torch op normally picks the family
default backward; here its plan lookup is pointed at NAME for the duration of the rows.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch

import flashgen.torch as fgt
from flashgen.generator.compile import compile_kernel
from flashgen.generator.spec import KernelSpec
from flashgen.perf.bench import Case, bench_backward_case
from flashgen.runtime import gpu as runtime
from flashgen.runtime import launch


def use_variant(spec: KernelSpec) -> None:
    """Make flashgen.torch's backward run `spec`, of either family (its caches are cleared)."""

    def plan(
        dev: int, d: int, dtype: str, causal: bool, deterministic: bool = False,
        family: str = "mma", features: tuple[str, ...] = (),
    ) -> Any:  # fmt: skip
        with runtime.for_device_arch(fgt._device_arch(dev)):
            karch = runtime.kernel_arch(spec)
        hit = launch.plan(spec, lambda: compile_kernel(spec, karch).cubin, karch, dev)
        return hit.spec, hit

    fgt._bwd_plan = plan  # type: ignore[assignment]
    fgt._bwd_entries.clear()


def tflops(impl: str, spec: KernelSpec, t: int) -> float:
    """`impl` ("flashgen" or an SDPA peer such as "sdpa-flash") on the bench's problem."""
    peers = () if impl == "flashgen" else (impl,)
    rows = bench_backward_case(Case(spec.dtype, spec.d, spec.causal, t), peers=peers)
    row = next(r for r in rows if r.impl == impl)
    if row.tflops is None:
        raise RuntimeError(row.error or f"{impl}: no timing")
    return row.tflops


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("names", nargs="+")
    ap.add_argument("--t", default="4096,16384")
    ap.add_argument("--peers", action="store_true")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    seen_peer: set[tuple[Any, ...]] = set()
    ts = [int(x) for x in args.t.split(",")]
    for name in args.names:
        try:
            spec = KernelSpec.from_name(name)
        except Exception as exc:  # a name this tree does not know (e.g. a patch's new tile)
            rows += [{"variant": name, "t": t, "error": str(exc)[:300]} for t in ts]
            continue
        for t in ts:
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
                        "tflops": tflops("sdpa-flash", spec, t)}  # fmt: skip
                rows.append(prow)
                print(json.dumps(prow), flush=True)
    with open(args.out, "w") as fh:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)
    for r in rows:
        print(f"{r['variant']:55} {r['t']:6} {r.get('tflops') or 0:7.1f}")


if __name__ == "__main__":
    main()
