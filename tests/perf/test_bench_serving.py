"""`flashgen bench`'s serving rows without a GPU: the decode and varlen row sets, their bytes and
useful FLOPs, the ratios and the best peer, the tables, the JSON (old files have no `serving`)
and the CLI's `--serving/--no-serving`.

The timing itself needs torch with CUDA; `decode_row`'s and `varlen_rows`' bookkeeping (the
shuffled pages, the FlashInfer plan, error rows, interleaved rounds) is checked on the CPU build
of torch with the kernels and the timers faked, on small shapes (skipped without torch).
"""

from __future__ import annotations

import itertools
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from cli.test_cli import assert_one_line_error, run, sandbox  # noqa: F401

from flashgen.perf import bench, graph_timing
from flashgen.perf import bench_serving as bs
from flashgen.perf.bench import BenchResult, Case, Row
from perf._bench_cli import fake_gpu, no_kernel_rows, quick_flags


# ---- the row sets ------------------------------------------------------------------------------
def test_decode_cases_are_the_issues_bar_rows() -> None:
    cases = bs.decode_cases()
    want = {(b, tk, h, h_kv, tq) for (h, h_kv), tq, b, tk in itertools.product(
        [(32, 8), (8, 1)], [1, 4], [1, 8, 32], [4096, 32768, 131072])}  # fmt: skip
    assert len(cases) == 36
    assert {(c.b, c.tk, c.h, c.h_kv, c.tq) for c in cases} == want
    assert {c.d for c in cases} == {128} and bs.DECODE_DTYPE == "bf16"
    assert cases[0] == bs.DecodeCase(1, 4096, 32, 8, 1)
    assert cases[-1] == bs.DecodeCase(32, 131072, 8, 1, 4)


def test_decode_bytes_are_k_and_v_in_bf16_and_the_fit_margin_is_five() -> None:
    case = bs.DecodeCase(32, 131072, 32, 8, 1)
    assert case.kv_bytes == 32 * 131072 * 8 * 128 * 2 * 2 == 17_179_869_184
    assert case.fits(5 * case.kv_bytes) and not case.fits(5 * case.kv_bytes - 1)
    assert bs.DecodeCase(1, 4096, 8, 1, 4).kv_bytes == 4096 * 128 * 4
    assert case.label == "B32 Tk131072 32/8 Tq1"


def test_varlen_row_set_is_sixteen_sequences_of_16k_tokens() -> None:
    assert sorted(bs.SHUFFLED) == sorted(bs.LENGTHS) and bs.SHUFFLED != bs.LENGTHS
    assert sorted(bs.LENGTHS, reverse=True) == bs.LENGTHS
    assert len(bs.SHUFFLED) == 16 and sum(bs.SHUFFLED) == 16384
    assert (min(bs.SHUFFLED), max(bs.SHUFFLED)) == (64, 4096)
    assert (bs.VARLEN_HEADS, bs.VARLEN_D) == (16, 128)
    assert bs.DENSE_SHAPES == ((16, 1024), (4, 4096))
    assert {b * t for b, t in bs.DENSE_SHAPES} == {sum(bs.SHUFFLED)}


# ---- bytes, FLOPs, ratios ----------------------------------------------------------------------
def test_causal_pairs_are_each_rows_own_prefix() -> None:
    def brute(lens: list[int], causal: bool) -> int:
        return sum(i + 1 if causal else n for n in lens for i in range(n))

    for lens in ([1], [3], [64, 5, 1], bs.SHUFFLED):
        assert bs.pairs(lens, True) == brute(lens, True)
        assert bs.pairs(lens, False) == brute(lens, False) == sum(n * n for n in lens)
    assert bs.pairs([3, 2], True) == 6 + 3
    # packing order changes nothing: the sequences see only themselves
    assert bs.pairs(bs.SHUFFLED, True) == bs.pairs(bs.LENGTHS, True)
    n = bs.pairs(bs.SHUFFLED, True)
    assert bs.useful_flops(n) == 4.0 * 128 * 16 * n
    assert bs.useful_flops(n, "bwd") == 2.5 * bs.useful_flops(n)


def _decode(**us: float) -> dict[str, Any]:
    row: dict[str, Any] = {"kind": "decode", "b": 8, "tk": 32768, "h": 32, "h_kv": 8, "tq": 1,
                           "d": 128, "bytes": 8_000_000}  # fmt: skip
    row.update({f"{k}_us": v for k, v in us.items()})
    bs.add_bandwidth(row)
    return row


def test_bandwidth_is_bytes_over_time_and_a_copy_counts_read_and_write() -> None:
    row = _decode(flashgen=4.0, copy=2.0, memcpy=2.5, sm_copy=2.0, sdpa=8.0)
    assert row["flashgen_gbs"] == pytest.approx(2000.0)  # 8 MB in 4 us
    assert row["sdpa_gbs"] == pytest.approx(1000.0)
    assert row["copy_gbs"] == pytest.approx(8000.0)  # 8 MB read + 8 MB written in 2 us
    assert row["memcpy_gbs"] == pytest.approx(6400.0)
    assert row["sm_copy_gbs"] == row["copy_gbs"]


def test_best_peer_is_the_fastest_timed_peer_and_the_ratios_use_it() -> None:
    row = _decode(flashgen=4.0, copy=2.0, sdpa=5.0, flashinfer16=4.5, flashinfer256=6.0)
    row["flashinfer256_error"] = "RuntimeError: x"
    assert bs.best_peer(row) == ("flashinfer16", pytest.approx(8e6 / 4.5 / 1e3))
    s = bs.decode_summary(row)
    assert s["peer"] == "FlashInfer p16"
    assert s["x_peer"] == pytest.approx(4.5 / 4.0)
    assert s["x_copy"] == pytest.approx((8e6 / 4 / 1e3) / (2 * 8e6 / 2 / 1e3))
    # SDPA alone (no FlashInfer): SDPA is the peer, slower than flashgen here
    s2 = bs.decode_summary(_decode(flashgen=4.0, sdpa=3.0))
    assert s2["peer"] == "SDPA" and s2["x_peer"] == pytest.approx(0.75)
    assert s2["copy"] is None and s2["x_copy"] is None
    none = bs.decode_summary(_decode(flashgen=4.0))
    assert none["peer"] is None and none["x_peer"] is None


def test_decode_table_cells_and_skipped_rows() -> None:
    row = _decode(flashgen=4.0, paged16=4.2, paged256=4.1, copy=2.0, sdpa=5.0)
    skipped = {**_decode(), "tk": 131072, "skipped": "too big"}
    headers, lines = bs.decode_table([row, skipped])
    assert headers == ["B", "Tk", "heads", "Tq", "flashgen GB/s", "us", "paged16", "paged256",
                       "best peer", "peer GB/s", "copy", "x copy", "x peer"]  # fmt: skip
    assert lines == [["8", "32768", "32/8", "1", "2000", "4.0", "1905", "1951", "SDPA", "1600",
                      "8000", "0.25", "1.25"]]  # fmt: skip
    notes = bs.serving_notes([skipped, {**row, "flashinfer16_error": "E: no"}])
    assert notes == ["decode B8 Tk131072 32/8 Tq1 skipped: too big",
                     "decode B8 Tk32768 32/8 Tq1 flashinfer16: E: no"]  # fmt: skip


def _varlen(kernel: str, tflops: float | None, dtype: str = "bf16",
            direction: str = "fwd") -> dict[str, Any]:  # fmt: skip
    return {"kind": "varlen", "kernel": kernel, "dtype": dtype, "causal": True,
            "direction": direction, "tflops": tflops, "us": 1.0 if tflops else None}  # fmt: skip


def test_varlen_summary_ratios_against_dense_and_fa4() -> None:
    rows = [_varlen("flashgen varlen", 480.0), _varlen("flashgen dense B16 T1024", 400.0),
            _varlen("flashgen dense B4 T4096", 600.0), _varlen("FA4 varlen", 500.0),
            _varlen("FA4 dense B4 T4096", 610.0),
            _varlen("flashgen varlen", 300.0, direction="bwd"),
            _varlen("flashgen dense B16 T1024", 250.0, direction="bwd"),
            _varlen("FA4 varlen", None, direction="bwd")]  # fmt: skip
    fwd, bwd = bs.varlen_summary(rows)
    assert (fwd["direction"], bwd["direction"]) == ("fwd", "bwd")
    assert fwd["x_B16 T1024"] == pytest.approx(1.2) and fwd["x_B4 T4096"] == pytest.approx(0.8)
    assert fwd["fa4"] == 500.0 and fwd["x_fa4"] == pytest.approx(0.96)
    assert bwd["B4 T4096"] is None and bwd["x_B4 T4096"] is None  # not timed
    assert bwd["fa4"] is None and bwd["x_fa4"] is None  # failed
    headers, lines = bs.varlen_table(rows)
    assert headers == ["dtype", "dir", "causal", "flashgen", "dense B16 T1024", "dense B4 T4096",
                       "FA4", "x B16 T1024", "x B4 T4096", "x FA4"]  # fmt: skip
    assert lines[0] == ["bf16", "fwd", "yes", "480.0", "400.0", "600.0", "500.0", "1.20",
                        "0.80", "0.96"]  # fmt: skip
    assert lines[1] == ["bf16", "bwd", "yes", "300.0", "250.0", "-", "-", "1.20", "-", "-"]


# ---- JSON --------------------------------------------------------------------------------------
def _row() -> Row:
    case = Case("bf16", 128, False, 4096)
    return Row("flashgen", "v", "bf16", 128, False, 4096, case.b, case.h, 1.0, 600.0)


def test_json_round_trip_keeps_the_serving_rows() -> None:
    serving = [_decode(flashgen=4.0, sdpa=5.0), _varlen("flashgen varlen", 480.0)]
    res = BenchResult(env={"gpu": "H200"}, rows=[_row()], serving=serving)
    assert json.loads(res.to_json())["serving"] == serving
    back = BenchResult.from_json(res.to_json())
    assert back.serving == serving and back.rows == res.rows


def test_json_without_serving_rows_reads_and_writes_as_before() -> None:
    old = json.loads(BenchResult(env={}, rows=[_row()]).to_json())
    assert "serving" not in old  # a run without serving rows writes the old format
    back = BenchResult.from_json(json.dumps(old))
    assert back.serving == [] and back.rows == [_row()]


# ---- decode_row and varlen_rows on the CPU build of torch --------------------------------------
@pytest.fixture
def cpu_torch(monkeypatch: pytest.MonkeyPatch) -> Any:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(bench, "_torch", lambda: torch)
    monkeypatch.setattr(bs, "free_bytes", lambda: 1 << 40)
    torch.manual_seed(0)
    return torch


def test_shuffled_pages_hold_the_cache_in_shuffled_slots(cpu_torch: Any) -> None:
    torch = cpu_torch
    k, v = torch.randn(2, 64, 2, 8), torch.randn(2, 64, 2, 8)
    kp, vp, table = bs.shuffled_pages(k, v, 16)
    assert kp.shape == (8, 16, 2, 8) and table.shape == (2, 4) and table.dtype == torch.int32
    assert sorted(table.view(-1).tolist()) == list(range(8))
    assert table.view(-1).tolist() != list(range(8))  # shuffled (seeded)
    for b, j in itertools.product(range(2), range(4)):  # what a block-table reader sees
        slot = int(table[b, j])
        assert torch.equal(kp[slot], k[b, 16 * j : 16 * (j + 1)])
        assert torch.equal(vp[slot], v[b, 16 * j : 16 * (j + 1)])


def _pages_to_cache(kp: Any, table: Any) -> Any:
    b, per = table.shape
    return kp[table.view(-1).long()].reshape(b, per * kp.shape[1], *kp.shape[2:])


class _FakeWrapper:
    """flashinfer.BatchDecodeWithPagedKVCacheWrapper: checks the plan against the cache."""

    seen: list[tuple[int, ...]] = []
    cache: Any = None

    def __init__(self, ws: Any, layout: str, use_tensor_cores: bool) -> None:
        assert layout == "NHD"
        self.tc = use_tensor_cores

    def plan(self, indptr: Any, indices: Any, last: Any, h: int, h_kv: int, d: int, page: int,
             **kw: Any) -> None:  # fmt: skip
        if page == 256:
            raise RuntimeError("no such page size")
        b = last.shape[0]
        per = int(indptr[1])
        assert indptr.tolist() == [per * i for i in range(b + 1)]
        assert last.tolist() == [page] * b
        self.seen.append((h, h_kv, d, page, self.tc))
        self.table = indices.view(b, per)

    def run(self, q: Any, kv: Any) -> Any:
        assert q.dim() == 3  # (B, H, d): the one new row of each sequence
        k = _pages_to_cache(kv[0], self.table)
        assert _FakeWrapper.cache is not None and k.equal(_FakeWrapper.cache)
        return q


def test_decode_row_times_every_implementation_on_the_same_cache(
    cpu_torch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import flashgen.kvcache as kvcache

    case = bs.DecodeCase(2, 512, 4, 1, 1, d=8)
    order: list[str] = []
    ref: dict[str, Any] = {}

    def attend(q: Any, k: Any, v: Any, lens: Any, *, block_table: Any = None,
               causal: bool = False) -> Any:  # fmt: skip
        assert not causal and lens.tolist() == [512, 512]
        if block_table is None:
            ref["k"] = _FakeWrapper.cache = k
            order.append("flashgen")
        else:
            assert _pages_to_cache(k, block_table).equal(ref["k"])
            assert _pages_to_cache(v, block_table).shape == ref["k"].shape
            order.append(f"paged{k.shape[1]}")
        return q

    times = iter([10.0, 8.0, 12.0, 13.0, 12.5, 11.0, 9.0])

    def timer(fn: Any, reps: int, times_: int) -> float:
        assert (reps, times_) == (20, 7)
        fn()
        return next(times)

    fake_fi = types.SimpleNamespace(BatchDecodeWithPagedKVCacheWrapper=_FakeWrapper)
    _FakeWrapper.seen = []
    monkeypatch.setitem(sys.modules, "flashinfer", fake_fi)
    monkeypatch.setattr(kvcache, "attention_with_kvcache", attend)
    monkeypatch.setattr(graph_timing, "timed", timer)
    row = bs.decode_row(case, device="cpu")
    assert order == ["flashgen", "paged16", "paged256"]
    assert row["memcpy_us"] == 10.0 and row["sm_copy_us"] == 8.0 and row["copy_us"] == 8.0
    assert (row["flashgen_us"], row["paged16_us"], row["paged256_us"]) == (12.0, 13.0, 12.5)
    assert row["flashinfer16_us"] == 11.0 and "flashinfer256_us" not in row
    assert row["flashinfer256_error"] == "RuntimeError: no such page size"
    assert row["sdpa_us"] == 9.0  # torch SDPA with enable_gqa really ran on the CPU
    assert _FakeWrapper.seen == [(4, 1, 8, 16, True)]  # group of 4: tensor cores
    assert row["flashgen_gbs"] == pytest.approx(case.kv_bytes / 12.0 / 1e3)
    assert row["copy_gbs"] == pytest.approx(2 * case.kv_bytes / 8.0 / 1e3)
    assert bs.decode_summary(row)["peer"] == "SDPA"


def test_decode_row_without_peers_and_a_row_that_does_not_fit(
    cpu_torch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import flashgen.kvcache as kvcache

    calls: list[bool] = []

    def attend(q: Any, *a: Any, causal: bool = False, **kw: Any) -> Any:
        calls.append(causal)
        return q

    monkeypatch.setattr(kvcache, "attention_with_kvcache", attend)
    def timer(fn: Any, reps: int, times: int) -> float:
        fn()
        return 5.0

    monkeypatch.setattr(graph_timing, "timed", timer)
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # does not import
    case = bs.DecodeCase(1, 256, 8, 1, 4, d=8)
    row = bs.decode_row(case, peers=False, device="cpu")
    timed = sorted(k for k in row if k.endswith("_us"))
    assert timed == ["flashgen_us", "paged16_us", "paged256_us"]
    assert calls == [True, True, True]  # Tq 4: the new rows are the cache's last 4 keys
    monkeypatch.setattr(bs, "free_bytes", lambda: 5 * case.kv_bytes - 1)
    small = bs.decode_row(case, device="cpu")
    assert "skipped" in small and not any(k.endswith("_us") for k in small)
    assert bs.decode_table([small])[1] == []


def _small_varlen(monkeypatch: pytest.MonkeyPatch, heads: int, dense: Any, fa4: Any,
                  **fgt: Any) -> None:  # fmt: skip
    """varlen_rows on small CPU shapes (d 8): flashgen.torch's functions and FA4 faked."""
    monkeypatch.setattr(bs, "VARLEN_HEADS", heads)
    monkeypatch.setattr(bs, "VARLEN_D", 8)
    monkeypatch.setattr(bs, "DENSE_SHAPES", dense)
    monkeypatch.setattr(bs, "_flashgen_torch", lambda: types.SimpleNamespace(**fgt))
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", fa4)


def test_varlen_rows_interleave_rounds_and_record_a_failing_peer(
    cpu_torch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    lengths = [16, 8, 8]
    seen: dict[str, Any] = {}

    def varlen(q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any, mq: int, mk: int,
               causal: bool = False) -> Any:  # fmt: skip
        seen["cu"], seen["max"] = cu_q.tolist(), (mq, mk)
        assert q.shape == (32, 2, 8) and causal
        return q * k + v

    def dense(q: Any, k: Any, v: Any, causal: bool = False) -> Any:
        assert q.shape in {(2, 2, 16, 8), (1, 2, 32, 8)}  # (B, H, T, d)
        return q * k + v

    def fa4_varlen(*a: Any, **k: Any) -> Any:
        raise RuntimeError("sm_90 only")

    fa4 = types.ModuleType("flash_attn.cute.interface")
    fa4.flash_attn_varlen_func = fa4_varlen  # type: ignore[attr-defined]
    fa4.flash_attn_func = lambda q, k, v, causal: (q * k + v, None)  # type: ignore[attr-defined]
    _small_varlen(monkeypatch, 2, ((2, 16), (1, 32)), fa4, flash_attn_varlen_func=varlen,
                  attention=dense)  # fmt: skip
    order: list[int] = []

    def bwd_timer(fn: Any, reps: int = 30) -> float:
        grads = fn()
        assert len(grads) == 3 and reps == 7
        order.append(id(fn))
        return 0.002  # ms

    monkeypatch.setattr(bench, "time_ms", bwd_timer)
    rows = bs.varlen_rows("fp16", True, "bwd", rounds=2, lengths=lengths, reps=7, device="cpu")
    assert seen == {"cu": [0, 16, 24, 32], "max": (16, 16)}
    names = [r["kernel"] for r in rows]
    assert names == ["flashgen varlen", "FA4 varlen", "flashgen dense B2 T16",
                     "FA4 dense B2 T16", "flashgen dense B1 T32", "FA4 dense B1 T32"]  # fmt: skip
    by = {r["kernel"]: r for r in rows}
    assert by["FA4 varlen"]["error"] == "RuntimeError: sm_90 only"
    assert by["FA4 varlen"]["tflops"] is None
    assert len(order) == 2 * 5 and order[:5] == order[5:]  # every kernel once a round
    ours = by["flashgen varlen"]
    assert ours["pairs"] == bs.pairs(lengths, True) == 136 + 36 + 36
    assert ours["us"] == 2.0 and ours["rounds_us"] == [2.0, 2.0]
    assert ours["tflops"] == pytest.approx(2.5 * 4 * 8 * 2 * 208 / 2.0 / 1e6)
    assert by["flashgen dense B2 T16"]["pairs"] == 2 * 136
    assert {r["direction"] for r in rows} == {"bwd"} and {r["dtype"] for r in rows} == {"fp16"}


def test_varlen_rows_forward_uses_graph_timing_and_no_peers_leaves_fa4_out(
    cpu_torch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _small_varlen(monkeypatch, 1, ((2, 8), (1, 16)), types.ModuleType("fa4"),
                  flash_attn_varlen_func=lambda q, *a, **k: q, attention=lambda q, *a, **k: q)
    got: list[tuple[int, int]] = []

    def timer(fn: Any, reps: int, times: int) -> float:
        assert fn().dtype.itemsize == 2
        got.append((reps, times))
        return 4.0

    monkeypatch.setattr(graph_timing, "timed", timer)
    rows = bs.varlen_rows("bf16", False, "fwd", peers=False, rounds=3, lengths=[8, 8],
                          device="cpu")  # fmt: skip
    assert [r["kernel"] for r in rows] == ["flashgen varlen", "flashgen dense B2 T8",
                                           "flashgen dense B1 T16"]  # fmt: skip
    assert got == [(10, 5)] * 9
    assert rows[0]["pairs"] == 128 and rows[0]["tflops"] == pytest.approx(4 * 8 * 128 / 4 / 1e6)


def _fake_graph_torch(monkeypatch: pytest.MonkeyPatch, calls: list[str]) -> None:
    """torch.cuda faked for graph_timing: calls records "call" per fn() and "replay N" per
    replay of a graph of N captured calls; each timed replay's event says 1, 2, 3, ... ms."""
    elapsed = itertools.count(1.0)

    class Graph:
        captured = 0

        def replay(self) -> None:
            calls.append(f"replay {self.captured}")

    class Capture:
        def __init__(self, g: Graph, stream: Any = None) -> None:
            self.g = g

        def __enter__(self) -> None:
            calls.append("capture")

        def __exit__(self, *a: Any) -> None:
            self.g.captured = calls.count("call") - 1

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            pass

        def record(self) -> None:
            pass

        def synchronize(self) -> None:
            pass

        def elapsed_time(self, end: Any) -> float:
            return next(elapsed)

    stream = types.SimpleNamespace(wait_stream=lambda s: None)
    cuda = types.SimpleNamespace(
        synchronize=lambda: None, Stream=lambda: stream, current_stream=lambda: stream,
        CUDAGraph=Graph, graph=Capture, stream=lambda s: Capture(Graph()), Event=Event,
    )  # fmt: skip
    monkeypatch.setattr(bench, "_torch", lambda: types.SimpleNamespace(cuda=cuda))


def test_graph_timing_replays_a_graph_of_reps_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    _fake_graph_torch(monkeypatch, calls)
    us = graph_timing.timed(lambda: calls.append("call"), reps=4, times=3, warmup_s=0.0)
    assert calls.count("call") == 1 + 4  # one eager call, then four captured
    assert calls.count("replay 4") == 1 + 3  # one warm-up replay and three timed
    assert us == pytest.approx(2.0 * 1000 / 4)  # the median of 1, 2, 3 ms over 4 calls


def test_graph_timing_warms_the_clock_for_warmup_s_before_it_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the protocol's warm-up (bench.WARMUP_S by default): replays until that much time passed
    calls: list[str] = []
    _fake_graph_torch(monkeypatch, calls)
    clock = itertools.count(0.0, 0.25)  # each look at the host clock: 0.25 s later
    monkeypatch.setattr(graph_timing.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(bench, "WARMUP_S", 1.0)
    graph_timing.timed(lambda: calls.append("call"), reps=4, times=3)
    warm = calls.count("replay 4") - 3
    assert warm == 3  # the first replay (0.25 s), then one a batch until the clock passes 1 s
    calls.clear()
    graph_timing.timed(lambda: calls.append("call"), reps=4, times=3, warmup_s=0.0)
    assert calls.count("replay 4") == 1 + 3  # warmup_s 0: the one replay, then the timed


# ---- the CLI -----------------------------------------------------------------------------------
def _fake_bench(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """`flashgen bench` with every GPU step faked; returns what the serving rows were asked."""
    seen: dict[str, list[Any]] = {"decode": [], "varlen": []}
    fake_gpu(monkeypatch)
    no_kernel_rows(monkeypatch)

    def decode_row(case: bs.DecodeCase, peers: bool = True) -> dict[str, Any]:
        seen["decode"].append((case, peers))
        if case.tk == 131072:
            return {"kind": "decode", "b": case.b, "tk": case.tk, "h": case.h,
                    "h_kv": case.h_kv, "tq": case.tq, "d": 128, "skipped": "no room"}  # fmt: skip
        row = {**_decode(flashgen=4.0, sdpa=5.0, copy=2.0), "b": case.b, "tk": case.tk}
        return row

    def varlen_rows(dtype: str, causal: bool, direction: str, peers: bool = True,
                    reps: int = 30) -> list[dict[str, Any]]:  # fmt: skip
        seen["varlen"].append((dtype, causal, direction, peers))
        return [{**_varlen("flashgen varlen", 480.0, dtype, direction), "causal": causal},
                {**_varlen("FA4 varlen", None, dtype, direction), "causal": causal,
                 "error": "ImportError: none"}]  # fmt: skip

    monkeypatch.setattr(bs, "decode_row", decode_row)
    monkeypatch.setattr(bs, "varlen_rows", varlen_rows)
    return seen


_QUICK = quick_flags("--no-training")


def test_bench_runs_the_serving_rows_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _fake_bench(monkeypatch)
    result = run("bench", *_QUICK)
    assert result.exit_code == 0, result.output
    assert [c for c, _ in seen["decode"]] == bs.decode_cases()
    assert seen["varlen"] == [("bf16", True, "fwd", True), ("bf16", True, "bwd", True),
                              ("fp16", True, "fwd", True), ("fp16", True, "bwd", True)]  # fmt: skip
    out = result.stdout
    assert "decode, bf16 d=128" in out and "varlen prefill, 16 packed sequences" in out
    decode_part = out.split("decode, bf16")[1].split("varlen prefill")[0]
    assert "x copy" in decode_part and "SDPA" in decode_part
    assert len([x for x in decode_part.splitlines() if " 32/8 " in x or " 8/1 " in x]) == 24
    assert "B32 Tk131072 8/1 Tq4 skipped: no room" in result.stderr
    assert "varlen FA4 varlen fp16 bwd: ImportError: none" in result.stderr
    [path] = Path("out").glob("*.json")
    serving = BenchResult.from_json(path.read_text()).serving
    assert sum(r["kind"] == "decode" for r in serving) == 36
    assert sum(r["kind"] == "varlen" for r in serving) == 8


@pytest.mark.parametrize(
    ("flags", "decode", "varlen"),
    [(["--no-serving"], 0, []),
     (["--dtype", "fp16", "--no-backward"], 0, [("fp16", True, "fwd", True)]),
     (["--dtype", "bf16", "--no-causal", "--no-peers", "--no-backward"], 36,
      [("bf16", False, "fwd", False)])],
)  # fmt: skip
def test_serving_options_select_the_rows(
    monkeypatch: pytest.MonkeyPatch, flags: list[str], decode: int, varlen: list[Any]
) -> None:
    seen = _fake_bench(monkeypatch)
    result = run("bench", *_QUICK, *flags)
    assert result.exit_code == 0, result.output
    assert len(seen["decode"]) == decode and seen["varlen"] == varlen
    assert {p for _, p in seen["decode"]} <= {"--no-peers" not in flags}
    [path] = Path("out").glob("*.json")
    data = json.loads(path.read_text())
    assert ("serving" in data) is bool(decode or varlen)
    assert ("decode, bf16" in result.stdout) is bool(decode)


def test_bench_help_names_the_serving_switch() -> None:
    text = " ".join(run("bench", "--help").stdout.split())
    assert "--serving / --no-serving" in text and "[default: serving]" in text
    assert "--no-serving" in text.split("Examples:")[1]


def test_bench_serving_without_a_gpu_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_cuda() -> Any:
        raise bench.BenchUnavailable("torch sees no CUDA device; run bench on a GPU machine")

    monkeypatch.setattr(bench, "_torch", no_cuda)
    assert_one_line_error(run("bench", "--serving"), "bench", "no CUDA device")
