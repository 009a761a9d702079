"""The HBM traffic model against numbers worked out by hand (see the comments)."""

from __future__ import annotations

import pytest

from flashgen.generator.spec import KernelSpec
from flashgen.perf.traffic import (
    H200,
    attention_flops,
    flashgen_traffic,
    format_traffic,
    ideal_traffic,
    keys_loaded,
    seed_traffic,
    traffic_report,
    visible_keys,
)

MMA = KernelSpec(family="mma", d=64, br=128, bc=64, dtype="bf16", warps=4, stages=2)
# fp32, 16-row query tiles and 16-key tiles: small enough to count every tile by hand
SIMT_CAUSAL = KernelSpec(family="simt", d=16, br=16, bc=16, dtype="fp32", causal=True)


def test_h200_ridge_point_is_989_tflops_over_4_8_tbs() -> None:
    assert H200.tensor_ridge == pytest.approx(989e12 / 4.8e12)
    assert round(H200.tensor_ridge) == 206
    assert round(H200.cuda_core_ridge) == 14  # 67 TFLOP/s fp32 on CUDA cores


def test_flops_are_4_b_h_tq_tk_d_halved_when_causal() -> None:
    assert attention_flops(MMA, 1, 16, 8192, 8192) == 4 * 16 * 8192 * 8192 * 64
    causal = MMA.replace(causal=True)
    assert attention_flops(causal, 1, 16, 8192, 8192) == 2 * 16 * 8192 * 8192 * 64


def test_visible_keys_is_bottom_right_aligned_and_clamped() -> None:
    # Tq=40, Tk=24: row i sees keys j <= i - 16; a 16-row tile at q0 sees up to key q0 - 1
    assert [visible_keys(q0, 16, 40, 24, True) for q0 in (0, 16, 32)] == [0, 16, 24]
    assert visible_keys(0, 16, 40, 24, False) == 24
    # Tq < Tk: the first tile already sees Tk - Tq extra keys
    assert visible_keys(0, 16, 10, 100, True) == 100  # clamped at Tk
    assert visible_keys(0, 16, 100, 100, True) == 16


def test_keys_loaded_rounds_up_to_whole_tiles_clipped_at_tk() -> None:
    assert keys_loaded(0, 16, 24) == 0
    assert keys_loaded(16, 16, 24) == 16
    assert keys_loaded(17, 16, 24) == 24  # two tiles = 32 rows, but only 24 exist
    assert keys_loaded(17, 16, 100) == 32


def test_flashgen_order_noncausal_h200_problem() -> None:
    # B=1, H=16, T=8192, d=64 bf16: one head's Q is 8192*64*2 = 1 MiB
    t = flashgen_traffic(MMA, 1, 16, 8192, 8192)
    head = 8192 * 64 * 2
    assert t.read["Q"] == 16 * head == 16_777_216
    # K and V: the whole head once per query tile, 8192/128 = 64 tiles
    assert t.read["K"] == t.read["V"] == 64 * 16 * head == 1_073_741_824
    assert t.written == {"O": 16_777_216, "LSE": 16 * 8192 * 4}
    assert t.total == 2_181_562_368
    assert t.flops == 274_877_906_944
    assert t.intensity == pytest.approx(274_877_906_944 / 2_181_562_368)  # 126.0 FLOP/B


def test_seed_order_noncausal_h200_problem() -> None:
    t = seed_traffic(MMA, 1, 16, 8192, 8192)
    head = 8192 * 64 * 2
    # K and V once; then for each of 8192/64 = 128 K/V tiles: all of Q read, all of O read and
    # written, m and l (fp32) read and written
    assert t.read["K"] == t.read["V"] == 16 * head
    assert t.read["Q"] == t.read["O"] == t.written["O"] == 128 * 16 * head
    assert t.read["m,l"] == t.written["m,l"] == 128 * 16 * 8192 * 8
    assert t.total == 6_744_440_832
    assert t.intensity == pytest.approx(40.756, abs=1e-3)


def test_causal_tq_greater_than_tk_counts_only_visible_tiles() -> None:
    # B=1, H=1, Tq=40, Tk=24, d=16 fp32 (64 B per row), tiles 16x16, causal.
    # Query tiles at 0, 16, 32 see 0, 16, 24 keys -> load 0, 16, 24 key rows.
    t = flashgen_traffic(SIMT_CAUSAL, 1, 1, 40, 24)
    assert t.read == {"Q": 40 * 64, "K": 40 * 64, "V": 40 * 64}
    assert t.written == {"O": 40 * 64, "LSE": 40 * 4}
    assert t.flops == 4 * 40 * 24 * 16 // 2
    # seed order: pairs (tile 16, K/V tile 0), (tile 32, K/V 0), (tile 32, K/V 1):
    # query rows 16 + 8 + 8 = 32; K/V tiles 0 and 1 hold 24 rows, each read once
    s = seed_traffic(SIMT_CAUSAL, 1, 1, 40, 24)
    assert s.read == {"Q": 32 * 64, "K": 24 * 64, "V": 24 * 64, "O": 32 * 64, "m,l": 32 * 8}
    assert s.written == {"O": 32 * 64, "m,l": 32 * 8}
    ideal = ideal_traffic(SIMT_CAUSAL, 1, 1, 40, 24)
    assert ideal.total == 40 * 64 + 2 * 24 * 64 + 40 * 64 + 40 * 4


def test_report_predicts_the_bound_against_the_variants_own_roof() -> None:
    rep = traffic_report(MMA)
    assert rep["problem"] == {"B": 1, "H": 16, "Tq": 8192, "Tk": 8192, "d": 64, "dtype": "bf16"}
    assert rep["math_unit"] == "tensor cores" and rep["ridge"] == pytest.approx(206.042, 1e-4)
    flash, seed = rep["orders"]["flashgen"], rep["orders"]["seed"]
    assert flash["intensity"] == pytest.approx(126.0, abs=0.05) and flash["bound"] == "memory"
    assert seed["intensity"] == pytest.approx(40.756, abs=1e-3) and seed["bound"] == "memory"
    assert rep["orders"]["ideal"]["bound"] == "compute"
    # roofline lower bound: the slower roof, here HBM: 2.18 GB / 4.8 TB/s
    assert flash["time_lower_bound_s"] == pytest.approx(2_181_562_368 / 4.8e12)
    # simt runs on CUDA cores: the same intensity is compute-bound against a ridge of 14
    simt = traffic_report(KernelSpec(family="simt", d=64, br=32, bc=32, dtype="fp32"))
    assert simt["math_unit"] == "CUDA cores" and simt["ridge"] == pytest.approx(13.958, 1e-3)
    assert simt["orders"]["flashgen"]["bound"] == "compute"


def test_report_rejects_an_empty_problem() -> None:
    with pytest.raises(ValueError, match="Tk=0: must be >= 1"):
        traffic_report(MMA, tk=0)


def test_format_names_both_orders_and_the_ridge() -> None:
    text = "\n".join(format_traffic(traffic_report(MMA)))
    assert "ridge 206 FLOP/B" in text
    assert "flashgen order" in text and "seed order" in text
    assert "126.0 FLOP/B -> memory-bound" in text
    assert "40.8 FLOP/B -> memory-bound" in text
