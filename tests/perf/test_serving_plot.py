"""The serving PNG's data (flashgen.perf.serving_plot): which decode rows make which panel and
point, the varlen bars, and a PNG written when matplotlib imports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flashgen.perf import serving_plot


def _decode(b: int, tk: int, h: int, h_kv: int, tq: int, **gbs: float) -> dict[str, Any]:
    row: dict[str, Any] = {"kind": "decode", "b": b, "tk": tk, "h": h, "h_kv": h_kv, "tq": tq,
                           "d": 128, "bytes": b * tk * h_kv * 128 * 4}  # fmt: skip
    row.update({f"{k}_gbs": v for k, v in gbs.items()})
    return row


ROWS = [
    _decode(8, 4096, 8, 1, 1, flashgen=1500.0, sdpa=1700.0, copy=4000.0),
    _decode(1, 4096, 8, 1, 1, flashgen=300.0, paged16=280.0, sdpa=290.0),
    _decode(1, 4096, 32, 8, 1, flashgen=1600.0, flashinfer16=1650.0, sdpa=1700.0),
    _decode(32, 131072, 32, 8, 1) | {"skipped": "does not fit"},
    _decode(1, 4096, 32, 8, 4, flashgen=1500.0),
    {"kind": "varlen", "kernel": "flashgen varlen", "dtype": "bf16", "causal": True,
     "direction": "fwd", "tflops": 480.0},
    {"kind": "varlen", "kernel": "FA4 varlen", "dtype": "bf16", "causal": True,
     "direction": "fwd", "tflops": 470.0},
    {"kind": "varlen", "kernel": "FA4 varlen", "dtype": "fp16", "causal": True,
     "direction": "fwd", "tflops": None, "error": "ImportError"},
]  # fmt: skip


def test_decode_rows_group_by_heads_and_tq_and_order_by_bytes() -> None:
    panels = serving_plot.decode_panels(ROWS)
    assert list(panels) == [(32, 8, 1), (32, 8, 4), (8, 1, 1)]  # skipped rows draw nothing
    assert [r["b"] for r in panels[(8, 1, 1)]] == [1, 8]  # fewer bytes left
    got = serving_plot.decode_series(panels[(8, 1, 1)][1])
    assert got == {"flashgen": 1500.0, "paged16": None, "paged256": None, "peer": 1700.0,
                   "copy": 4000.0}  # fmt: skip
    assert serving_plot.decode_series(panels[(32, 8, 1)][0])["peer"] == 1700.0  # the best peer


def test_varlen_bars_keep_the_timed_kernels_per_group() -> None:
    assert serving_plot.varlen_groups(ROWS) == {
        "bf16 fwd causal": {"flashgen varlen": 480.0, "FA4 varlen": 470.0}
    }


def test_no_timed_row_writes_no_png(tmp_path: Path) -> None:
    assert not serving_plot.plot([ROWS[3]], tmp_path / "s.png")
    assert not (tmp_path / "s.png").exists()


def test_the_png_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    assert serving_plot.plot(ROWS, tmp_path / "s.png", "H100")
    assert (tmp_path / "s.png").stat().st_size > 10_000
