"""Benchmark peers: FA4 joins torch SDPA's backends only where it imports; tables carry it."""

from __future__ import annotations

import sys
import types

import pytest

from flashgen.perf import bench
from flashgen.perf.bench import Case, Row


def test_fa4_is_a_peer_only_when_it_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", None)  # import fails
    assert not bench.fa4_available()
    assert bench.available_peers() == bench.PEERS
    fake = types.ModuleType("flash_attn.cute.interface")
    fake.flash_attn_func = lambda *a, **k: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", fake)
    assert bench.fa4_available()
    assert bench.available_peers() == (*bench.PEERS, "fa4")


def _row(impl: str, tflops: float) -> Row:
    case = Case("bf16", 128, False, 4096)
    return Row(impl, "v" if impl == "flashgen" else None, "bf16", 128, False, 4096, case.b,
               case.h, 1.0, tflops)  # fmt: skip


def test_summary_table_reports_fa4_and_the_ratio_against_it() -> None:
    rows = [_row("flashgen", 600.0), _row("sdpa-cudnn", 650.0), _row("fa4", 700.0)]
    [line] = bench.summary_table(rows)
    assert line["fa4"] == 700.0
    assert line["x_fa4"] == pytest.approx(600.0 / 700.0)
    assert line["x_sdpa-cudnn"] == pytest.approx(600.0 / 650.0)


def test_summary_table_without_fa4_has_an_empty_column() -> None:
    [line] = bench.summary_table([_row("flashgen", 600.0), _row("sdpa-flash", 300.0)])
    assert line["fa4"] is None and line["x_fa4"] is None
