"""Hooked attention against FlexAttention and FA4's mask_mods, and hooks against the built-ins
(issue 27's bars), on the H200 in one `run` call:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit 1; \
    bash .fa4/fa4-install.sh part2 && source /tmp/fa4/env.sh; \
    python3 scripts/hooks_bench.py --out $OUT/hooks_bench.json 2>&1 | tee $OUT/hooks_bench.log

(carry `.whl`, `.fa4/part2` and `.fa4/fa4-install.sh`; the call right before it ran
`bash .fa4/fa4-install.sh part1` carrying `.fa4/part1`: ../shared/gpu-host/README.md,
"FlashAttention-4 as a benchmark peer". Without FA4 the fa4 columns are skipped with their
reason.) The defaults fit
one call (`--budget-s 540`: no new row is set up after 70% of it, no new round is started after
it; the JSON is rewritten after every step, so a run cut short still leaves its rows).

Mask rows: {document (16 packed documents of random lengths, seed fixed), prefix-LM (prefix
1024)} x d {64, 128} x T {4096, 16384} x {fwd, fwd+bwd}; bf16, H*d = 2048, B*T = 16384 tokens.
Implementations per row (each skipped with a one-line reason when it cannot import or run):

  flashgen    flashgen.torch.attention(q, k, v, mask_mod=document_hook() / prefix_lm_hook(),
              aux={"doc_ids": ...} / {"prefix": 1024}), causal=False
  flex        torch.compile(flex_attention, dynamic=False) with create_block_mask of the same
              mask (this script's own mask functions; the document ids a captured tensor); the
              block mask is built once per row, outside the timings (its build time excluded)
  flashgen-map  the same with `flashgen.torch.block_map` built once per row (on the first
              call, in the warm-up), as flex's BlockMask is
  fa4         flash_attn.cute.interface.flash_attn_func(..., mask_mod=, aux_tensors=) without
              block sparsity (every tile evaluated, as flashgen's hooks today)
  fa4-blocks  the same plus block_sparse_tensors(_bwd) taken from the flex BlockMask (128 x 128)
  builtin     the built-in kernel nearest the hook: flashgen's varlen kernel over the same
              documents (same mask), flashgen causal=True for prefix-LM (a reference: its own
              mask, its own FLOPs)

FA4 4.0.0b36 (the staged wheel) supports mask_mod and score_mod on sm90 (interface.py:
`_flash_attn_fwd` builds `FlashAttentionForwardSm90(..., mask_mod=mask_mod, score_mod=score_mod,
has_aux_tensors=...)` and accepts `block_sparse_tensors`; `_flash_attn_bwd` builds
`FlashAttentionBackwardSm90(..., score_mod, score_mod_bwd, mask_mod)`; a score_mod's backward
needs `score_mod_bwd`; only SM 8.x refuses a custom score_mod and SM 12.0 a backward mask_mod).
A mask_mod is called as `mask_mod(batch, head, q_idx, kv_idx, seqlen_info, aux_tensors)` on
TensorSSA indices of shape (1,) (mask.py: call_mask_mod).

Hook-cost rows (the 0.98x bar; d 128, T 16384, B 1, H 16, bf16, fwd and fwd+bwd), through the
front door `flashgen.torch.attention`, hooked (family mma today) against built-in:
softcap and alibi (score_mods, causal and not), causal-mask (causal=False + causal_hook vs
causal=True), causal+hook (causal=True + causal_hook vs causal=True), window-mask
(causal + window_hook vs causal + window=(4096, 0)), window+hook (window + window_hook vs
window). scripts/dev/hook_cost.py times family wgmma's hooked forward kernels alone.

Protocol: every implementation is warmed up (torch.compile and FA4's JIT compile on their first
calls; excluded from the timings), then checked against a float64 dense reference on a slice
(two (batch, head) pairs, every row and key: O, and dQ, dK, dV for fwd+bwd rows), before any
timing: it passes when max|x - ref64| <= 2 * max|ref_bf16 - ref64| + 1e-3 * max|ref64|, ref_bf16
being the same dense computation in bf16; a failing implementation is reported WRONG and never
timed (exit status 1). Rounds (`--rounds`, default 3) time every row, implementations
interleaved in a rotated order, with CUDA events (flashgen.perf.bench.time_ms: warm-up calls and
`--warmup-s` seconds of back-to-back calls, then the median of `--reps`); the figure is the
median over rounds. fwd rows time an inference forward; fwd+bwd rows time the training
forward (fwd) and forward + torch.autograd.grad (step) in the same round: bwd = step - fwd.
FLOPs: 4 * B * H * kept * d, kept the (query, key) pairs the mask keeps, counted exactly; bwd
2.5x, step 3.5x. The ratios are flashgen's TFLOP/s over each peer's (hooked over built-in).
`--timing graph` times through CUDA graphs (scripts/graph_timing.py), falling back to events
for a call that cannot be captured: at T = 4096 the document rows are tens of microseconds,
where host launch overhead shows.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import json
import math
import os
import random
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "flashgen-hooks-bench/1"
MASKS = ("document", "prefix_lm")
DIMS = (64, 128)
LENGTHS = (4096, 16384)
MODES = ("fwd", "fwd+bwd")
IMPLS = ("flashgen", "flashgen-map", "flex", "fa4", "fa4-blocks", "builtin")
HOOK_COST = (
    "softcap", "softcap-causal", "alibi", "alibi-causal", "causal-mask", "causal+hook",
    "window-mask", "window+hook",
)  # fmt: skip
TOKENS = 16384
MODEL_DIM = 2048
DOCS = 16
PREFIX = 1024
SOFTCAP = 30.0
WINDOW = (4096, 0)
HOOK_COST_D = 128
HOOK_COST_T = 16384
BLOCK = 128  # FlexAttention's block mask and FA4's sparse blocks
BWD_FACTOR = 2.5
STEP_FACTOR = 1.0 + BWD_FACTOR
BARS = {"flex": 1.3, "fa4": 1.0, "fa4-blocks": 1.0, "hook_cost": 0.98}
SETUP_SHARE = 0.7  # of --budget-s: no new row is set up after it
CHECK_SLACK = 2.0
CHECK_ATOL = 1e-3


class Unavailable(Exception):
    """An implementation that cannot run here (import or support); the message is the reason."""


# ---- rows -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    """One measurement: a mask (or a hook-cost pair), a shape, a mode."""

    kind: str  # "mask" or "hook_cost"
    name: str  # a MASKS entry or a HOOK_COST entry
    d: int
    t: int
    b: int
    h: int
    mode: str  # "fwd" or "fwd+bwd"

    @property
    def key(self) -> str:
        return f"{self.name} d{self.d} T{self.t} {self.mode}"


def shape(d: int, t: int, tokens: int = TOKENS, model_dim: int = MODEL_DIM) -> tuple[int, int]:
    """(B, H) of the protocol: H*d = model_dim, B*T = tokens (B = 1 when T >= tokens)."""
    if model_dim % d:
        raise ValueError(f"d={d}: must divide the model dimension {model_dim}")
    return max(1, tokens // t), model_dim // d


def mask_rows(
    masks: Sequence[str], dims: Sequence[int], lengths: Sequence[int], modes: Sequence[str],
    tokens: int = TOKENS, model_dim: int = MODEL_DIM,
) -> list[Row]:  # fmt: skip
    """The mask rows, in the order they are set up and timed."""
    out = []
    for name in masks:
        for d in dims:
            for t in lengths:
                b, h = shape(d, t, tokens, model_dim)
                out += [Row("mask", name, d, t, b, h, mode) for mode in modes]
    return out


def hook_cost_rows(names: Sequence[str], modes: Sequence[str]) -> list[Row]:
    """The hook-cost rows (d 128, T 16k, bf16)."""
    b, h = shape(HOOK_COST_D, HOOK_COST_T)
    return [
        Row("hook_cost", n, HOOK_COST_D, HOOK_COST_T, b, h, mode) for n in names for mode in modes
    ]


def row_mask(row: Row) -> str:
    """The mask a row's hooked implementation computes (`full` for none)."""
    if row.kind == "mask":
        return row.name
    return {
        "softcap": "full", "alibi": "full", "softcap-causal": "causal", "alibi-causal": "causal",
        "causal-mask": "causal", "causal+hook": "causal", "window-mask": "window",
        "window+hook": "window",
    }[row.name]  # fmt: skip


# ---- masks: lengths, ids and the pairs they keep ---------------------------------------------
def doc_lengths(t: int, n_docs: int = DOCS, seed: int = 0) -> list[int]:
    """`n_docs` random document lengths (each >= 1) summing to t, from a fixed seed."""
    if not 1 <= n_docs <= t:
        raise ValueError(f"docs={n_docs}: need 1 <= docs <= T={t}")
    cuts = sorted(random.Random(seed).sample(range(1, t), n_docs - 1))
    edges = [0, *cuts, t]
    return [b - a for a, b in zip(edges, edges[1:], strict=False)]


def doc_ids(lengths: Sequence[int]) -> list[int]:
    """The document id of every token of packed documents of these lengths."""
    return [i for i, n in enumerate(lengths) for _ in range(n)]


def kept_pairs(
    mask: str, t: int, *, lengths: Sequence[int] = (), prefix: int = PREFIX,
    window: tuple[int, int] = WINDOW,
) -> int:  # fmt: skip
    """Exactly how many (query, key) pairs of one (batch, head) a mask keeps, Tq = Tk = t:
    full, causal, window (causal, `window[0]` keys back), document (the same document; the
    lengths sum to t), prefix_lm (key < prefix, or key <= query)."""
    if mask == "full":
        return t * t
    if mask == "causal":
        return t * (t + 1) // 2
    if mask == "window":
        left = window[0]
        if left < 0:
            return t * (t + 1) // 2
        ramp = min(t, left + 1)  # rows that see every key back to 0
        return ramp * (ramp + 1) // 2 + (t - ramp) * (left + 1)
    if mask == "document":
        if sum(lengths) != t:
            raise ValueError(f"document lengths sum to {sum(lengths)}, not T={t}")
        return sum(n * n for n in lengths)
    if mask == "prefix_lm":
        p = max(0, min(prefix, t))
        return p * p + t * (t + 1) // 2 - p * (p + 1) // 2
    raise ValueError(f"mask={mask!r}: unknown")


def keeps(
    mask: str, i: int, j: int, *, ids: Sequence[int] = (), prefix: int = PREFIX,
    window: tuple[int, int] = WINDOW,
) -> bool:  # fmt: skip
    """Whether query i sees key j (Tq = Tk): the rule `kept_pairs` counts, one pair at a time."""
    if mask == "full":
        return True
    if mask == "causal":
        return j <= i
    if mask == "window":
        return j <= i and (window[0] < 0 or i - j <= window[0])
    if mask == "document":
        return ids[i] == ids[j]
    if mask == "prefix_lm":
        return j < prefix or j <= i
    raise ValueError(f"mask={mask!r}: unknown")


def flops(row: Row, pairs: int) -> float:
    """Forward FLOPs of a row over `pairs` kept pairs per (batch, head)."""
    return 4.0 * row.b * row.h * pairs * row.d


# ---- arguments --------------------------------------------------------------------------------
def _csv(kind: type, choices: Sequence[Any] | None = None) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        try:
            items = [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list") from None
        bad = [x for x in items if choices is not None and x not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(
                f"{text!r}: choose from {','.join(map(str, choices or ()))}"
            )
        return items

    return parse


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (module docstring)."""
    ap = argparse.ArgumentParser(
        prog="hooks_bench.py", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    ap.add_argument("--out", default="hooks_bench.json", help="the JSON written (and rewritten)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    ap.add_argument("--masks", type=_csv(str, MASKS), default=list(MASKS))
    ap.add_argument("--d", type=_csv(int, DIMS), default=list(DIMS), dest="dims")
    ap.add_argument("--t", type=_csv(int), default=list(LENGTHS), dest="lengths")
    ap.add_argument("--modes", type=_csv(str, MODES), default=list(MODES))
    ap.add_argument("--impls", type=_csv(str, IMPLS), default=list(IMPLS))
    ap.add_argument("--hook-cost", type=_csv(str, HOOK_COST), default=list(HOOK_COST),
                    help="hook-cost pairs (d 128, T 16k)")  # fmt: skip
    ap.add_argument("--no-hook-cost", action="store_true", help="skip the hook-cost rows")
    ap.add_argument("--no-mask-rows", action="store_true", help="only the hook-cost rows")
    ap.add_argument("--docs", type=int, default=DOCS)
    ap.add_argument("--prefix", type=int, default=PREFIX)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=10, help="CUDA-event timings per measurement")
    ap.add_argument("--warmup-s", type=float, default=0.2,
                    help="seconds of back-to-back calls before each measurement")  # fmt: skip
    ap.add_argument("--timing", choices=("events", "graph"), default="events")
    ap.add_argument("--budget-s", type=float, default=540.0, help="wall-clock budget (module doc)")
    ap.add_argument("--no-prebuild", action="store_true",
                    help="skip compiling flashgen's hooked variants up front")  # fmt: skip
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.reps < 1:
        ap.error("--rounds and --reps must be >= 1")
    if any(t < 2 or TOKENS % t and t < TOKENS for t in args.lengths):
        ap.error(f"--t: lengths >= 2 that divide {TOKENS} (or exceed it)")
    if not 1 <= args.docs <= min(args.lengths):
        ap.error(f"--docs={args.docs}: between 1 and the shortest T")
    return args


def planned_rows(args: argparse.Namespace) -> list[Row]:
    """Every row the arguments ask for: mask rows, then hook-cost rows."""
    out = [] if args.no_mask_rows else mask_rows(args.masks, args.dims, args.lengths, args.modes)
    if not args.no_hook_cost:
        out += hook_cost_rows(args.hook_cost, args.modes)
    return out


# ---- results ---------------------------------------------------------------------------------
@dataclass
class ImplResult:
    """One implementation in one row."""

    status: str = "pending"  # ok | skipped | failed | wrong | pending
    reason: str = ""
    mask: str = ""
    kept_pairs: int = 0
    check: dict[str, Any] = field(default_factory=dict)
    samples: dict[str, list[float]] = field(default_factory=dict)  # metric -> ms per round
    timing: str = ""

    def medians(self) -> dict[str, float]:
        return {m: statistics.median(v) for m, v in self.samples.items() if v}


def metrics(mode: str) -> tuple[str, ...]:
    """The timed metrics of a mode (bwd is derived: step - fwd per round)."""
    return ("fwd",) if mode == "fwd" else ("fwd", "step")


def tflops_of(row: Row, res: ImplResult) -> dict[str, float]:
    """TFLOP/s per metric (fwd, and bwd and step for fwd+bwd rows) from the median times."""
    base = flops(row, res.kept_pairs)
    out: dict[str, float] = {}
    med = res.medians()
    if "fwd" in med and med["fwd"] > 0:
        out["fwd"] = base / (med["fwd"] * 1e-3) / 1e12
    if "step" in med and med["step"] > 0:
        out["step"] = STEP_FACTOR * base / (med["step"] * 1e-3) / 1e12
        bwd = [s - f for s, f in zip(res.samples["step"], res.samples["fwd"], strict=False)]
        b = statistics.median(bwd) if bwd else 0.0
        if b > 0:
            out["bwd"] = BWD_FACTOR * base / (b * 1e-3) / 1e12
    return out


def row_record(row: Row, impls: dict[str, ImplResult]) -> dict[str, Any]:
    """A row as JSON: its shape, every implementation, and the ratios against the bars."""
    tf = {n: tflops_of(row, r) for n, r in impls.items() if r.status == "ok"}
    ratios: dict[str, dict[str, float]] = {}
    if row.kind == "mask":
        for ours in ("flashgen", "flashgen-map"):  # per call, and with a map built once
            for peer, t in tf.items():
                if ours in tf and not peer.startswith("flashgen"):
                    ratios[f"{ours}/{peer}"] = {
                        m: tf[ours][m] / t[m] for m in t if m in tf[ours] and t[m] > 0
                    }
    elif row.kind == "hook_cost" and "hooked" in tf and "builtin" in tf:
        ratios["hooked/builtin"] = {
            m: tf["hooked"][m] / tf["builtin"][m] for m in tf["builtin"] if m in tf["hooked"]
        }
    return {
        "kind": row.kind, "name": row.name, "key": row.key, "d": row.d, "t": row.t, "b": row.b,
        "h": row.h, "mode": row.mode, "dtype": "bf16",
        "impls": {
            n: {
                "status": r.status, "reason": r.reason, "mask": r.mask, "kept_pairs": r.kept_pairs,
                "flops_fwd": flops(row, r.kept_pairs) if r.kept_pairs else None,
                "check": r.check, "ms_per_round": r.samples, "ms_median": r.medians(),
                "tflops": tf.get(n, {}), "timing": r.timing,
            }
            for n, r in impls.items()
        },
        "ratios": ratios,
    }  # fmt: skip


def bar_of(row: Row, ratio_name: str) -> float | None:
    """The bar a ratio is held to (None: a reference with no bar)."""
    if row.kind == "hook_cost":
        return BARS["hook_cost"]
    return BARS.get(ratio_name.split("/", 1)[1])


def protocol(args: argparse.Namespace) -> dict[str, Any]:
    """What the numbers mean (written into the JSON)."""
    return {
        "dtype": "bf16", "tokens": TOKENS, "model_dim": MODEL_DIM, "docs": args.docs,
        "doc_seed": args.seed, "prefix": args.prefix, "softcap": SOFTCAP, "window": WINDOW,
        "flops": "4*B*H*kept*d, kept = (query, key) pairs the implementation's mask keeps, "
                 "counted exactly",
        "bwd_flops": f"{BWD_FACTOR} x fwd", "step_flops": f"{STEP_FACTOR} x fwd",
        "fwd": "inference forward (fwd rows); training forward, inputs requiring grad "
               "(fwd+bwd rows)",
        "step": "training forward + torch.autograd.grad(o, (q, k, v), do)",
        "bwd": "step - fwd, per round, same round",
        "statistic": f"median over rounds of the median of {args.reps} "
                     f"{'CUDA-graph replays' if args.timing == 'graph' else 'CUDA-event timings'}"
                     f" after {args.warmup_s} s of back-to-back calls",
        "interleaving": "each round times every row; implementations in a rotated order",
        "compile": "torch.compile, FA4's JIT and flashgen's nvcc run in an explicit warm-up "
                   "before the correctness check; excluded from every timing",
        "block_mask_build": "FlexAttention's create_block_mask (and FA4's block-sparse tensors "
                            "taken from it) built once per row before warm-up; build time "
                            "excluded",
        "check": f"float64 dense reference on two (batch, head) pairs, all rows and keys; pass: "
                 f"max|x - ref64| <= {CHECK_SLACK} * max|ref_bf16 - ref64| + {CHECK_ATOL} * "
                 f"max|ref64|; a failing implementation is never timed",
        "ratios": "flashgen TFLOP/s over the peer's (hook-cost: hooked over built-in)",
        "bars": BARS,
    }  # fmt: skip


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Write `doc` atomically (a run cut short leaves the last complete file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    os.replace(tmp, path)


def table(records: Sequence[dict[str, Any]]) -> str:
    """The summary: TFLOP/s per implementation (bwd for fwd+bwd rows) and the ratios."""
    lines = []
    for rec in records:
        metric = "fwd" if rec["mode"] == "fwd" else "bwd"
        cells = []
        for n, r in rec["impls"].items():
            tf = r["tflops"].get(metric)
            cells.append(f"{n} {tf:6.1f}" if tf is not None else f"{n} {r['status'].upper()}")
        ratios = []
        for name, vals in rec["ratios"].items():
            if metric in vals:
                row = Row(rec["kind"], rec["name"], rec["d"], rec["t"], rec["b"], rec["h"],
                          rec["mode"])  # fmt: skip
                bar = bar_of(row, name)
                verdict = "" if bar is None else (" ok" if vals[metric] >= bar else " BELOW")
                ratios.append(f"{name} {vals[metric]:.2f}x{verdict}")
        lines.append(f"{rec['key']:32s} [{metric}] " + " | ".join(cells)
                     + ("  ::  " + "; ".join(ratios) if ratios else ""))  # fmt: skip
    return "\n".join(lines)


# ---- the GPU side ------------------------------------------------------------------------------
def require_cuda() -> Any:
    """torch with a CUDA device, or SystemExit with one line saying what is missing."""
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - any import failure is the same answer
        raise SystemExit(
            f"hooks_bench: needs torch with CUDA; torch does not import ({exc})"
        ) from None
    if not torch.cuda.is_available():
        raise SystemExit("hooks_bench: needs a CUDA GPU (torch.cuda.is_available() is False)")
    return torch


def _dense_mask(torch: Any, mask: str, t: int, ids: Any, prefix: int, device: Any) -> Any:
    """(t, t) bool: query i sees key j."""
    i = torch.arange(t, device=device)[:, None]
    j = torch.arange(t, device=device)[None, :]
    if mask == "full":
        return torch.ones(t, t, dtype=torch.bool, device=device)
    if mask == "causal":
        return j <= i
    if mask == "window":
        return (j <= i) & (i - j <= WINDOW[0])
    if mask == "document":
        return ids[:, None] == ids[None, :]
    if mask == "prefix_lm":
        return (j < prefix) | (j <= i)
    raise ValueError(mask)


def _slice_reference(
    torch: Any, q: Any, k: Any, v: Any, do: Any, keep: Any, score: Callable[[Any], Any] | None,
    dtype: Any, grads: bool,
) -> list[Any]:  # fmt: skip
    """Dense attention of one (batch, head): (T, d) inputs -> [O] or [O, dQ, dK, dV] (float64)."""
    with torch.enable_grad():
        q, k, v = (x.detach().to(dtype).requires_grad_(grads) for x in (q, k, v))
        s = (q @ k.transpose(0, 1)) * (q.shape[-1] ** -0.5)
        s = s.float() if dtype != torch.float64 else s
        if score is not None:
            s = score(s)
        s = s.masked_fill(~keep, -math.inf)
        p = torch.softmax(s, dim=-1).to(dtype)
        o = p @ v
        if not grads:
            return [o.detach().double()]
        dq, dk, dv = torch.autograd.grad(o, (q, k, v), do.to(dtype))
    return [x.detach().double() for x in (o, dq, dk, dv)]


@dataclass
class Impl:
    """How to run one implementation: `run(q, k, v)` on tensors in `layout` ("bhtd" or "bthd")
    returns O in that layout."""

    run: Callable[[Any, Any, Any], Any]
    layout: str
    mask: str
    score: Callable[[Any, int], Any] | None = None  # the reference's score_mod: (s, head)
    copy: bool = False  # give it contiguous copies of q, k, v in its layout


@dataclass
class Calls:
    """An implementation's timed calls (metric -> call), its inputs and dO (fwd+bwd)."""

    fns: dict[str, Callable[[], Any]]
    qkv: tuple[Any, Any, Any]
    do: Any


class Bench:
    """Inputs, implementations, checks and timings of every row."""

    def __init__(self, torch: Any, args: argparse.Namespace) -> None:
        self.torch, self.args = torch, args
        self.dev = torch.device("cuda")
        self._flex_fn: Any = None

    # -- inputs
    def inputs(self, row: Row) -> dict[str, Any]:
        torch = self.torch
        g = torch.Generator(device=self.dev).manual_seed(1000 * row.d + row.t)
        dims = (row.b, row.t, row.h, row.d)
        q, k, v, do = (
            torch.randn(dims, device=self.dev, dtype=torch.bfloat16, generator=g) for _ in "qkvo"
        )
        lengths = doc_lengths(row.t, self.args.docs, self.args.seed)
        ids = torch.tensor(doc_ids(lengths), dtype=torch.int32, device=self.dev)
        slopes = 2.0 ** (-8.0 * (torch.arange(row.h, device=self.dev) + 1) / row.h)
        return {"q": q, "k": k, "v": v, "do": do, "lengths": lengths, "ids": ids,
                "slopes": slopes.float().contiguous()}  # fmt: skip

    # -- implementations
    def impls(self, row: Row, x: dict[str, Any]) -> dict[str, Impl | str]:
        """name -> Impl, or the one-line reason it is skipped."""
        if row.kind == "hook_cost":
            return self._hook_cost_impls(row, x)
        out: dict[str, Impl | str] = {}
        for name in self.args.impls:
            try:
                out[name] = getattr(self, "_" + name.replace("-", "_"))(row, x)
            except Unavailable as exc:
                out[name] = str(exc)
            except Exception as exc:  # noqa: BLE001 - a row, not a crash
                out[name] = f"setup failed: {type(exc).__name__}: {exc}"[:300]
        return out

    def _flashgen_parts(self, row: Row, x: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
        """(flashgen.torch, the row's mask hook, its aux values)."""
        try:
            import flashgen.torch as fgt
            from flashgen.generator.hooks import library
        except Exception as exc:  # noqa: BLE001
            raise Unavailable(f"flashgen.torch does not import: {exc}") from None
        if row.name == "document":
            return fgt, library.document_hook(), {"doc_ids": x["ids"]}
        return fgt, library.prefix_lm_hook(), {"prefix": self.args.prefix}

    def _flashgen(self, row: Row, x: dict[str, Any]) -> Impl:
        fgt, hook, aux = self._flashgen_parts(row, x)

        def run(q: Any, k: Any, v: Any) -> Any:
            return fgt.attention(q, k, v, causal=False, mask_mod=hook, aux=aux)

        return Impl(run, "bhtd", row.name)

    def _flashgen_map(self, row: Row, x: dict[str, Any]) -> Impl:
        """flashgen with a block map built once per row (on its first call, in the warm-up),
        as flex's BlockMask is."""
        fgt, hook, aux = self._flashgen_parts(row, x)
        built: list[Any] = []

        def run(q: Any, k: Any, v: Any) -> Any:
            if not built:
                built.append(fgt.block_map(q, k, v, mask_mod=hook, aux=aux))
            return fgt.attention(q, k, v, causal=False, mask_mod=hook, aux=aux,
                                 block_map=built[0])  # fmt: skip

        return Impl(run, "bhtd", row.name)

    def _builtin(self, row: Row, x: dict[str, Any]) -> Impl:
        import flashgen.torch as fgt

        if row.name == "prefix_lm":
            return Impl(lambda q, k, v: fgt.attention(q, k, v, causal=True), "bhtd", "causal")
        from flashgen.varlen import flash_attn_varlen_func

        torch = self.torch
        lens = list(x["lengths"]) * row.b
        cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=self.dev)
        longest = max(lens)

        def run(q: Any, k: Any, v: Any) -> Any:  # (B, T, H, d) contiguous -> packed views
            n = row.b * row.t
            qp, kp, vp = (y.reshape(n, row.h, row.d) for y in (q, k, v))
            o = flash_attn_varlen_func(qp, kp, vp, cu, cu, longest, longest)
            return o.view(row.b, row.t, row.h, row.d)

        return Impl(run, "bthd", "document")

    def _flex_parts(self, row: Row, x: dict[str, Any]) -> tuple[Any, Any]:
        """(compiled flex_attention, the row's BlockMask), built once per row."""
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        except Exception as exc:  # noqa: BLE001
            raise Unavailable(f"FlexAttention does not import: {exc}") from None
        if "block_mask" not in x:
            x["block_mask"] = create_block_mask(
                flex_mask(row.name, x["ids"], self.args.prefix), None, None, row.t, row.t,
                device=self.dev, BLOCK_SIZE=BLOCK,
            )  # fmt: skip
        if self._flex_fn is None:
            dyn = self.torch._dynamo.config  # one compiled entry per shape, mask and grad mode
            for knob in ("cache_size_limit", "recompile_limit"):
                if hasattr(dyn, knob):
                    setattr(dyn, knob, max(getattr(dyn, knob), 256))
            self._flex_fn = self.torch.compile(flex_attention, dynamic=False)
        return self._flex_fn, x["block_mask"]

    def _flex(self, row: Row, x: dict[str, Any]) -> Impl:
        flex, bm = self._flex_parts(row, x)
        return Impl(lambda q, k, v: flex(q, k, v, block_mask=bm), "bhtd", row.name, copy=True)

    def _fa4(self, row: Row, x: dict[str, Any], blocks: bool = False) -> Impl:
        try:
            from flash_attn.cute.interface import flash_attn_func
        except Exception as exc:  # noqa: BLE001
            raise Unavailable(f"FA4 (flash_attn.cute) does not import: {exc}") from None
        major = self.torch.cuda.get_device_capability()[0]
        if major != 9:
            raise Unavailable(f"FA4's sm90 path: this GPU is sm_{major}x")
        mod = fa4_mask_mod(row.name, self.args.prefix)
        kw: dict[str, Any] = {"mask_mod": mod}
        if row.name == "document":
            kw["aux_tensors"] = [x["ids"]]
        if blocks:
            from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch

            _, bm = self._flex_parts(row, x)
            kw["block_sparse_tensors"] = BlockSparseTensorsTorch(
                mask_block_cnt=bm.kv_num_blocks, mask_block_idx=bm.kv_indices,
                full_block_cnt=bm.full_kv_num_blocks, full_block_idx=bm.full_kv_indices,
                block_size=(BLOCK, BLOCK),
            )  # fmt: skip
            kw["block_sparse_tensors_bwd"] = BlockSparseTensorsTorch(
                mask_block_cnt=bm.q_num_blocks, mask_block_idx=bm.q_indices,
                full_block_cnt=bm.full_q_num_blocks, full_block_idx=bm.full_q_indices,
                block_size=(BLOCK, BLOCK),
            )  # fmt: skip

        def run(q: Any, k: Any, v: Any) -> Any:
            out = flash_attn_func(q, k, v, causal=False, **kw)
            return out[0] if isinstance(out, tuple) else out

        return Impl(run, "bthd", row.name)

    def _fa4_blocks(self, row: Row, x: dict[str, Any]) -> Impl:
        return self._fa4(row, x, blocks=True)

    def _hook_cost_impls(self, row: Row, x: dict[str, Any]) -> dict[str, Impl | str]:
        try:
            import flashgen.torch as fgt
            from flashgen.generator.hooks import library
        except Exception as exc:  # noqa: BLE001
            reason = f"flashgen.torch does not import: {exc}"
            return {"builtin": reason, "hooked": reason}
        slopes = x["slopes"]
        causal = row.name.endswith("-causal") or row.name in ("window-mask", "window+hook")
        win_aux = {"window_left": WINDOW[0], "window_right": WINDOW[1]}
        mask = row_mask(row)
        builtin_kw: dict[str, Any]
        hooked_kw: dict[str, Any]
        score: Callable[[Any, int], Any] | None = None
        if row.name.startswith("softcap"):
            builtin_kw = {"causal": causal, "softcap": SOFTCAP}
            hooked_kw = {"causal": causal, "score_mod": library.softcap_hook(),
                         "aux": {"softcap": SOFTCAP}}  # fmt: skip
            score = softcap_score(self.torch)
        elif row.name.startswith("alibi"):
            builtin_kw = {"causal": causal, "alibi_slopes": slopes}
            hooked_kw = {"causal": causal, "score_mod": library.alibi_hook(),
                         "aux": {"alibi_slopes": slopes}}  # fmt: skip
            score = alibi_score(self.torch, slopes, row.t)
        elif row.name == "causal-mask":
            builtin_kw = {"causal": True}
            hooked_kw = {"causal": False, "mask_mod": library.causal_hook(), "aux": {}}
        elif row.name == "causal+hook":
            builtin_kw = {"causal": True}
            hooked_kw = {"causal": True, "mask_mod": library.causal_hook(), "aux": {}}
        elif row.name == "window-mask":
            builtin_kw = {"causal": True, "window": WINDOW}
            hooked_kw = {"causal": True, "mask_mod": library.window_hook(), "aux": win_aux}
        else:  # window+hook
            builtin_kw = {"causal": True, "window": WINDOW}
            hooked_kw = {"causal": True, "window": WINDOW, "mask_mod": library.window_hook(),
                         "aux": win_aux}  # fmt: skip

        def runner(kw: dict[str, Any]) -> Callable[[Any, Any, Any], Any]:
            return lambda q, k, v: fgt.attention(q, k, v, **kw)

        return {
            "builtin": Impl(runner(builtin_kw), "bhtd", mask, score),
            "hooked": Impl(runner(hooked_kw), "bhtd", mask, score),
        }

    # -- calls
    def callables(self, impl: Impl, x: dict[str, Any], mode: str) -> Calls:
        """The timed calls of a mode on inputs made once, outside the timings: q, k, v in the
        implementation's layout ((B, H, T, d) views of the (B, T, H, d) tensors for flashgen,
        its documented layout; contiguous copies where `impl.copy`); for fwd+bwd, leaves that
        require grad and a dO laid out as the implementation's O (one forward finds it)."""
        torch = self.torch
        base = [x[n].detach() for n in ("q", "k", "v")]
        if impl.layout == "bhtd":
            base = [y.transpose(1, 2) for y in base]
        if impl.copy:
            base = [y.contiguous() for y in base]
        if mode == "fwd":
            q, k, v = base

            def fwd() -> Any:
                with torch.no_grad():
                    return impl.run(q, k, v)

            return Calls({"fwd": fwd}, (q, k, v), None)
        q, k, v = (y.detach().requires_grad_() for y in base)
        o = impl.run(q, k, v).detach()  # the training forward's O: dO gets its strides
        want = x["do"].transpose(1, 2) if impl.layout == "bhtd" else x["do"]
        do = torch.empty_strided(o.shape, o.stride(), dtype=o.dtype, device=o.device)
        do.copy_(want)
        del o

        def train() -> Any:
            return impl.run(q, k, v)

        def step() -> Any:
            return torch.autograd.grad(impl.run(q, k, v), (q, k, v), do)

        return Calls({"fwd": train, "step": step}, (q, k, v), do)

    def to_bthd(self, impl: Impl, y: Any) -> Any:
        return y.transpose(1, 2) if impl.layout == "bhtd" else y

    def check(self, row: Row, impl: Impl, x: dict[str, Any], calls: Calls) -> dict[str, Any]:
        """Errors against the float64 reference on two (batch, head) slices; `ok` says whether
        every tensor is within the bound (module docstring)."""
        torch = self.torch
        grads = row.mode != "fwd"
        if grads:
            q, k, v = calls.qkv
            o = impl.run(q, k, v)
            dq, dk, dv = torch.autograd.grad(o, (q, k, v), calls.do)
            got = [self.to_bthd(impl, y.detach()) for y in (o, dq, dk, dv)]
        else:
            got = [self.to_bthd(impl, calls.fns["fwd"]())]
        torch.cuda.synchronize()
        names = ["o", "dq", "dk", "dv"][: len(got)]
        keep = _dense_mask(torch, impl.mask, row.t, x["ids"], self.args.prefix, self.dev)
        worst: dict[str, dict[str, float]] = {}
        ok = True
        for b, h in sorted({(0, 0), (row.b - 1, row.h - 1)}):
            qs, ks, vs, dos = (x[n][b, :, h] for n in ("q", "k", "v", "do"))
            fn = impl.score
            score = None if fn is None else (lambda s, fn=fn, h=h: fn(s, h))
            r64 = _slice_reference(torch, qs, ks, vs, dos, keep, score, torch.float64, grads)
            rlp = _slice_reference(torch, qs, ks, vs, dos, keep, score, torch.bfloat16, grads)
            for n, y, a, c in zip(names, got, r64, rlp, strict=True):
                err = float((y[b, :, h].double() - a).abs().max())
                base = float((c - a).abs().max())
                bound = CHECK_SLACK * base + CHECK_ATOL * float(a.abs().max())
                ok &= err <= bound and math.isfinite(err)
                w = worst.setdefault(n, {"err": 0.0, "bf16_ref_err": 0.0, "bound": math.inf})
                if err - bound > w["err"] - w["bound"]:
                    w.update(err=err, bf16_ref_err=base, bound=bound)
            del r64, rlp
        del keep, got
        return {"ok": ok, "slices": [[0, 0], [row.b - 1, row.h - 1]], **worst}

    def time(self, fn: Callable[[], Any]) -> tuple[float, str]:
        """Milliseconds of one call, and how it was timed."""
        from flashgen.perf.bench import time_ms

        if self.args.timing == "graph":
            try:
                here = str(Path(__file__).resolve().parent)
                if here not in sys.path:
                    sys.path.insert(0, here)
                from graph_timing import timed

                return timed(fn, reps=self.args.reps) / 1000.0, "graph"
            except Exception:  # noqa: BLE001 - not capturable: the protocol's events
                self.torch.cuda.synchronize()
        ms = time_ms(fn, warmup=2, reps=self.args.reps, warmup_s=self.args.warmup_s)
        return ms, "events"


def softcap_score(torch: Any) -> Callable[[Any, int], Any]:
    """The reference's softcap: cap * tanh(s / cap)."""

    def score(s: Any, h: int) -> Any:
        return SOFTCAP * torch.tanh(s / SOFTCAP)

    return score


def alibi_score(torch: Any, slopes: Any, t: int) -> Callable[[Any, int], Any]:
    """The reference's ALiBi for query head h: s - slope[h] * |i - j| (Tq = Tk)."""
    i = torch.arange(t, device=slopes.device)
    dist = (i[:, None] - i[None, :]).abs().float()

    def score(s: Any, h: int) -> Any:
        return s - float(slopes[h]) * dist.to(s.dtype)

    return score


def flex_mask(name: str, ids: Any, prefix: int) -> Callable[..., Any]:
    """This script's FlexAttention mask_mod for a mask row (document ids a captured tensor)."""
    if name == "document":

        def same_document(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            return ids[q_idx] == ids[kv_idx]

        return same_document

    def prefix_or_causal(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return (kv_idx < prefix) | (kv_idx <= q_idx)

    return prefix_or_causal


def fa4_mask_mod(name: str, prefix: int) -> Any:
    """This script's FA4 (CuTe DSL) mask_mod for a mask row: called on TensorSSA indices of
    shape (1,); the document ids come as aux tensor 0."""
    import cutlass
    import cutlass.cute as cute
    from flash_attn.cute import utils as fa_utils

    if name == "document":

        @cute.jit
        def same_document(batch, head, q_idx, kv_idx, seqlen_info, aux_tensors):  # type: ignore[no-untyped-def]
            ids = aux_tensors[0]
            mine = fa_utils.scalar_to_ssa(ids[q_idx[0]], cutlass.Int32)
            theirs = fa_utils.scalar_to_ssa(ids[kv_idx[0]], cutlass.Int32)
            return mine == theirs

        return same_document

    @cute.jit
    def prefix_or_causal(batch, head, q_idx, kv_idx, seqlen_info, aux_tensors):  # type: ignore[no-untyped-def]
        edge = fa_utils.scalar_to_ssa(prefix, cutlass.Int32)
        return (kv_idx < edge) | (kv_idx <= q_idx)

    return prefix_or_causal


def prebuild(torch: Any, rows: Sequence[Row], args: argparse.Namespace) -> str:
    """Compile flashgen's hooked variants (family mma, forward and backward) in parallel before
    the rows need them; best effort (a miss compiles on first call). Returns a summary line."""
    try:
        from flashgen.generator.features.hook import token_of
        from flashgen.generator.hooks import library
        from flashgen.generator.spec import KernelSpec
        from flashgen.hooked import _forward_spec
        from flashgen.runtime.validate import check_layout
        from flashgen.verify.checks import compile_all
    except Exception as exc:  # noqa: BLE001
        return f"prebuild skipped: {type(exc).__name__}: {exc}"
    hooks = {
        "document": library.document_hook(), "prefix_lm": library.prefix_lm_hook(),
        "softcap": library.softcap_hook(), "softcap-causal": library.softcap_hook(),
        "alibi": library.alibi_hook(), "alibi-causal": library.alibi_hook(),
        "causal-mask": library.causal_hook(), "causal+hook": library.causal_hook(),
        "window-mask": library.window_hook(),
    }  # fmt: skip
    specs = []
    for row in rows:
        hook = hooks.get(row.name)
        if hook is None or (row.kind == "mask" and "flashgen" not in args.impls):
            continue
        causal = row.kind == "hook_cost" and row.name not in ("softcap", "alibi", "causal-mask")
        q = torch.empty(1, 128, row.h, row.d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        try:
            spec = _forward_spec(check_layout(q, q, q), causal, 0, (token_of(hook),))
            specs.append(spec)
            if row.mode != "fwd":
                specs.append(KernelSpec(family="mma", d=row.d, dtype="bf16", causal=causal,
                                        direction="bwd", features=(token_of(hook),)))  # fmt: skip
        except Exception as exc:  # noqa: BLE001
            return f"prebuild skipped: {type(exc).__name__}: {exc}"
    unique = list(dict.fromkeys(specs))
    t0 = time.perf_counter()
    built = compile_all(unique)
    bad = [s.name for s, e in built.items() if isinstance(e, Exception)]
    return (f"prebuilt {len(unique) - len(bad)}/{len(unique)} hooked variants in "
            f"{time.perf_counter() - t0:.0f} s" + (f"; failed: {bad}" if bad else ""))  # fmt: skip


def document(args: argparse.Namespace, env: dict[str, Any], records: list[dict[str, Any]],
             t0: float, complete: bool, notes: list[str]) -> dict[str, Any]:  # fmt: skip
    """The JSON document."""
    return {
        "schema": SCHEMA, "env": env, "config": {k: v for k, v in vars(args).items()},
        "protocol": protocol(args), "notes": notes, "rows": records, "complete": complete,
        "elapsed_s": round(time.perf_counter() - t0, 1),
    }  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """The whole benchmark on the GPU; returns the exit status (1 when an implementation was
    wrong)."""
    torch = require_cuda()
    t0 = time.perf_counter()
    out = Path(args.out)
    try:
        from flashgen.perf.bench import environment

        env = environment()
    except Exception as exc:  # noqa: BLE001
        env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "error": str(exc)}  # fmt: skip
    env["date"] = env.get("date") or _dt.datetime.now(_dt.timezone.utc).isoformat()
    rows = planned_rows(args)
    notes: list[str] = []
    bench = Bench(torch, args)
    state: dict[Row, dict[str, Any]] = {}
    results: dict[Row, dict[str, ImplResult]] = {}

    def save(complete: bool = False) -> list[dict[str, Any]]:
        recs = [row_record(r, results[r]) for r in rows if r in results]
        write_json(out, document(args, env, recs, t0, complete, notes))
        return recs

    if not args.no_prebuild:
        notes.append(prebuild(torch, rows, args))
        print(notes[-1], flush=True)
    wrong = False
    for row in rows:  # set up: inputs, implementations, warm-up (compiles), check
        res: dict[str, ImplResult] = {}
        results[row] = res
        if time.perf_counter() - t0 > SETUP_SHARE * args.budget_s:
            res["*"] = ImplResult(status="skipped", reason="time budget (not set up)")
            continue
        x = bench.inputs(row)
        calls: dict[str, Calls] = {}
        for name, impl in bench.impls(row, x).items():
            r = res[name] = ImplResult()
            if isinstance(impl, str):
                r.status, r.reason = "skipped", impl
                print(f"{row.key:32s} {name}: skipped: {impl}", flush=True)
                continue
            r.mask = impl.mask
            r.kept_pairs = kept_pairs(impl.mask, row.t, lengths=x["lengths"],
                                      prefix=args.prefix)  # fmt: skip
            try:
                c = bench.callables(impl, x, row.mode)
                for m in metrics(row.mode):  # warm-up: compiles, JITs, loads
                    c.fns[m]()
                    c.fns[m]()
                torch.cuda.synchronize()
                r.check = bench.check(row, impl, x, c)
            except Exception as exc:  # noqa: BLE001 - reported in its row
                r.status = "failed"
                r.reason = f"{type(exc).__name__}: {exc}"[:500]
                notes.append(f"{row.key} {name}: " + traceback.format_exc()[-1500:])
                print(f"{row.key:32s} {name}: FAILED: {r.reason}", flush=True)
                torch.cuda.synchronize()
                continue
            if not r.check["ok"]:
                r.status, r.reason, wrong = "wrong", "correctness check failed: not timed", True
                print(f"{row.key:32s} {name}: WRONG {json.dumps(r.check)}", flush=True)
                continue
            r.status = "ok"
            calls[name] = c
        state[row] = {"x": x, "calls": calls}
        print(f"{row.key:32s} set up ({time.perf_counter() - t0:.0f} s)", flush=True)
        save()
    for rnd in range(args.rounds):  # timings: rounds over every row, impls rotated
        if time.perf_counter() - t0 > args.budget_s:
            notes.append(f"time budget: stopped after {rnd} round(s)")  # rnd: rounds done
            break
        for row in rows:
            if row not in state:
                continue
            if time.perf_counter() - t0 > args.budget_s:
                notes.append(f"time budget: round {rnd} stopped before {row.key}")
                break
            calls = state[row]["calls"]
            names = list(calls)
            shift = rnd % len(names) if names else 0
            for name in names[shift:] + names[:shift]:
                r = results[row][name]
                try:
                    for m in metrics(row.mode):
                        ms, how = bench.time(calls[name].fns[m])
                        r.samples.setdefault(m, []).append(ms)
                        r.timing = how
                except Exception as exc:  # noqa: BLE001
                    r.status, r.reason = "failed", f"timing: {type(exc).__name__}: {exc}"[:500]
                    del calls[name]
        print(f"round {rnd} done ({time.perf_counter() - t0:.0f} s)", flush=True)
        save()
    untimed = [r.key for r in rows if r not in state]
    if untimed:
        notes.append(f"not set up (time budget): {untimed}")
    records = save(complete=not any("time budget" in n for n in notes))
    print(f"\nhooks_bench: bf16, TFLOP/s (bwd for fwd+bwd rows); bars: {BARS}")
    print(table(records))
    print(f"wrote {out}")
    if wrong:
        print("hooks_bench: an implementation was WRONG (see the rows above)", file=sys.stderr)
    return 1 if wrong else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, then run on the GPU; one line and status 2 when torch or CUDA is missing."""
    args = parse_args(argv)
    try:
        return run(args)
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
