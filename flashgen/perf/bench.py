"""`flashgen bench`: time flashgen variants and torch SDPA peers on one GPU (the protocol in
docs/design.md).

Protocol: bf16 and fp16; d 64 and 128; H*d = 2048; B*T = 16384 tokens; T 512 ... 16384;
causal and not. FLOPs = 4*B*H*Tq*Tk*d, halved for causal. Each time is the median of
CUDA-event timings after warm-up, on random normal inputs. Peers (torch SDPA's FLASH, CUDNN
and EFFICIENT backends) run in the same process when torch is importable. torch allocates
every tensor; flashgen's kernels read them in place, launched on torch's current stream.

Host overhead (`host_overhead`): median wall time of one call, from the caller's side, for
flashgen.torch.attention, torch SDPA (its default backend choice) on the same tensors, and
flashgen.attention on GPUArrays and on NumPy arrays, on small problems (decode-like T = 1,
T = 128, T = 1024), causal and not.

Backward rows (`bench_backward_case`, direction "bwd"): the backward alone of flashgen.torch
(autograd; an mma backward kernel), SDPA's FLASH (FA2) and CUDNN backends, and FA4 when
importable. Each implementation's forward runs once on requires_grad inputs, then
`torch.autograd.grad(o, (q, k, v), do, retain_graph=True)` is timed like the forward (median
of CUDA events). FLOPs = 2.5 x the forward's. Only fp16/bf16 with d <= 128 (the backward's
range, no features); other cases have no backward rows.

Feature rows (GQA, sliding window) are `bench_features`'s; serving rows (decode GB/s, varlen
prefill TFLOP/s; `BenchResult.serving`) are `bench_serving`'s.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from flashgen._version import __version__
from flashgen.generator.features import NO_FEATURES, FeatureArgs
from flashgen.generator.spec import KernelSpec

TOKENS = 16384  # B * T
MODEL_DIM = 2048  # H * d
SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)  # the protocol's default
HEAD_DIM_STEP, HEAD_DIM_MAX = 8, 256  # `--d` takes any multiple of 8 up to 256 (H = MODEL_DIM // d)
DTYPES = ("bf16", "fp16")
PEERS = ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient")
# Peers timed only when their package imports: FlashAttention-4's Hopper path (flash-attn-4,
# CuTe DSL; ../shared/gpu-host/README.md says how to bring it to a GPU host).
OPTIONAL_PEERS = ("fa4",)
# The backward's peers (FA4 joins when it imports) and its range: fp16/bf16, d <= 128.
BWD_PEERS = ("sdpa-flash", "sdpa-cudnn")
BWD_DTYPES = ("bf16", "fp16")
BWD_MAX_D = 128
BWD_FLOPS_FACTOR = 2.5  # backward FLOPs over the forward's (docs/design.md)
DIRECTIONS = ("fwd", "bwd")


def fa4_available() -> bool:
    """Whether FlashAttention-4 (`flash_attn.cute`) imports here."""
    try:
        from flash_attn.cute.interface import flash_attn_func  # noqa: F401
    except Exception:  # not installed, or a broken install: then it is simply not a peer
        return False
    return True


def available_peers() -> tuple[str, ...]:
    """The peers this machine can time: torch SDPA's backends, plus FA4 when importable."""
    return PEERS + (("fa4",) if fa4_available() else ())


def available_bwd_peers() -> tuple[str, ...]:
    """The backward peers this machine can time: SDPA's FA2 and cuDNN, FA4 when importable."""
    return BWD_PEERS + (("fa4",) if fa4_available() else ())


WARMUP = 5
REPS = 30
# Seconds of back-to-back calls before the timed reps. The H200 holds its board power at the
# 700 W cap by lowering the SM clock under sustained load (1.6-1.8 GHz here, 1.98 GHz at most);
# 30 reps of a 0.4 ms kernel take 12 ms, so without this a timing right after an idle gap or a
# lighter kernel catches a boost clock that the next implementation in the row does not get
# (FA4, d = 128, causal, T = 16384: 721 TFLOP/s in a bench, 632 sustained; bench/NOTES.md).
WARMUP_S = 1.0


def error_text(exc: BaseException) -> str:
    """A failed measurement's record: the exception's type and message, at most 300
    characters."""
    return f"{type(exc).__name__}: {exc}"[:300]


class BenchUnavailable(RuntimeError):
    """torch with CUDA (needed to allocate and time) or a GPU is missing."""


@dataclass(frozen=True)
class Case:
    """One benchmark problem."""

    dtype: str
    d: int
    causal: bool
    t: int

    @property
    def b(self) -> int:
        """Batch so that B*T = TOKENS."""
        return max(1, TOKENS // self.t)

    @property
    def h(self) -> int:
        """Heads so that H*d = MODEL_DIM."""
        return MODEL_DIM // self.d

    @property
    def flops(self) -> float:
        """Forward FLOPs: 4*B*H*T*T*d, halved under a causal mask."""
        f = 4.0 * self.b * self.h * self.t * self.t * self.d
        return f / 2 if self.causal else f

    @property
    def bwd_flops(self) -> float:
        """Backward FLOPs: 2.5 x the forward's (so halved under a causal mask too)."""
        return BWD_FLOPS_FACTOR * self.flops


def head_dim_error(d: int) -> str | None:
    """Why `--d d` cannot be benched (a one-line rule and fix), or None when it can."""
    if d % HEAD_DIM_STEP or not HEAD_DIM_STEP <= d <= HEAD_DIM_MAX:
        return (f"--d {d}: head dims are multiples of {HEAD_DIM_STEP} from {HEAD_DIM_STEP} to "
                f"{HEAD_DIM_MAX}; e.g. --d 96")  # fmt: skip
    return None


def backward_supported(case: Case) -> bool:
    """Whether `case` gets backward rows: fp16/bf16 and d <= 128 (the mma backward's range)."""
    return case.dtype in BWD_DTYPES and case.d <= BWD_MAX_D


@dataclass
class Row:
    """One timed (case, implementation)."""

    impl: str  # "flashgen" or a peer name
    variant: str | None  # flashgen kernel name
    dtype: str
    d: int
    causal: bool
    t: int
    b: int
    h: int
    ms: float | None
    tflops: float | None
    max_err_vs_flash: float | None = None  # flashgen only: max |O - sdpa-flash O|
    error: str | None = None
    feature: str | None = None  # a feature row (bench_features): "gqa 32/8", "window 4096,0"
    direction: str = "fwd"  # "fwd", or "bwd" (bench_backward_case: the backward alone)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Row:
        """A row from its JSON object; files written before backward rows have no
        `direction` (forward). Unknown keys are ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class BenchResult:
    """A whole run: environment plus rows."""

    env: dict[str, Any]
    rows: list[Row] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)
    overhead: list[OverheadRow] = field(default_factory=list)
    # the serving rows (bench_serving): decode and varlen dicts, each with its `kind`
    serving: list[dict[str, Any]] = field(default_factory=list)
    # the training-step rows (bench_training): dicts of `kind` "training"
    training: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> str:
        """The run as indented JSON."""
        data: dict[str, Any] = {
            "env": self.env, "rows": [asdict(r) for r in self.rows], "memory": self.memory,
        }  # fmt: skip
        if self.overhead:
            data["overhead"] = [asdict(r) for r in self.overhead]
        if self.serving:
            data["serving"] = self.serving
        if self.training:
            data["training"] = self.training
        return json.dumps(data, indent=1)

    @classmethod
    def from_json(cls, text: str) -> BenchResult:
        """A run back from `to_json`'s text (or an older file: rows without `direction`
        are forward rows; no `serving`, `training` or `overhead`, none of those rows)."""
        data = json.loads(text)
        names = {f.name for f in fields(OverheadRow)}
        return cls(
            env=data.get("env", {}),
            rows=[Row.from_dict(r) for r in data.get("rows", [])],
            memory=data.get("memory", {}),
            overhead=[
                OverheadRow(**{k: v for k, v in o.items() if k in names})
                for o in data.get("overhead", [])
            ],
            serving=list(data.get("serving", [])),
            training=list(data.get("training", [])),
        )


def cases(
    dtypes: Iterable[str] = DTYPES,
    head_dims: Iterable[int] = HEAD_DIMS,
    seq_lens: Iterable[int] = SEQ_LENS,
    causal: Iterable[bool] = (False, True),
) -> list[Case]:
    """The protocol's problems (or a subset)."""
    return [Case(dt, d, c, t) for dt in dtypes for d in head_dims for c in causal for t in seq_lens]


# storage dtype -> torch's name for it (`torch_dtype`)
TORCH_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def torch_dtype(name: str) -> Any:
    """torch's dtype for storage dtype `name` ("bf16", "fp16", "fp32")."""
    return getattr(_torch(), TORCH_NAMES[name])


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise BenchUnavailable(
            f"torch is not importable ({exc}); bench needs torch with CUDA"
        ) from exc
    if not torch.cuda.is_available():
        raise BenchUnavailable("torch sees no CUDA device; run bench on a GPU machine")
    return torch


def time_ms(
    fn: Callable[[], Any],
    warmup: int = WARMUP,
    reps: int = REPS,
    *,
    sync_each: bool = False,
    warmup_s: float | None = None,
) -> float:
    """Median milliseconds of `fn` over `reps` CUDA-event-timed calls after `warmup` calls and
    then at least `warmup_s` seconds (None: this module's WARMUP_S, which `flashgen bench
    --warmup-s` sets) of back-to-back calls (the clock settles under the power cap).

    The reps run back to back (the protocol); `sync_each` waits for every rep before the next
    (the dev scripts' loop, kept to compare the two)."""
    torch = _torch()
    if warmup_s is None:
        warmup_s = WARMUP_S
    t0 = time.perf_counter()
    calls = max(warmup, 1) if warmup_s > 0 else warmup  # at least one, to size the batches below
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    if warmup_s > 0:
        # batches of ~20 ms between host checks, so the GPU never idles while we look at the time
        per_call = max((time.perf_counter() - t0) / calls, 1e-6)
        batch = min(1000, max(1, int(0.02 / per_call)))
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < warmup_s:
            for _ in range(batch):
                fn()
            torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends, strict=True):
        s.record()
        fn()
        e.record()
        if sync_each:
            e.synchronize()
    torch.cuda.synchronize()
    return float(statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)))


def _inputs(case: Case, seed: int = 0) -> tuple[Any, Any, Any]:
    torch = _torch()
    dt = torch_dtype(case.dtype)
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = (case.b, case.h, case.t, case.d)
    return tuple(  # type: ignore[return-value]
        torch.randn(shape, device="cuda", dtype=dt, generator=g) for _ in range(3)
    )


def flashgen_runner(
    spec: KernelSpec, q: Any, k: Any, v: Any, features: FeatureArgs = NO_FEATURES
) -> tuple[Callable[[], None], Any]:
    """A closure launching `spec` on torch tensors (validated once, bound once, with the
    call's feature values) on torch's current stream, and its output tensor."""
    torch = _torch()
    from flashgen.generator.numerics import LOG2E
    from flashgen.runtime import gpu as runtime
    from flashgen.runtime.validate import check_scale, validate_inputs

    o = q.new_empty((*q.shape[:3], v.shape[3]))  # q's rows, v's head dim
    lse = torch.empty(q.shape[:3], device="cuda", dtype=torch.float32)
    problem = validate_inputs(spec, q, k, v, o=o, lse=lse)
    scale = check_scale(None, spec.d)
    bound = runtime.get_function(spec).bind(problem, scale * LOG2E, features)
    ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr())
    stream = int(torch.cuda.current_stream().cuda_stream)

    def run() -> None:
        bound(*ptrs, stream)

    return run, o


def _sdpa_backend(peer: str) -> Any:
    """The torch SDPBackend a `sdpa-*` peer forces."""
    from torch.nn.attention import SDPBackend

    return {
        "sdpa-flash": SDPBackend.FLASH_ATTENTION,
        "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
        "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
    }[peer]


def peer_runner(peer: str, q: Any, k: Any, v: Any, causal: bool) -> Callable[[], Any]:
    """A closure running torch SDPA with one backend forced, or FA4 (`fa4`)."""
    torch = _torch()
    if peer == "fa4":
        from flash_attn.cute.interface import flash_attn_func

        # FA4 takes (B, T, H, d): copied once here, outside the timed call
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))

        def run_fa4() -> Any:
            out = flash_attn_func(qt, kt, vt, causal=causal)
            out = out[0] if isinstance(out, tuple) else out
            return out.transpose(1, 2)

        return run_fa4
    from torch.nn.attention import sdpa_kernel

    backend = _sdpa_backend(peer)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def run() -> Any:
        with sdpa_kernel([backend]):
            return sdpa(q, k, v, is_causal=causal)

    return run


def _row(impl: str, variant: str | None, case: Case, ms: float | None, **extra: Any) -> Row:
    flops = case.bwd_flops if extra.get("direction") == "bwd" else case.flops
    tflops = flops / (ms * 1e-3) / 1e12 if ms else None
    return Row(
        impl, variant, case.dtype, case.d, case.causal, case.t, case.b, case.h, ms, tflops, **extra
    )


def bench_case(
    case: Case, specs: list[KernelSpec], peers: Iterable[str] | None = None, reps: int = REPS
) -> list[Row]:
    """Time every spec in `specs` and every peer on one case; flashgen rows carry their error."""
    torch = _torch()
    q, k, v = _inputs(case)
    rows: list[Row] = []
    ref = None
    for peer in available_peers() if peers is None else peers:
        try:
            fn = peer_runner(peer, q, k, v, case.causal)
            out = fn()
            if peer == "sdpa-flash":
                ref = out
            rows.append(_row(peer, None, case, time_ms(fn, reps=reps)))
        except Exception as exc:  # a backend that refuses this shape is a row, not a crash
            rows.append(_row(peer, None, case, None, error=f"{type(exc).__name__}: {exc}"[:200]))
    for spec in specs:
        try:
            fn, o = flashgen_runner(spec, q, k, v)
            fn()
            torch.cuda.synchronize()
            err = float((o.float() - ref.float()).abs().max()) if ref is not None else None
            rows.append(
                _row("flashgen", spec.name, case, time_ms(fn, reps=reps), max_err_vs_flash=err)
            )
        except Exception as exc:
            rows.append(
                _row("flashgen", spec.name, case, None, error=f"{type(exc).__name__}: {exc}"[:300])
            )
    del q, k, v, ref
    return rows


def backward_forward(impl: str, q: Any, k: Any, v: Any, causal: bool) -> tuple[Any, Any]:
    """One differentiable forward of `impl` on (B, H, T, d) tensors: (O, the leaves to
    differentiate). FA4 takes (B, T, H, d): its leaves are copies in that layout, O stays in
    it (the caller's dO must match O's shape)."""
    torch = _torch()
    if impl == "flashgen":
        from flashgen import torch as fg_torch

        return fg_torch.attention(q, k, v, causal=causal), (q, k, v)
    if impl == "fa4":
        from flash_attn.cute.interface import flash_attn_func

        leaves = tuple(x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
        out = flash_attn_func(*leaves, causal=causal)
        return (out[0] if isinstance(out, tuple) else out), leaves
    from torch.nn.attention import sdpa_kernel

    backend = _sdpa_backend(impl)
    with sdpa_kernel([backend]):
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return o, (q, k, v)


def _bwd_variant(case: Case, q: Any, k: Any, v: Any) -> str | None:
    """The name of the backward kernel flashgen.torch runs for `case` on these inputs (its
    family as the op chooses it: wgmma on sm_90 where it fits, else mma)."""
    try:
        from flashgen import torch as fg_torch
        from flashgen.runtime.validate import check_layout

        dev = q.get_device()
        family = fg_torch._bwd_family(dev, check_layout(q, k, v), False, (q, k, v))
        return fg_torch._bwd_plan(dev, case.d, case.dtype, case.causal, False, family)[0].name
    except Exception:  # the name is a label: never worth failing the row over
        return None


def bench_backward_case(
    case: Case, peers: Iterable[str] | None = None, reps: int = REPS
) -> list[Row]:
    """Backward rows of one case: flashgen.torch's backward and each peer's (default
    `available_bwd_peers()`), timed alone -- one forward on requires_grad inputs, then
    `torch.autograd.grad(o, (q, k, v), do, retain_graph=True)` timed (median of CUDA events);
    FLOPs 2.5 x the forward's. No rows for cases outside the backward's range (fp32, d > 128).
    A backend that fails is a row with ms=None and its error; flashgen's row carries the max
    |dQ, dK, dV - FA2's| when FA2 ran."""
    if not backward_supported(case):
        return []
    torch = _torch()
    q, k, v = (x.requires_grad_() for x in _inputs(case))
    g = torch.Generator(device=q.device).manual_seed(1)
    do = torch.randn(q.shape, device=q.device, dtype=q.dtype, generator=g)
    rows: list[Row] = []
    ref: tuple[Any, ...] | None = None
    impls = [*(available_bwd_peers() if peers is None else peers), "flashgen"]
    for impl in impls:
        variant = _bwd_variant(case, q, k, v) if impl == "flashgen" else None
        o: Any = None
        fn: Callable[[], Any] | None = None
        try:
            o, leaves = backward_forward(impl, q, k, v, case.causal)
            grad_o = do.transpose(1, 2).contiguous() if impl == "fa4" else do

            def fn(o: Any = o, leaves: Any = leaves, grad_o: Any = grad_o) -> Any:
                return torch.autograd.grad(o, leaves, grad_o, retain_graph=True)

            grads = fn()
            if impl == "fa4":
                grads = tuple(x.transpose(1, 2) for x in grads)
            extra: dict[str, Any] = {}
            if impl == "sdpa-flash":
                ref = grads
            elif impl == "flashgen" and ref is not None:
                pairs = zip(grads, ref, strict=True)
                extra["max_err_vs_flash"] = max(
                    float((a.float() - b.float()).abs().max()) for a, b in pairs
                )
            del grads
            ms = time_ms(fn, reps=reps)
            rows.append(_row(impl, variant, case, ms, direction="bwd", **extra))
        except Exception as exc:  # a backend this build lacks, or a shape it refuses
            error = f"{type(exc).__name__}: {exc}"[:300]
            rows.append(_row(impl, variant, case, None, direction="bwd", error=error))
        finally:
            del o, fn  # the graph and its saved tensors go before the next implementation
    del q, k, v, do, ref
    return rows


def memory_comparison(spec: KernelSpec, t: int = 8192, d: int = 64, h: int = 16) -> dict[str, Any]:
    """Extra peak device memory beyond Q, K, V (B=1, H=16, T=8192, causal): ours, FA2, naive."""
    torch = _torch()
    case = Case(spec.dtype, d, True, t)
    shape = (1, h, t, d)
    dt = torch_dtype(spec.dtype)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dt) for _ in range(3))
    out: dict[str, Any] = {"B": 1, "H": h, "T": t, "d": d, "causal": True, "dtype": spec.dtype}

    def extra(fn: Callable[[], Any]) -> float:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        res = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        del res
        return float(peak) / 2**20

    def naive() -> Any:
        s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
        mask = torch.ones(t, t, device="cuda", dtype=torch.bool).tril()
        s = s.masked_fill(~mask, float("-inf"))
        return torch.softmax(s.float(), dim=-1).to(dt) @ v

    def ours() -> Any:
        fn, o = flashgen_runner(spec, q, k, v)
        fn()
        return o

    out["naive_mib"] = extra(naive)
    out["sdpa_flash_mib"] = extra(peer_runner("sdpa-flash", q, k, v, True))
    out["flashgen_mib"] = extra(ours)
    out["flashgen_variant"] = spec.name
    del case
    return out


def environment(commit: str | None = None) -> dict[str, Any]:
    """GPU, driver, clocks, versions and commit of this run."""
    torch = _torch()
    env: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "flashgen": __version__,
        "commit": commit or os.environ.get("FLASHGEN_COMMIT") or _git_sha(),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "protocol": {
            "tokens": TOKENS, "model_dim": MODEL_DIM, "warmup": WARMUP, "reps": REPS,
            "warmup_s": WARMUP_S,
            "statistic": "median of CUDA-event timings",
            "flops": "4*B*H*T*T*d, halved for causal",
            "bwd": "autograd.grad(o, (q, k, v), do, retain_graph=True) after one forward",
            "bwd_flops": "2.5 x the forward's",
        },
    }  # fmt: skip
    try:
        q = "driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu"
        smi = subprocess.run(
            ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=False,
        ).stdout.strip().splitlines()  # fmt: skip
        if smi:
            env["nvidia_smi"] = dict(
                zip(q.split(","), [x.strip() for x in smi[0].split(",")], strict=False)
            )
    except (OSError, subprocess.SubprocessError):
        pass
    return env


def _git_sha() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=10", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        out = ""
    return out or "unknown"


def result_path(env: dict[str, Any], outdir: Path) -> Path:
    """bench/results/<gpu>-<date>-<sha>.json."""
    gpu = re.sub(r"[^a-z0-9]+", "-", str(env.get("gpu", "gpu")).lower()).strip("-")
    date = str(env.get("date", ""))[:10]
    return outdir / f"{gpu}-{date}-{str(env.get('commit', 'unknown'))[:10]}.json"


def best_rows(
    rows: list[Row], direction: str = "fwd"
) -> dict[tuple[str, int, bool, int, str], Row]:
    """For each (dtype, d, causal, T, impl): the fastest row (flashgen: best variant), among
    the rows of one `direction` ("fwd" or "bwd"); feature rows are left out."""
    best: dict[tuple[str, int, bool, int, str], Row] = {}
    for r in rows:
        if r.tflops is None or r.feature is not None or r.direction != direction:
            continue
        key = (r.dtype, r.d, r.causal, r.t, r.impl)
        if key not in best or r.tflops > (best[key].tflops or 0):
            best[key] = r
    return best


def summary_table(rows: list[Row], direction: str = "fwd") -> list[dict[str, Any]]:
    """One line per case of one `direction`: flashgen's best TFLOP/s, each peer's (None where
    not timed), and the ratios."""
    best = best_rows(rows, direction)
    keys = sorted({k[:4] for k in best})
    out = []
    for key in keys:
        ours = best.get((*key, "flashgen"))
        line: dict[str, Any] = {
            "dtype": key[0], "d": key[1], "causal": key[2], "T": key[3],
            "flashgen": ours.tflops if ours else None,
            "variant": ours.variant if ours else None,
        }  # fmt: skip
        for peer in PEERS + OPTIONAL_PEERS:
            p = best.get((*key, peer))
            line[peer] = p.tflops if p else None
            ratio = None
            if ours is not None and ours.tflops and p is not None and p.tflops:
                ratio = ours.tflops / p.tflops
            line[f"x_{peer}"] = ratio
        out.append(line)
    return out


def plot(rows: list[Row], path: Path) -> None:
    """PNG of TFLOP/s against T, one panel per (direction, dtype, d, causal): the forward's
    panels, then the backward's (when there are backward rows); one line per implementation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    best = {direction: best_rows(rows, direction) for direction in DIRECTIONS}
    panels = [
        (direction, *key)
        for direction in DIRECTIONS
        for key in sorted({(k[0], k[1], k[2]) for k in best[direction]})
    ]
    cols = 4
    nrows = max(1, math.ceil(len(panels) / cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.4 * nrows), squeeze=False)
    for ax, (direction, dt, d, causal) in zip(axes.flat, panels, strict=False):
        for impl in ("flashgen", *PEERS, *OPTIONAL_PEERS):
            pts = sorted(
                (k[3], r.tflops)
                for k, r in best[direction].items()
                if k[:3] == (dt, d, causal) and k[4] == impl
            )
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        ax.set_xscale("log", base=2)
        mask = "causal" if causal else "non-causal"
        ax.set_title(f"{direction} {dt} d={d} {mask}", fontsize=10)
        ax.set_xlabel("T")
        ax.set_ylabel("TFLOP/s")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- host overhead ----------------------------------------------------------------------------
# (B, H, T, d): decode-like, short and medium sequences (Tq = Tk = T)
OVERHEAD_PROBLEMS: tuple[tuple[int, int, int, int], ...] = (
    (1, 8, 1, 128),
    (1, 8, 128, 64),
    (4, 16, 1024, 128),
)
OVERHEAD_CALLS = 2000  # timed calls per implementation and problem (NumPy: a tenth)
OVERHEAD_BATCH = 50  # calls between (untimed) synchronizations: the launch queue never fills
OVERHEAD_IMPLS = ("flashgen.torch", "sdpa", "flashgen.torch-op", "gpuarray", "numpy", "alloc-floor")
OVERHEAD_BAR = 1.2  # flashgen.torch's median over SDPA's: the bar of issue #11


@dataclass
class OverheadRow:
    """Median host wall time of one call of one implementation on one problem."""

    impl: str
    dtype: str
    b: int
    h: int
    t: int
    d: int
    causal: bool
    us: float | None  # median microseconds per call
    p90_us: float | None
    calls: int
    x_sdpa: float | None = None  # us / SDPA's us on the same problem
    error: str | None = None


def _per_call_us(
    fn: Callable[[], Any], calls: int, batch: int, sync: Callable[[], None]
) -> list[float]:
    """Wall microseconds of each of `calls` calls, synchronizing (untimed) every `batch`."""
    samples: list[float] = []
    clock = time.perf_counter_ns
    while len(samples) < calls:
        for _ in range(min(batch, calls - len(samples))):
            t0 = clock()
            fn()
            samples.append((clock() - t0) / 1e3)
        sync()
    return samples


def overhead_runners(
    b: int, h: int, t: int, d: int, causal: bool, dtype: str = "bf16", seed: int = 0
) -> dict[str, Callable[[], Any]]:
    """The implementations timed by `host_overhead`, as closures on one set of inputs."""
    torch = _torch()
    from flashgen import api
    from flashgen import torch as fg_torch
    from flashgen.generator.dtypes import DTYPES as STORAGE
    from flashgen.runtime import gpu as runtime

    dt = torch_dtype(dtype)
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(b, h, t, d, device="cuda", dtype=dt, generator=g) for _ in range(3))
    host = [x.float().cpu().numpy().astype(STORAGE[dtype].numpy) for x in (q, k, v)]
    dev = [runtime.to_device(x) for x in host]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    op = torch.ops.flashgen.attention.default
    lse_shape = (b, h, t)
    return {
        "flashgen.torch": lambda: fg_torch.attention(q, k, v, causal=causal),
        "sdpa": lambda: sdpa(q, k, v, is_causal=causal),
        "flashgen.torch-op": lambda: op(q, k, v, causal, None, None),  # through the dispatcher
        "gpuarray": lambda: api.attention(dev[0], dev[1], dev[2], causal=causal),
        "numpy": lambda: api.attention(host[0], host[1], host[2], causal=causal),
        # the two allocations every call makes (O and LSE): the part no launch path avoids
        "alloc-floor": lambda: (
            torch.empty_like(q),
            torch.empty(lse_shape, device="cuda", dtype=torch.float32),
        ),
    }


def host_overhead(
    problems: Iterable[tuple[int, int, int, int]] = OVERHEAD_PROBLEMS,
    causal: Iterable[bool] = (False, True),
    dtype: str = "bf16",
    calls: int = OVERHEAD_CALLS,
    impls: Iterable[str] = OVERHEAD_IMPLS,
    batch: int = OVERHEAD_BATCH,
    rounds: int = 4,
) -> list[OverheadRow]:
    """Median wall time per call of each implementation, SDPA's ratio alongside.

    Each problem's implementations are warmed up (compile, load, validate), then timed in
    `rounds` interleaved rounds of calls/rounds calls each, so drift hits all alike.
    """
    torch = _torch()
    chosen = list(impls)
    rows: list[OverheadRow] = []
    for b, h, t, d in problems:
        for c in causal:
            runners = overhead_runners(b, h, t, d, c, dtype)
            samples: dict[str, list[float]] = {name: [] for name in chosen}
            errors: dict[str, str] = {}
            for name in chosen:
                try:
                    for _ in range(3):
                        runners[name]()
                    torch.cuda.synchronize()
                except Exception as exc:  # an implementation that fails is a row, not a crash
                    errors[name] = f"{type(exc).__name__}: {exc}"[:300]
            for _ in range(rounds):
                for name in chosen:
                    if name in errors:
                        continue
                    n = max(1, calls // rounds // (10 if name == "numpy" else 1))
                    samples[name] += _per_call_us(runners[name], n, batch, torch.cuda.synchronize)
            group = []
            for name in chosen:
                xs = sorted(samples[name])
                med = statistics.median(xs) if xs else None
                p90 = xs[int(0.9 * (len(xs) - 1))] if xs else None
                group.append(
                    OverheadRow(
                        name, dtype, b, h, t, d, c, med, p90, len(xs), None, errors.get(name)
                    )
                )
            base = next((r.us for r in group if r.impl == "sdpa"), None)
            for r in group:
                if r.us is not None and base:
                    r.x_sdpa = r.us / base
            rows += group
            del runners
    return rows


def overhead_table(rows: list[OverheadRow]) -> tuple[list[str], list[list[str]]]:
    """Headers and lines: one line per (problem, causal), microseconds per implementation."""
    impls = [i for i in OVERHEAD_IMPLS if any(r.impl == i for r in rows)]
    keys = sorted({(r.b, r.h, r.t, r.d, r.causal) for r in rows}, key=lambda k: (k[2], k[4]))
    headers = ["problem", "causal", *[f"{i} us" for i in impls], "x SDPA"]
    lines = []
    for key in keys:
        by = {r.impl: r for r in rows if (r.b, r.h, r.t, r.d, r.causal) == key}
        cells = [f"{by[i].us:.1f}" if i in by and by[i].us is not None else "-" for i in impls]
        ours = by.get("flashgen.torch")
        ratio = "-" if ours is None or ours.x_sdpa is None else f"{ours.x_sdpa:.2f}"
        b, h, t, d, c = key
        lines.append([f"B{b} H{h} T{t} d{d}", "yes" if c else "no", *cells, ratio])
    return headers, lines
