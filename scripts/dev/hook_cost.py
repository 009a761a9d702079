"""What a hook costs against the built-in feature it reproduces, family wgmma's forward (or, with
--bwd, its backward), measured in interleaved rounds (the H200's clocks drift between runs):

    python3 scripts/dev/hook_cost.py [OUT.json] [--rounds 5] [--t 16384] [--dtype bf16] [--bwd]

d 128, B*T = 16k tokens, 16 heads (the bench's size), the default wgmma tile (128 x 128, two
stages). Each round times, through flashgen.runtime (one bound launch, CUDA events, the bench's
warm-up), every pair back to back, the built-in kernel and the hooked one in alternating order:

  softcap        softcap_hook()                vs features=("softcap",)      causal and not
  alibi          alibi_hook()                  vs features=("alibi",)        causal and not
  causal-mask    causal=False + causal_hook()  vs causal=True
  window-mask    causal + window_hook()        vs causal + features=("window",), 4096 back
  causal+hook    causal=True + causal_hook()   vs causal=True     (the mask_mod's own cost)
  window+hook    causal + window + window_hook vs causal + window  (the same, on the window span)

The ratio is the hooked kernel's TFLOP/s of useful work over the built-in's (the same useful
FLOPs: built-in ms / hooked ms); the bar is 0.98. The mask_mod's tile verdicts skip the tiles
it drops whole (docs/hooks.md, "Tile verdicts"), so causal-mask and window-mask visit the
built-in kernel's tiles; the +hook rows isolate what the per-element mask costs.
--bwd times the backward variants of the same pairs (dQ, dK, dV: the three kernels through
runtime.backward.Prepared, as the torch front door launches them; the default backward tile,
64 x 128), on the O and LSE of the built-in forward, with the backward's useful FLOPs (2.5x the
forward's). There the mask_mods' tile verdicts skip the query tiles they drop whole, so
causal-mask and window-mask compare like with like.
Needs torch with CUDA and an sm_90 GPU; compiles every variant first (in parallel).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from typing import Any

from flashgen.generator.features import FeatureArgs
from flashgen.generator.features import hook as fh
from flashgen.generator.hooks import library
from flashgen.generator.numerics import LOG2E
from flashgen.generator.spec import KernelSpec
from flashgen.perf.bench import environment, time_ms
from flashgen.runtime import gpu as runtime
from flashgen.runtime.validate import check_scale, validate_inputs
from flashgen.verify.checks import compile_all

BAR = 0.98
SOFTCAP = 30.0
WINDOW = (4096, 0)  # the bench's causal sliding window (bench_features.WINDOW)
HEADS = 16
D = 128
TOKENS = 16384


def pairs(dtype: str, t: int, direction: str = "fwd") -> list[dict[str, Any]]:
    """Each comparison: label, built-in spec + its FeatureArgs, hooked spec + its hooks' aux
    values (by name; "slopes" stands for the ALiBi slopes tensor) + FeatureArgs, useful FLOPs;
    the specs of `direction` ("bwd": the backward variants, whose GEMMs are 2.5x the
    forward's)."""
    b = max(1, TOKENS // t)
    per_pass = 2.5 if direction == "bwd" else 1.0

    def spec(causal: bool, *features: str) -> KernelSpec:
        return KernelSpec(
            family="wgmma", d=D, dtype=dtype, causal=causal, features=features,
            direction=direction,
        )  # fmt: skip

    def flops(causal: bool, window: tuple[int, int] | None = None) -> float:
        if window is not None:
            full = min(t, window[0] + 1)
            seen = full * (full + 1) // 2 + (t - full) * (window[0] + 1)
        else:
            seen = t * (t + 1) // 2 if causal else t * t
        return 4.0 * per_pass * b * HEADS * seen * D

    out: list[dict[str, Any]] = []
    cap, alibi = library.softcap_hook(), library.alibi_hook()
    causal_h, window_h = library.causal_hook(), library.window_hook()
    for causal in (False, True):
        tag = "causal" if causal else "noncausal"
        out.append({
            "label": f"softcap {tag}", "builtin": spec(causal, "softcap"),
            "builtin_feats": FeatureArgs(softcap=SOFTCAP), "hooked": spec(causal, fh.token_of(cap)),
            "hooks": (cap,), "aux": {"softcap": SOFTCAP}, "flops": flops(causal),
        })  # fmt: skip
        out.append({
            "label": f"alibi {tag}", "builtin": spec(causal, "alibi"),
            "builtin_feats": "slopes", "hooked": spec(causal, fh.token_of(alibi)),
            "hooks": (alibi,), "aux": {"alibi_slopes": "slopes"}, "flops": flops(causal),
        })  # fmt: skip
    win_aux = {"window_left": WINDOW[0], "window_right": WINDOW[1]}
    out += [
        {"label": "causal-mask (tile verdicts)", "builtin": spec(True),
         "builtin_feats": FeatureArgs(), "hooked": spec(False, fh.token_of(causal_h)),
         "hooks": (causal_h,), "aux": {}, "flops": flops(True)},
        {"label": "window-mask (tile verdicts)", "builtin": spec(True, "window"),
         "builtin_feats": FeatureArgs(window=WINDOW), "hooked": spec(True, fh.token_of(window_h)),
         "hooks": (window_h,), "aux": win_aux, "flops": flops(True, WINDOW)},
        {"label": "causal+hook (per-element cost)", "builtin": spec(True),
         "builtin_feats": FeatureArgs(), "hooked": spec(True, fh.token_of(causal_h)),
         "hooks": (causal_h,), "aux": {}, "flops": flops(True)},
        {"label": "window+hook (per-element cost)", "builtin": spec(True, "window"),
         "builtin_feats": FeatureArgs(window=WINDOW),
         "hooked": spec(True, "window", fh.token_of(window_h)), "hooked_feats":
         FeatureArgs(window=WINDOW), "hooks": (window_h,), "aux": win_aux,
         "flops": flops(True, WINDOW)},
    ]  # fmt: skip
    return out


def runner(
    spec: KernelSpec, q: Any, k: Any, v: Any, feats: FeatureArgs, hooks: fh.HookArgs | None
) -> Callable[[], None]:
    """A closure launching `spec` (validated once, bound once) on torch's current stream."""
    import torch

    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], device="cuda", dtype=torch.float32)
    problem = validate_inputs(spec, q, k, v, o=o, lse=lse)
    scale_log2 = check_scale(None, spec.d) * LOG2E
    bound = runtime.get_function(spec).bind(problem, scale_log2, feats, hooks)
    ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr())
    stream = int(torch.cuda.current_stream().cuda_stream)
    return lambda: bound(*ptrs, stream)


def forward_of(spec: KernelSpec) -> KernelSpec:
    """The forward variant (default tile) with a backward spec's family, shape and features."""
    return KernelSpec(
        family=spec.family, d=spec.d, dtype=spec.dtype, causal=spec.causal, features=spec.features
    )


def bwd_runner(
    spec: KernelSpec, q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, feats: FeatureArgs,
    hooks: fh.HookArgs | None,
) -> Callable[[], None]:  # fmt: skip
    """A closure launching backward `spec`'s three kernels on torch's current stream, as the
    torch front door does (flashgen/hooked.py `_run_backward`: one Prepared, scratch from
    torch's allocator); o and lse are a forward's."""
    import torch

    from flashgen.runtime import backward
    from flashgen.torch_support import raw_stream, run_backward

    dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
    dev = int(q.get_device())
    arch = "sm_{}{}".format(*torch.cuda.get_device_capability(dev))
    plan = runtime.device_plan(spec, arch, dev)
    bp = backward.validate_backward(spec, q, k, v, o, lse, do, dq, dk, dv)
    scale_log2 = check_scale(None, spec.d) * LOG2E
    prepared = backward.Prepared(plan, spec, bp, scale_log2, feats, hooks=hooks)
    tensors, stream = (q, k, v, o, lse, do, dq, dk, dv), raw_stream(dev)
    return lambda: run_backward(prepared, tensors, stream)


def main() -> None:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default="")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--t", type=int, default=16384)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--bwd", action="store_true", help="time the backward variants")
    args = ap.parse_args()
    jobs = pairs(args.dtype, args.t, "bwd" if args.bwd else "fwd")
    specs = [s for j in jobs for s in (j["builtin"], j["hooked"])]
    if args.bwd:  # the built-in forwards write the O and LSE both backwards read
        specs += [forward_of(j["builtin"]) for j in jobs]
    built = compile_all(list(dict.fromkeys(specs)))
    bad = {s.name: str(e) for s, e in built.items() if isinstance(e, Exception)}
    if bad:
        raise SystemExit(f"did not compile: {bad}")

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    b = max(1, TOKENS // args.t)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((b, HEADS, args.t, D), device="cuda", dtype=dt, generator=g)
               for _ in "qkv")  # fmt: skip
    slopes = 2.0 ** (-8.0 * (torch.arange(HEADS, device="cuda", dtype=torch.float32) + 1) / HEADS)
    fns: list[tuple[Callable[[], None], Callable[[], None]]] = []
    for j in jobs:
        feats = j["builtin_feats"]
        if feats == "slopes":
            feats = FeatureArgs(alibi=slopes.data_ptr())
        aux = {n: (slopes.data_ptr() if x == "slopes" else x) for n, x in j["aux"].items()}
        hooks = fh.HookArgs(j["hooks"], aux)
        hooked_feats = j.get("hooked_feats", FeatureArgs())
        if args.bwd:
            fwd = forward_of(j["builtin"])
            o = torch.empty_like(q)
            lse = torch.empty(q.shape[:3], device="cuda", dtype=torch.float32)
            problem = validate_inputs(fwd, q, k, v, o=o, lse=lse)
            scale_log2 = check_scale(None, fwd.d) * LOG2E
            runtime.get_function(fwd).bind(problem, scale_log2, feats, None)(
                q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
                int(torch.cuda.current_stream().cuda_stream),
            )  # fmt: skip
            do = torch.randn(q.shape, device="cuda", dtype=dt, generator=g)
            plain = bwd_runner(j["builtin"], q, k, v, o, lse, do, feats, None)
            fns.append((plain, bwd_runner(j["hooked"], q, k, v, o, lse, do, hooked_feats, hooks)))
            continue
        fns.append((runner(j["builtin"], q, k, v, feats, None),
                    runner(j["hooked"], q, k, v, hooked_feats, hooks)))  # fmt: skip

    rows: list[dict[str, Any]] = []
    ratios: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for j, (plain, hooked) in zip(jobs, fns, strict=True):
            order = [("builtin", plain), ("hooked", hooked)]
            if r % 2:
                order.reverse()  # alternate who runs first, so a drifting clock favours neither
            ms = {which: time_ms(fn, reps=args.reps) for which, fn in order}
            tf = {w: j["flops"] / (m * 1e-3) / 1e12 for w, m in ms.items()}
            ratio = tf["hooked"] / tf["builtin"]
            ratios.setdefault(j["label"], []).append(ratio)
            rows.append({"round": r, "label": j["label"], "builtin": j["builtin"].name,
                         "hooked": j["hooked"].name, "ms": ms, "tflops": tf,
                         "ratio": ratio})  # fmt: skip
            print(f"round {r} {j['label']:32s} built-in {tf['builtin']:6.1f} hooked "
                  f"{tf['hooked']:6.1f} TFLOP/s  x {ratio:.3f}", flush=True)  # fmt: skip
    summary = {k: {"median": statistics.median(v), "min": min(v), "max": max(v)}
               for k, v in ratios.items()}  # fmt: skip
    what = "backward" if args.bwd else "forward"
    print(f"\n{what} {args.dtype} d{D} T={args.t} B={b} H={HEADS}: hooked / built-in TFLOP/s "
          f"(bar {BAR})")  # fmt: skip
    for k, s in summary.items():
        ok = "ok" if s["median"] >= BAR else "BELOW BAR"
        print(f"  {k:32s} median {s['median']:.3f} (min {s['min']:.3f}, max {s['max']:.3f}) {ok}")
    if args.out:
        with open(args.out, "w") as fh_out:
            json.dump({"env": environment(), "bar": BAR, "summary": summary, "rows": rows},
                      fh_out, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
