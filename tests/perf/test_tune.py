"""`flashgen tune`'s candidates and winner (flashgen/perf/tune.py), and what a table may name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashgen.generator import select as select_mod
from flashgen.generator import tables
from flashgen.generator.space import shipped
from flashgen.perf.tune import candidates, pick_winner


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_candidates_are_the_plain_shipped_tensor_core_variants(arch: str) -> None:
    for d, causal in ((64, False), (128, True)):
        got = candidates(d, "bf16", causal, arch)
        assert got and all(not s.features for s in got)
        assert all((s.d, s.dtype, s.causal) == (d, "bf16", causal) for s in got)
        families = {s.family for s in got}
        assert families == ({"mma", "wgmma"} if arch == "sm_90" else {"mma"})
        # every plain shipped variant of those families is there; the feature ones are not
        want = {s for f in families for s in shipped(f)
                if (s.d, s.dtype, s.causal) == (d, "bf16", causal) and not s.features}  # fmt: skip
        assert set(got) == want
        assert any(s.features for f in families for s in shipped(f) if s.d == d)


def test_the_winner_is_the_best_geometric_mean_over_every_length() -> None:
    o = pick_winner("d64_bf16_causal", {
        "a": {4096: 400.0, 16384: 500.0},   # geomean 447
        "b": {4096: 450.0, 16384: 460.0},   # geomean 455: wins
        "c": {4096: 900.0},                 # one length only: not scored
        "d": {},
    })  # fmt: skip
    assert o.winner == "b" and round(o.geomean_tflops) == 455


def test_a_table_naming_a_feature_variant_is_not_used_for_plain_calls(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    window = next(s for s in shipped("wgmma") if s.features == ("window",) and s.d == 128)
    key = tables.entry_key(window.d, window.dtype, window.causal)
    (tmp_path / "some-gpu.json").write_text(
        json.dumps({"arch": "sm_90", "entries": {key: {"variant": window.name}}})
    )
    monkeypatch.setattr(tables, "table_dir", lambda: tmp_path)
    tables.load_table.cache_clear()
    try:
        assert select_mod.lookup("Some GPU", window.d, window.dtype, window.causal) is None
        plain = select_mod.select(
            window.d, window.dtype, window.causal, "sm_90", gpu_name="Some GPU"
        )
        assert not plain.features
    finally:
        tables.load_table.cache_clear()
