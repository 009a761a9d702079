"""The wgmma tensor-map caches (runtime/tma.py) under threads, against a fake driver encoder.

A lookup is get() then move_to_end() and an insert may evict: without a lock, another thread
evicting the key in between made 7 of 8 threads die with KeyError out of a wgmma launch.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

import pytest

from flashgen.generator.spec import KernelSpec
from flashgen.runtime import backward, tma
from flashgen.runtime.validate import Problem

WGMMA = KernelSpec(family="wgmma", d=64, dtype="bf16")
THREADS = 8
ROUNDS = 40


class FakeEncoder:
    """libcuda's cuTensorMapEncodeTiled as tma.encode calls it through ctypes: records, succeeds."""

    calls = 0

    @staticmethod
    def cuTensorMapEncodeTiled(tmap: Any, dtype: int, rank: int, ptr: Any, *rest: Any) -> int:
        FakeEncoder.calls += 1
        return 0


class YieldingLru(OrderedDict):  # type: ignore[type-arg]
    """An OrderedDict whose lookup hands the GIL to another thread right after it finds the
    key: the window between get() and move_to_end() made wide, so a missing lock shows."""

    def get(self, key: Any, default: Any = None) -> Any:
        hit = super().get(key, default)
        time.sleep(0.0002)
        return hit


def problem(q_ptr: int) -> Problem:
    strides = (4 * 128 * 64, 128 * 64, 64)
    return Problem(
        1, 4, 128, 128, 64, "bf16", strides, strides, strides,
        strides, q_ptr=q_ptr, k_ptr=0x2000_0000, v_ptr=0x3000_0000, o_ptr=0x4000_0000,
    )  # fmt: skip


def hammer(work: Any) -> list[BaseException]:
    """Run `work(thread_index, round)` on THREADS threads, ROUNDS times each; the exceptions."""
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def run(i: int) -> None:
        start.wait()
        for r in range(ROUNDS):
            try:
                work(i, r)
            except BaseException as exc:  # noqa: BLE001 -- a KeyError is the bug under test
                errors.append(exc)
                return

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


@pytest.fixture
def small_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both caches yielding and only 2 entries long, so that threads evict each other's keys."""
    monkeypatch.setattr(tma, "_libcuda", lambda: FakeEncoder)
    monkeypatch.setattr(tma, "_CACHE_SIZE", 2)
    monkeypatch.setattr(tma, "_maps", YieldingLru())
    monkeypatch.setattr(tma, "_bwd_maps", YieldingLru())
    monkeypatch.setattr(tma, "_o_maps", YieldingLru())


def test_forward_maps_survive_threads_evicting_each_others_keys(small_caches: None) -> None:
    def work(i: int, r: int) -> None:
        # a miss (inserting, evicting another thread's key) then a hit, per thread and round
        for _ in range(2):
            maps = tma.prefix_args(WGMMA, problem(0x1000_0000 + (i * ROUNDS + r) * 0x10_0000))
            assert len(maps) == 6  # Q, K, V and O (O_TMA_STORE) maps, heads, batch

    assert hammer(work) == []
    assert len(tma._maps) <= 2


def test_backward_maps_survive_threads_evicting_each_others_keys(small_caches: None) -> None:
    spec = KernelSpec(family="wgmma", d=64, dtype="bf16", direction="bwd")
    fwd = problem(0x1000_0000)
    bp = backward.BackwardProblem(fwd, fwd.q_strides, fwd.q_strides, fwd.k_strides,
                                  fwd.v_strides, 0, 0, 0, 0)  # fmt: skip

    def work(i: int, r: int) -> None:
        q = 0x1000_0000 + (i * ROUNDS + r) * 0x10_0000  # a miss then a hit, as above
        for _ in range(2):
            maps = tma.backward_tensor_maps(spec, bp, q, 0x2000_0000, 0x3000_0000, q + 0x8000)
            assert len(maps) == 4

    assert hammer(work) == []
    assert len(tma._bwd_maps) <= 2


def test_the_cache_stays_least_recently_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tma, "_libcuda", lambda: FakeEncoder)
    monkeypatch.setattr(tma, "_CACHE_SIZE", 2)
    monkeypatch.setattr(tma, "_maps", OrderedDict())
    a, b, c = (problem(0x1000_0000 * n) for n in (1, 2, 3))
    first = tma.tensor_maps(WGMMA, a)
    tma.tensor_maps(WGMMA, b)
    assert tma.tensor_maps(WGMMA, a) is first  # a hit: a becomes the most recent
    tma.tensor_maps(WGMMA, c)  # evicts b, the least recent
    before = FakeEncoder.calls
    assert tma.tensor_maps(WGMMA, a) is first and FakeEncoder.calls == before
    tma.tensor_maps(WGMMA, b)
    assert FakeEncoder.calls == before + 3  # b was evicted: encoded again
