"""What the `flashgen bench` CLI tests share: the GPU steps faked (no device, no nvcc), so that
each test fakes only the row set it is about."""

from __future__ import annotations

import pytest

from flashgen.cli import perf as cli_perf
from flashgen.generator import select as select_mod
from flashgen.perf import bench


def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """An H200 (sm_90) that `flashgen bench` finds, a fixed environment, no variant selection."""
    monkeypatch.setattr(cli_perf, "_gpu_or_fail", lambda command: ("H200", "sm_90"))
    monkeypatch.setattr(bench, "environment", lambda: {"gpu": "H200", "date": "2025-01-01",
                                                       "commit": "abc"})  # fmt: skip
    monkeypatch.setattr(select_mod, "select", lambda *a, **k: None)


def quick_flags(*extra: str) -> list[str]:
    """A short `flashgen bench` command line for a test of one row set: d 64, T 1024, the
    memory, overhead and feature rows off, the JSON into ./out; `extra` turns others off."""
    return ["--d", "64", "--t", "1024", "--no-memory", "--no-overhead", "--no-features", *extra,
            "--out", "out"]  # fmt: skip


def no_kernel_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The forward and backward rows time nothing (a test of another row set)."""
    monkeypatch.setattr(bench, "bench_case", lambda case, *a, **k: [])
    monkeypatch.setattr(bench, "bench_backward_case", lambda case, *a, **k: [])
