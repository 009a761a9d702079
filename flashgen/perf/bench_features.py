"""`flashgen bench`'s feature rows: grouped-query attention and a causal sliding window.

Each row times the feature variant, the same tile without the feature ("flashgen-plain") on
the problem of equal useful work, and the peers that support the feature:
- `gqa`: Hq = 32 query heads on Hkv = 8 K/V heads, d = 128, B*T = 16384. The plain kernel runs
  the same problem with 32 K/V heads (the same FLOPs); SDPA's FA2 and cuDNN backends with
  `enable_gqa=True`; FA4 with its native GQA.
- `window`: causal, a window of 4096 keys back, H = 16, d = 128, B*T = 16384. FLOPs count
  only the visible (query, key) pairs; the plain kernel is the causal one on the same T (its
  useful FLOPs are the causal pairs), so TFLOP/s compare the work each kernel must do. FA4
  with `window_size` when importable (SDPA has no sliding window but a dense mask).
The feature's cost is flashgen's TFLOP/s over flashgen-plain's (the bar: >= 0.95).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from flashgen.generator.features import FeatureArgs
from flashgen.generator.spec import KernelSpec
from flashgen.perf.bench import (
    TOKENS,
    Row,
    _torch,
    fa4_available,
    flashgen_runner,
    time_ms,
    torch_dtype,
)

GQA_HEADS = (32, 8)  # (Hq, Hkv)
GQA_D = 128
WINDOW = (4096, 0)
WINDOW_HEADS = 16
WINDOW_D = 128
COST_BAR = 0.95  # a feature's TFLOP/s over the plain kernel's


@dataclass(frozen=True)
class FeatureCase:
    """One feature benchmark problem."""

    kind: str  # "gqa" or "window"
    dtype: str
    causal: bool
    t: int

    @property
    def d(self) -> int:
        """Head dimension."""
        return GQA_D if self.kind == "gqa" else WINDOW_D

    @property
    def b(self) -> int:
        """Batch so that B*T = TOKENS."""
        return max(1, TOKENS // self.t)

    @property
    def h(self) -> int:
        """Query heads."""
        return GQA_HEADS[0] if self.kind == "gqa" else WINDOW_HEADS

    @property
    def h_kv(self) -> int:
        """K/V heads."""
        return GQA_HEADS[1] if self.kind == "gqa" else self.h

    @property
    def window(self) -> tuple[int, int] | None:
        """The sliding window (left, right), or None."""
        return WINDOW if self.kind == "window" else None

    @property
    def label(self) -> str:
        """How the row names its feature."""
        if self.kind == "gqa":
            return f"gqa {self.h}/{self.h_kv}"
        return f"window {WINDOW[0]},{WINDOW[1]}"

    def pairs(self, window: tuple[int, int] | None) -> int:
        """Visible (query, key) pairs of one head (Tq = Tk = T), causal and window applied."""
        t = self.t
        if window is None:
            return t * (t + 1) // 2 if self.causal else t * t
        left = window[0]
        # causal with `left` keys back: row i sees min(i, left) + 1 keys
        full = min(t, left + 1)
        return full * (full + 1) // 2 + (t - full) * (left + 1)

    def flops(self, window: tuple[int, int] | None) -> float:
        """Useful forward FLOPs: 4 * B * H * pairs * d."""
        return 4.0 * self.b * self.h * self.pairs(window) * self.d


def feature_cases(
    dtypes: Iterable[str] = ("bf16", "fp16"), seq_lens: Iterable[int] = (4096, 16384)
) -> list[FeatureCase]:
    """GQA rows (causal and not) and causal window rows for each dtype and T."""
    out = []
    for dt in dtypes:
        for t in seq_lens:
            out += [FeatureCase("gqa", dt, False, t), FeatureCase("gqa", dt, True, t)]
            if t > WINDOW[0]:
                out.append(FeatureCase("window", dt, True, t))
    return out


def _inputs(fc: FeatureCase, h_kv: int, seed: int = 0) -> tuple[Any, Any, Any]:
    torch = _torch()
    dt = torch_dtype(fc.dtype)
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn((fc.b, fc.h, fc.t, fc.d), device="cuda", dtype=dt, generator=g)
    k, v = (
        torch.randn((fc.b, h_kv, fc.t, fc.d), device="cuda", dtype=dt, generator=g) for _ in "kv"
    )
    return q, k, v


def _runner(spec: KernelSpec, q: Any, k: Any, v: Any, feats: FeatureArgs) -> Callable[[], None]:
    return flashgen_runner(spec, q, k, v, feats)[0]


def _peer(peer: str, fc: FeatureCase, q: Any, k: Any, v: Any) -> Callable[[], Any]:
    torch = _torch()
    if peer == "fa4":
        from flash_attn.cute.interface import flash_attn_func

        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        kw: dict[str, Any] = {"causal": fc.causal}
        if fc.window is not None:
            kw["window_size"] = fc.window
        return lambda: flash_attn_func(qt, kt, vt, **kw)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION}
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def run() -> Any:
        with sdpa_kernel([backend[peer]]):
            return sdpa(q, k, v, is_causal=fc.causal, enable_gqa=True)

    return run


def _peer_on_inputs(peer: str, fc: FeatureCase) -> Callable[[], Any]:
    return _peer(peer, fc, *_inputs(fc, fc.h_kv))


def feature_peers(fc: FeatureCase, peers: bool) -> tuple[str, ...]:
    """The peers that serve the feature (SDPA has no sliding window)."""
    if not peers:
        return ()
    sdpa = ("sdpa-flash", "sdpa-cudnn") if fc.kind == "gqa" else ()
    return sdpa + (("fa4",) if fa4_available() else ())


def _row(impl: str, spec: KernelSpec | None, fc: FeatureCase, ms: float | None, flops: float,
         error: str | None = None) -> Row:  # fmt: skip
    tflops = flops / (ms * 1e-3) / 1e12 if ms else None
    return Row(
        impl, spec.name if spec else None, fc.dtype, fc.d, fc.causal, fc.t, fc.b, fc.h, ms,
        tflops, error=error, feature=fc.label,
    )  # fmt: skip


def bench_feature_case(
    fc: FeatureCase, plain: KernelSpec, peers: bool = True, reps: int = 30
) -> list[Row]:
    """Time the feature variant of `plain`, `plain` itself on the equal-work problem, peers."""
    rows: list[Row] = []
    feats = FeatureArgs(window=fc.window)
    spec = plain.replace(features=feats.tokens)
    useful = fc.flops(fc.window)
    jobs: list[tuple[str, KernelSpec | None, Callable[[], Callable[[], Any]], float]] = [
        ("flashgen", spec, lambda: _runner(spec, *_inputs(fc, fc.h_kv), feats), useful),
        # the same tile without the feature: MHA with as many K/V heads as query heads (GQA's
        # FLOPs), or plain causal on the same T (its own useful FLOPs)
        ("flashgen-plain", plain, lambda: _runner(plain, *_inputs(fc, fc.h), FeatureArgs()),
         fc.flops(None)),
    ]  # fmt: skip
    for peer in feature_peers(fc, peers):
        jobs.append((peer, None, functools.partial(_peer_on_inputs, peer, fc), useful))
    for impl, sp, make, flops in jobs:
        try:
            fn = make()
            rows.append(_row(impl, sp, fc, time_ms(fn, reps=reps), flops))
        except Exception as exc:  # a peer that refuses the shape is a row, not a crash
            rows.append(_row(impl, sp, fc, None, flops, f"{type(exc).__name__}: {exc}"[:300]))
    return rows


def feature_summary(rows: list[Row]) -> list[dict[str, Any]]:
    """One line per feature case: flashgen, flashgen-plain, peers, and the feature's cost."""
    keyed: dict[tuple[Any, ...], dict[str, Row]] = {}
    for r in rows:
        if r.feature is None or r.tflops is None:
            continue
        keyed.setdefault((r.feature, r.dtype, r.d, r.causal, r.t), {})[r.impl] = r
    out = []
    for key in sorted(keyed, key=lambda k: (k[0], k[1], k[3], k[4])):
        by = keyed[key]
        ours, plain = by.get("flashgen"), by.get("flashgen-plain")
        line: dict[str, Any] = {
            "feature": key[0], "dtype": key[1], "d": key[2], "causal": key[3], "T": key[4],
            "flashgen": ours.tflops if ours else None,
            "plain": plain.tflops if plain else None,
            "variant": ours.variant if ours else None,
        }  # fmt: skip
        ratio = None
        if ours and plain and ours.tflops and plain.tflops:
            ratio = ours.tflops / plain.tflops
        line["x_plain"] = ratio
        for peer in ("sdpa-flash", "sdpa-cudnn", "fa4"):
            p = by.get(peer)
            line[peer] = p.tflops if p else None
        out.append(line)
    return out
