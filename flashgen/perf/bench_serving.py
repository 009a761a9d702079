"""`flashgen bench`'s serving rows (issue 26): decode bandwidth and variable-length prefill.

Decode (`decode_cases`, `decode_row`): bf16, d 128; GQA 32/8 and 8/1; Tq 1 and 4; B 1, 8, 32;
Tk 4096, 32768, 131072. A row whose cache does not fit free device memory (5x its K+V bytes:
the cache, a paged copy of it, the copy's buffers, with room to spare) is skipped. Each row
has the bytes of K and V one call reads (B x Tk x H_kv x d x 2 x 2) and the time of
- flashgen contiguous: `flashgen.kvcache.attention_with_kvcache`, causal when Tq > 1 (the new
  rows are the last Tq keys);
- flashgen paged: pages of 16 and of 256 keys in shuffled slots, through a block table;
- torch SDPA (`enable_gqa`, its default backend; not causal: SDPA's causal mask aligns the
  top left, so Tq 4 reads the same bytes unmasked);
- FlashInfer's `BatchDecodeWithPagedKVCacheWrapper` where `import flashinfer` works, Tq 1 rows,
  the same shuffled pages of 16 and 256 keys (its JIT compiles outside the timing);
- a device copy of the same bytes: the faster of `copy_` (a memcpy node in a graph: the copy
  engines) and an SM copy kernel (`torch.mul(src, 1, out=dst)`), counted as bytes read +
  written;
each the median of CUDA-event timings of a CUDA graph of 20 calls replayed 7 times
(`graph_timing`: launch overhead out of the picture, as in a serving loop). GB/s = bytes over
time; "x copy" is flashgen's GB/s over the copy's, "x peer" over the best peer's (the fastest
of SDPA and FlashInfer's two page sizes).

Varlen prefill (`varlen_rows`): 16 sequences of 64 to 4096 tokens (16384 in all) packed in a
shuffled order (`SHUFFLED`; `LENGTHS` is longest first), H 16, d 128, causal, bf16 and fp16:
`flashgen.torch.flash_attn_varlen_func`, the dense `flashgen.torch.attention` at the same token
count (B16 T1024 and B4 T4096) and FA4's varlen and dense forwards where `flash_attn.cute`
imports. Useful TFLOP/s: 4 d H FLOPs per (query row, key) pair a row really sees (causal: its
own prefix), over the median time. Forward: CUDA graphs of 10 calls replayed 5 times.
Backward: `torch.autograd.grad(o, (q, k, v), do, retain_graph=True)` after one forward, timed
like the bench's backward rows (`bench.time_ms`: eager calls, autograd on the host between the
kernels), at 2.5x the forward's FLOPs. Every kernel is timed once a round, 3 interleaved
rounds; a row's time is the median over the rounds.

Rows are plain dicts (`kind` "decode" or "varlen"), as `BenchResult.serving` writes them to the
JSON and scripts/decode_bench.py and scripts/varlen_bench.py write theirs. A measurement that
fails is recorded (decode: `<impl>_error`; varlen: a row with `error`), never a crash.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from flashgen.perf import bench, graph_timing

# ---- decode -----------------------------------------------------------------------------------
DECODE_DTYPE = "bf16"
DECODE_D = 128
DECODE_HEADS = ((32, 8), (8, 1))  # (H, H_kv)
DECODE_TQ = (1, 4)
DECODE_B = (1, 8, 32)
DECODE_TK = (4096, 32768, 131072)
PAGE_SIZES = (16, 256)
DECODE_REPS = 20  # calls per CUDA graph
DECODE_ROUNDS = 7  # graph replays timed; the median is kept
FIT_FACTOR = 5  # a row runs when FIT_FACTOR x its K+V bytes are free
COPY_KEYS = ("copy", "memcpy", "sm_copy")  # bandwidth counts bytes read + written
FLASHGEN_KEYS = ("flashgen", *(f"paged{p}" for p in PAGE_SIZES))
PEER_NAMES = {"sdpa": "SDPA", **{f"flashinfer{p}": f"FlashInfer p{p}" for p in PAGE_SIZES}}
FLASHINFER_MODULE = "flashinfer"
FA4_MODULE = "flash_attn.cute.interface"


@dataclass(frozen=True)
class DecodeCase:
    """One decode row: Tq new query rows of B sequences against Tk cached keys."""

    b: int  # sequences
    tk: int  # cached keys of each
    h: int  # query heads
    h_kv: int  # K/V heads
    tq: int  # new query rows of each sequence
    d: int = DECODE_D

    @property
    def kv_bytes(self) -> int:
        """Bytes of K and V one call reads (2-byte elements)."""
        return 2 * self.b * self.tk * self.h_kv * self.d * 2

    def fits(self, free: int) -> bool:
        """Whether the row's buffers fit in `free` bytes of device memory."""
        return FIT_FACTOR * self.kv_bytes <= free

    @property
    def label(self) -> str:
        """How notes name the row."""
        return f"B{self.b} Tk{self.tk} {self.h}/{self.h_kv} Tq{self.tq}"


def decode_cases() -> list[DecodeCase]:
    """The issue's decode rows: every (heads, Tq, B, Tk)."""
    return [DecodeCase(b, tk, h, h_kv, tq) for h, h_kv in DECODE_HEADS for tq in DECODE_TQ
            for b in DECODE_B for tk in DECODE_TK]  # fmt: skip


def optional_module(name: str) -> Any:
    """The module `name`, or None where it does not import (any failure: then no peer)."""
    try:
        return importlib.import_module(name)
    except Exception:  # not installed, or a broken install
        return None


def free_bytes() -> int:
    """Free device memory, after torch's cache gives back what it holds unused."""
    torch = bench._torch()
    torch.cuda.empty_cache()
    return int(torch.cuda.mem_get_info()[0])


def shuffled_pages(k: Any, v: Any, page: int) -> tuple[Any, Any, Any]:
    """K and V (B, Tk, H_kv, d) cut into pages of `page` keys stored in shuffled slots: the
    K pages and V pages (B*Tk/page, page, H_kv, d) and the block table, int32 (B, Tk/page),
    holding the slot of each sequence's pages in order."""
    torch = bench._torch()
    b, tk, h_kv, d = k.shape
    per = tk // page
    slots = torch.randperm(b * per, device=k.device)
    kp = k.new_empty(b * per, page, h_kv, d)
    vp = torch.empty_like(kp)
    kp[slots] = k.reshape(b * per, page, h_kv, d)
    vp[slots] = v.reshape(b * per, page, h_kv, d)
    return kp, vp, slots.to(torch.int32).view(b, per)


def _flashinfer_decode(fi: Any, q: Any, k: Any, v: Any, page: int) -> Callable[[], Any]:
    """FlashInfer's paged decode (NHD; tensor cores for GQA groups of 4 and up) on K and V in
    shuffled pages of `page` keys, planned; the call to time."""
    torch = bench._torch()
    b, _, h, d = q.shape
    h_kv = k.shape[2]
    kp, vp, table = shuffled_pages(k, v, page)
    per = table.shape[1]
    indptr = torch.arange(0, b + 1, device=q.device, dtype=torch.int32) * per
    last = torch.full((b,), page, device=q.device, dtype=torch.int32)
    ws = torch.zeros(256 << 20, device=q.device, dtype=torch.uint8)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=h // h_kv >= 4)
    w.plan(indptr, table.view(-1), last, h, h_kv, d, page, q_data_type=q.dtype,
           kv_data_type=k.dtype)  # fmt: skip
    q1 = q[:, 0].contiguous()
    return lambda: w.run(q1, (kp, vp))


def _measure(row: dict[str, Any], key: str, make: Callable[[], Callable[[], Any]]) -> None:
    """row[key_us]: the graph-timed microseconds of the call `make()` builds, or row[key_error]
    when building or timing it fails."""
    try:
        row[f"{key}_us"] = graph_timing.timed(make(), DECODE_REPS, DECODE_ROUNDS)
    except Exception as exc:  # a peer (or a shape) that cannot run is recorded, not fatal
        row[f"{key}_error"] = bench.error_text(exc)


def decode_row(case: DecodeCase, peers: bool = True, device: str = "cuda") -> dict[str, Any]:
    """Time one decode row (module docstring): `<impl>_us` and `<impl>_gbs` per implementation
    timed; `skipped` instead when the cache does not fit. `peers` False: flashgen only."""
    row: dict[str, Any] = {"kind": "decode", "b": case.b, "tk": case.tk, "h": case.h,
                           "h_kv": case.h_kv, "tq": case.tq, "d": case.d,
                           "bytes": case.kv_bytes}  # fmt: skip
    free = free_bytes()
    if not case.fits(free):
        row["skipped"] = (f"{FIT_FACTOR} x {case.kv_bytes / 1e9:.1f} GB of K+V do not fit in "
                          f"{free / 1e9:.1f} GB free")  # fmt: skip
        return row
    torch = bench._torch()
    from flashgen.kvcache import attention_with_kvcache

    dt = torch.bfloat16
    q = torch.randn(case.b, case.tq, case.h, case.d, device=device, dtype=dt)
    k, v = (torch.randn(case.b, case.tk, case.h_kv, case.d, device=device, dtype=dt)
            for _ in "kv")  # fmt: skip
    lens = torch.full((case.b,), case.tk, device=device, dtype=torch.int32)
    causal = case.tq > 1
    if peers:
        src = torch.empty(case.kv_bytes // 2, device=device, dtype=dt)
        dst = torch.empty_like(src)
        _measure(row, "memcpy", lambda: lambda: dst.copy_(src))
        _measure(row, "sm_copy", lambda: lambda: torch.mul(src, 1, out=dst))
        del src, dst  # the copy's buffers go before the cache's paged copies come
        copies = [row[f"{c}_us"] for c in COPY_KEYS[1:] if f"{c}_us" in row]
        if copies:
            row["copy_us"] = min(copies)
    _measure(row, "flashgen",
             lambda: lambda: attention_with_kvcache(q, k, v, lens, causal=causal))  # fmt: skip

    def paged(page: int) -> Callable[[], Any]:  # the paged copy lives as long as the call
        kp, vp, table = shuffled_pages(k, v, page)
        return lambda: attention_with_kvcache(q, kp, vp, lens, block_table=table, causal=causal)

    for page in PAGE_SIZES:
        _measure(row, f"paged{page}", functools.partial(paged, page))
    fi = optional_module(FLASHINFER_MODULE) if peers and case.tq == 1 else None
    if fi is not None:
        for page in PAGE_SIZES:
            _measure(row, f"flashinfer{page}",
                     functools.partial(_flashinfer_decode, fi, q, k, v, page))  # fmt: skip
    if peers:
        sdpa = torch.nn.functional.scaled_dot_product_attention
        qs, ks, vs = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        _measure(row, "sdpa",
                 lambda: lambda: sdpa(qs, ks, vs, is_causal=False, enable_gqa=True))  # fmt: skip
    add_bandwidth(row)
    return row


def add_bandwidth(row: dict[str, Any]) -> None:
    """`<impl>_gbs` for every `<impl>_us` of a decode row: bytes / time, twice that for the
    copies (they read the bytes and write them)."""
    for key in [k_ for k_ in row if k_.endswith("_us")]:
        impl = key[: -len("_us")]
        gbs = row["bytes"] / row[key] / 1e3
        row[f"{impl}_gbs"] = 2 * gbs if impl in COPY_KEYS else gbs


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def best_peer(row: dict[str, Any]) -> tuple[str, float] | None:
    """(key, GB/s) of the fastest peer a decode row timed (SDPA, FlashInfer), or None."""
    timed = [(row[f"{p}_gbs"], p) for p in PEER_NAMES if row.get(f"{p}_gbs") is not None]
    if not timed:
        return None
    gbs, key = max(timed)
    return key, gbs


def decode_summary(row: dict[str, Any]) -> dict[str, Any]:
    """A decode row's numbers as the table shows them: flashgen's GB/s and us, the paged
    GB/s, the best peer (name, GB/s), the copy's GB/s and flashgen's ratios to both."""
    peer = best_peer(row)
    ours = row.get("flashgen_gbs")
    out: dict[str, Any] = {
        "flashgen": ours, "us": row.get("flashgen_us"),
        **{f"paged{p}": row.get(f"paged{p}_gbs") for p in PAGE_SIZES},
        "peer": PEER_NAMES[peer[0]] if peer else None, "peer_gbs": peer[1] if peer else None,
        "copy": row.get("copy_gbs"),
    }  # fmt: skip
    out["x_copy"] = _ratio(ours, out["copy"])
    out["x_peer"] = _ratio(ours, out["peer_gbs"])
    return out


def _fmt(x: float | None, nd: int) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def decode_table(rows: Iterable[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Headers and lines of the decode table: one line per decode row that ran."""
    headers = ["B", "Tk", "heads", "Tq", "flashgen GB/s", "us",
               *(f"paged{p}" for p in PAGE_SIZES), "best peer", "peer GB/s", "copy", "x copy",
               "x peer"]  # fmt: skip
    lines = []
    for r in rows:
        if r.get("kind") != "decode" or "skipped" in r:
            continue
        s = decode_summary(r)
        lines.append([str(r["b"]), str(r["tk"]), f"{r['h']}/{r['h_kv']}", str(r["tq"]),
                      _fmt(s["flashgen"], 0), _fmt(s["us"], 1),
                      *(_fmt(s[f"paged{p}"], 0) for p in PAGE_SIZES), s["peer"] or "-",
                      _fmt(s["peer_gbs"], 0), _fmt(s["copy"], 0), _fmt(s["x_copy"], 2),
                      _fmt(s["x_peer"], 2)])  # fmt: skip
    return headers, lines


# ---- varlen prefill ---------------------------------------------------------------------------
LENGTHS = [4096, 3072, 2048, 1536, 1024, 1024, 768, 640, 512, 512, 384, 256, 256, 128, 64, 64]
# packed batches come in no particular order: the default interleaves long and short
SHUFFLED = [512, 64, 3072, 256, 1024, 128, 4096, 640, 64, 1536, 384, 1024, 2048, 256, 768, 512]
VARLEN_HEADS = 16
VARLEN_D = 128
VARLEN_DTYPES = ("bf16", "fp16")
DENSE_SHAPES = ((16, 1024), (4, 4096))  # (B, T): B*T = the packed token count
VARLEN_REPS = 10  # calls per CUDA graph (forward)
VARLEN_TIMES = 5  # graph replays timed (forward)
VARLEN_ROUNDS = 3
VARLEN = "flashgen varlen"
FA4_VARLEN = "FA4 varlen"

# name -> (the shape of each of q, k, v; the forward on (q, k, v); useful (row, key) pairs)
Kernels = dict[str, tuple[tuple[int, ...], Callable[[Any, Any, Any], Any], int]]


def pairs(lens: Iterable[int], causal: bool) -> int:
    """(query row, key) pairs the rows of each sequence see (causal: each row its prefix)."""
    return sum(n * (n + 1) // 2 if causal else n * n for n in lens)


def useful_flops(n_pairs: int, direction: str = "fwd") -> float:
    """4 d H FLOPs per pair; the backward's are 2.5x the forward's."""
    factor = bench.BWD_FLOPS_FACTOR if direction == "bwd" else 1.0
    return factor * 4.0 * VARLEN_D * VARLEN_HEADS * n_pairs


def dense_name(impl: str, b: int, t: int) -> str:
    """The kernel name of a dense row ("flashgen" or "FA4")."""
    return f"{impl} dense B{b} T{t}"


def _flashgen_torch() -> Any:
    """flashgen.torch (imported when the rows are built: it registers torch ops)."""
    import flashgen.torch

    return flashgen.torch


def varlen_kernels(lengths: list[int], cu: Any, causal: bool, fa4: Any) -> Kernels:
    """The row set's kernels: flashgen varlen and dense, FA4's too when `fa4` (its
    `flash_attn.cute.interface`) is given. Varlen takes packed (tokens, H, d); flashgen's
    dense (B, H, T, d), FA4's (B, T, H, d)."""
    fgt = _flashgen_torch()
    mx = max(lengths)
    packed = (sum(lengths), VARLEN_HEADS, VARLEN_D)
    n = pairs(lengths, causal)
    out: Kernels = {
        VARLEN: (packed, lambda q, k, v: fgt.flash_attn_varlen_func(
            q, k, v, cu, cu, mx, mx, causal=causal), n),
    }  # fmt: skip
    if fa4 is not None:
        out[FA4_VARLEN] = (packed, lambda q, k, v: fa4.flash_attn_varlen_func(
            q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=mx, max_seqlen_k=mx,
            causal=causal), n)  # fmt: skip
    for b, t in DENSE_SHAPES:
        nd = b * pairs([t], causal)
        out[dense_name("flashgen", b, t)] = (
            (b, VARLEN_HEADS, t, VARLEN_D), lambda q, k, v: fgt.attention(q, k, v, causal=causal),
            nd)  # fmt: skip
        if fa4 is not None:
            out[dense_name("FA4", b, t)] = (
                (b, t, VARLEN_HEADS, VARLEN_D),
                lambda q, k, v: fa4.flash_attn_func(q, k, v, causal=causal), nd)  # fmt: skip
    return out


def prepare(shape: tuple[int, ...], forward: Callable[[Any, Any, Any], Any], direction: str,
            dtype: str, device: str = "cuda") -> Callable[[], Any]:  # fmt: skip
    """The call to time: the forward on fresh random q, k, v of `shape`, or ("bwd") the
    gradients of one forward's output against a random dO."""
    torch = bench._torch()
    t = bench.torch_dtype(dtype)
    grad = direction == "bwd"
    q, k, v = (torch.randn(shape, device=device, dtype=t, requires_grad=grad) for _ in "qkv")
    if not grad:
        return lambda: forward(q, k, v)
    o = forward(q, k, v)
    o = o[0] if isinstance(o, tuple) else o  # FA4 returns (O, LSE)
    do = torch.randn_like(o)
    return lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)


def _time_us(fn: Callable[[], Any], direction: str, reps: int) -> float:
    if direction == "bwd":
        return bench.time_ms(fn, reps=reps) * 1e3
    return graph_timing.timed(fn, VARLEN_REPS, VARLEN_TIMES)


def varlen_rows(
    dtype: str, causal: bool = True, direction: str = "fwd", peers: bool = True,
    rounds: int = VARLEN_ROUNDS, lengths: list[int] | None = None, reps: int = bench.REPS,
    device: str = "cuda",
) -> list[dict[str, Any]]:  # fmt: skip
    """One row per kernel (module docstring) for one (dtype, causal, direction): the median
    microseconds over `rounds` interleaved rounds and the useful TFLOP/s, or its error.
    `lengths` default SHUFFLED; `peers` False leaves FA4 out; `reps` times each backward."""
    torch = bench._torch()
    lengths = SHUFFLED if lengths is None else lengths
    fa4 = optional_module(FA4_MODULE) if peers else None
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)
    kernels = varlen_kernels(lengths, cu, causal, fa4)
    calls: dict[str, Callable[[], Any]] = {}
    errors: dict[str, str] = {}
    for name, (shape, forward, _) in kernels.items():
        try:
            calls[name] = prepare(shape, forward, direction, dtype, device)
        except Exception as exc:  # a kernel that cannot run: its row says why
            errors[name] = bench.error_text(exc)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name in list(calls):
            try:
                times[name].append(_time_us(calls[name], direction, reps))
            except Exception as exc:
                errors[name] = bench.error_text(exc)
                del calls[name]
    del calls
    rows = []
    for name, (_, _, n) in kernels.items():
        row: dict[str, Any] = {"kind": "varlen", "kernel": name, "dtype": dtype,
                               "causal": causal, "direction": direction, "pairs": n,
                               "us": None, "tflops": None}  # fmt: skip
        if name in errors:
            row["error"] = errors[name]
        else:
            row["us"] = statistics.median(times[name])
            row["rounds_us"] = times[name]
            row["tflops"] = useful_flops(n, direction) / row["us"] / 1e6
        rows.append(row)
    return rows


def varlen_summary(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per (dtype, causal, direction): flashgen varlen's TFLOP/s, the dense
    flashgen rows' and FA4 varlen's, and flashgen's ratios to each."""
    by: dict[tuple[str, bool, str], dict[str, float]] = {}
    for r in rows:
        if r.get("kind") == "varlen":
            got = by.setdefault((r["dtype"], r["causal"], r["direction"]), {})
            if r.get("tflops") is not None:
                got[r["kernel"]] = r["tflops"]
    out = []
    for (dtype, causal, direction), got in by.items():
        ours = got.get(VARLEN)
        line: dict[str, Any] = {"dtype": dtype, "causal": causal, "direction": direction,
                                "flashgen": ours, "fa4": got.get(FA4_VARLEN)}  # fmt: skip
        for b, t in DENSE_SHAPES:
            dense = got.get(dense_name("flashgen", b, t))
            line[f"B{b} T{t}"] = dense
            line[f"x_B{b} T{t}"] = _ratio(ours, dense)
        line["x_fa4"] = _ratio(ours, line["fa4"])
        out.append(line)
    return out


def varlen_table(rows: Iterable[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Headers and lines of the varlen table (TFLOP/s of useful work, ratios)."""
    dense = [f"B{b} T{t}" for b, t in DENSE_SHAPES]
    headers = ["dtype", "dir", "causal", "flashgen", *(f"dense {x}" for x in dense), "FA4",
               *(f"x {x}" for x in dense), "x FA4"]  # fmt: skip
    lines = [
        [s["dtype"], s["direction"], "yes" if s["causal"] else "no", _fmt(s["flashgen"], 1),
         *(_fmt(s[x], 1) for x in dense), _fmt(s["fa4"], 1),
         *(_fmt(s[f"x_{x}"], 2) for x in dense), _fmt(s["x_fa4"], 2)]
        for s in varlen_summary(rows)
    ]  # fmt: skip
    return headers, lines


def serving_notes(rows: Iterable[dict[str, Any]]) -> list[str]:
    """One line per skipped decode row, failed decode measurement and failed varlen kernel."""
    notes = []
    for r in rows:
        if r.get("kind") == "decode":
            where = f"decode B{r['b']} Tk{r['tk']} {r['h']}/{r['h_kv']} Tq{r['tq']}"
            if "skipped" in r:
                notes.append(f"{where} skipped: {r['skipped']}")
            notes += [f"{where} {k[: -len('_error')]}: {e}" for k, e in r.items()
                      if k.endswith("_error")]  # fmt: skip
        elif r.get("kind") == "varlen" and r.get("error"):
            notes.append(f"varlen {r['kernel']} {r['dtype']} {r['direction']}: {r['error']}")
    return notes
