"""bench.time_ms's warm-up: a fixed number of calls, then seconds of back-to-back calls so that the
GPU's clock has settled under its power cap before the timed reps (CPU, torch faked)."""

from __future__ import annotations

import time
import types
from typing import Any

import pytest

from flashgen.perf import bench


class _Event:
    def __init__(self, enable_timing: bool = False) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: _Event) -> float:
        return (end.t - self.t) * 1e3


def _fake_torch(syncs: list[float]) -> Any:
    cuda = types.SimpleNamespace(
        synchronize=lambda: syncs.append(time.perf_counter()), Event=_Event
    )
    return types.SimpleNamespace(cuda=cuda)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    syncs: list[float] = []
    monkeypatch.setattr(bench, "_torch", lambda: _fake_torch(syncs))
    return syncs


def test_no_warmup_seconds_means_exactly_warmup_plus_reps_calls(calls: list[float]) -> None:
    n = []
    bench.time_ms(lambda: n.append(1), warmup=3, reps=7, warmup_s=0.0)
    assert len(n) == 10


def test_warmup_seconds_keep_calling_before_the_reps(calls: list[float]) -> None:
    stamps: list[float] = []

    def fn() -> None:
        stamps.append(time.perf_counter())
        time.sleep(0.001)

    ms = bench.time_ms(fn, warmup=2, reps=5, warmup_s=0.05)
    timed = stamps[-5:]
    assert timed[0] - stamps[0] >= 0.05  # the reps start after the warm-up seconds
    assert len(stamps) > 2 + 5 + 10  # ~1 ms calls for 50 ms: dozens of warm-up calls
    assert 0.5 < ms < 50


def test_warmup_seconds_with_no_warmup_calls_still_sizes_its_batches(calls: list[float]) -> None:
    n = []
    bench.time_ms(lambda: n.append(time.sleep(0.001)), warmup=0, reps=3, warmup_s=0.02)
    assert 3 < len(n) < 200  # batches sized from one measured call, not from zero calls


def test_the_protocol_records_the_warmup_seconds() -> None:
    assert bench.WARMUP_S >= 0.5  # long enough for the H200's clock to settle (bench/NOTES.md)
