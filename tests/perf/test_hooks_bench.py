"""scripts/hooks_bench.py on the CPU: arguments, rows, the kept-pair counts against brute force,
the JSON's shape, and the one-line exit when torch or CUDA is missing (torch faked: fast)."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "hooks_bench.py"


def _load() -> Any:
    spec = importlib.util.spec_from_file_location("hooks_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["hooks_bench"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


hb = _load()


def test_defaults_parse_to_the_issue_grid() -> None:
    a = hb.parse_args([])
    assert (a.masks, a.dims, a.lengths, a.modes) == (
        ["document", "prefix_lm"], [64, 128], [4096, 16384], ["fwd", "fwd+bwd"]
    )  # fmt: skip
    assert a.rounds == 3 and a.docs == 16 and a.prefix == 1024 and a.timing == "events"
    assert a.impls == ["flashgen", "flashgen-map", "flex", "fa4", "fa4-blocks", "builtin"]
    assert a.hook_cost == list(hb.HOOK_COST) and not a.no_hook_cost


def test_arguments_select_and_refuse() -> None:
    a = hb.parse_args(["--masks", "document", "--d", "128", "--t", "16384", "--modes", "fwd",
                       "--impls", "flashgen,flex", "--rounds", "5", "--no-hook-cost"])  # fmt: skip
    assert (a.masks, a.dims, a.lengths, a.modes, a.rounds) == (
        ["document"], [128], [16384], ["fwd"], 5
    )  # fmt: skip
    assert [r.key for r in hb.planned_rows(a)] == ["document d128 T16384 fwd"]
    for bad in (["--d", "96"], ["--masks", "causal"], ["--impls", "sdpa"], ["--rounds", "0"],
                ["--t", "3000"], ["--docs", "0"], ["--modes", "bwd"]):  # fmt: skip
        with pytest.raises(SystemExit):
            hb.parse_args(bad)


def test_rows_enumerate_masks_dims_lengths_modes_with_the_protocol_shapes() -> None:
    rows = hb.planned_rows(hb.parse_args([]))
    mask = [r for r in rows if r.kind == "mask"]
    assert len(mask) == 2 * 2 * 2 * 2 and len({r.key for r in rows}) == len(rows)
    for r in mask:
        assert r.h * r.d == 2048 and r.b * r.t == 16384
    assert {(r.d, r.h) for r in mask} == {(64, 32), (128, 16)}
    assert {(r.t, r.b) for r in mask} == {(4096, 4), (16384, 1)}
    cost = [r for r in rows if r.kind == "hook_cost"]
    assert len(cost) == len(hb.HOOK_COST) * 2
    assert {(r.d, r.t, r.b, r.h) for r in cost} == {(128, 16384, 1, 16)}
    assert hb.shape(64, 32768) == (1, 32)
    with pytest.raises(ValueError):
        hb.shape(96, 4096)


def test_document_lengths_are_fixed_by_the_seed_and_fill_t() -> None:
    a = hb.doc_lengths(4096, 16, seed=0)
    assert a == hb.doc_lengths(4096, 16, seed=0) != hb.doc_lengths(4096, 16, seed=1)
    assert len(a) == 16 and sum(a) == 4096 and min(a) >= 1
    ids = hb.doc_ids(a)
    assert len(ids) == 4096 and ids == sorted(ids) and set(ids) == set(range(16))
    with pytest.raises(ValueError):
        hb.doc_lengths(8, 9)


@pytest.mark.parametrize("t", [1, 2, 7, 33, 64])
def test_kept_pairs_match_brute_force(t: int) -> None:
    for docs in sorted({1, min(3, t), t}):
        lengths = hb.doc_lengths(t, docs, seed=t)
        ids = hb.doc_ids(lengths)
        brute = sum(hb.keeps("document", i, j, ids=ids) for i in range(t) for j in range(t))
        assert hb.kept_pairs("document", t, lengths=lengths) == brute
    for prefix in (0, 1, 5, t, t + 4):
        brute = sum(hb.keeps("prefix_lm", i, j, prefix=prefix) for i in range(t) for j in range(t))
        assert hb.kept_pairs("prefix_lm", t, prefix=prefix) == brute
    for window in ((0, 0), (3, 0), (t, 0), (-1, 0)):
        brute = sum(hb.keeps("window", i, j, window=window) for i in range(t) for j in range(t))
        assert hb.kept_pairs("window", t, window=window) == brute
    for mask in ("full", "causal"):
        brute = sum(hb.keeps(mask, i, j) for i in range(t) for j in range(t))
        assert hb.kept_pairs(mask, t) == brute


def test_kept_pairs_refuse_what_they_cannot_count() -> None:
    with pytest.raises(ValueError):
        hb.kept_pairs("document", 10, lengths=[3, 3])
    with pytest.raises(ValueError):
        hb.kept_pairs("sliding", 10)


def test_flops_count_the_kept_pairs() -> None:
    row = hb.Row("mask", "prefix_lm", 128, 16384, 1, 16, "fwd")
    kept = hb.kept_pairs("prefix_lm", 16384, prefix=1024)
    assert hb.flops(row, kept) == 4.0 * 16 * kept * 128
    # the prefix adds its square's upper triangle to causal
    assert kept - hb.kept_pairs("causal", 16384) == 1024 * 1023 // 2


def _result(fwd: list[float], step: list[float] | None = None, kept: int = 1000) -> Any:
    samples = {"fwd": fwd} | ({"step": step} if step else {})
    return hb.ImplResult(status="ok", mask="document", kept_pairs=kept, samples=samples)


def test_record_json_schema_and_ratios(tmp_path: Path) -> None:
    row = hb.Row("mask", "document", 64, 4096, 4, 32, "fwd+bwd")
    impls = {
        "flashgen": _result([1.0, 1.0, 1.0], [3.0, 3.0, 3.0]),
        "flex": _result([2.0, 2.0, 2.0], [5.0, 5.0, 5.0]),
        "fa4": hb.ImplResult(status="skipped", reason="FA4 (flash_attn.cute) does not import"),
        "fa4-blocks": hb.ImplResult(status="wrong", reason="correctness check failed"),
    }
    rec = hb.row_record(row, impls)
    assert set(rec) == {"kind", "name", "key", "d", "t", "b", "h", "mode", "dtype", "impls",
                        "ratios"}  # fmt: skip
    fg = rec["impls"]["flashgen"]
    assert set(fg) == {"status", "reason", "mask", "kept_pairs", "flops_fwd", "check",
                       "ms_per_round", "ms_median", "tflops", "timing"}  # fmt: skip
    base = 4.0 * 4 * 32 * 1000 * 64
    assert fg["tflops"]["fwd"] == pytest.approx(base / 1e-3 / 1e12)
    assert fg["tflops"]["step"] == pytest.approx(3.5 * base / 3e-3 / 1e12)
    assert fg["tflops"]["bwd"] == pytest.approx(2.5 * base / 2e-3 / 1e12)  # step - fwd
    r = rec["ratios"]["flashgen/flex"]
    assert r["fwd"] == pytest.approx(2.0) and r["bwd"] == pytest.approx(1.5)
    assert set(rec["ratios"]) == {"flashgen/flex"}  # no ratio for skipped or wrong peers
    assert rec["impls"]["fa4"]["tflops"] == {} and rec["impls"]["fa4-blocks"]["status"] == "wrong"
    assert hb.bar_of(row, "flashgen/flex") == 1.3 and hb.bar_of(row, "flashgen/fa4") == 1.0
    assert hb.bar_of(row, "flashgen/builtin") is None

    cost = hb.Row("hook_cost", "softcap", 128, 16384, 1, 16, "fwd")
    crec = hb.row_record(cost, {"builtin": _result([1.0]), "hooked": _result([1.25])})
    assert crec["ratios"]["hooked/builtin"]["fwd"] == pytest.approx(0.8)
    assert hb.bar_of(cost, "hooked/builtin") == 0.98
    assert "BELOW" in hb.table([crec]) and "1.50x ok" in hb.table([rec])

    args = hb.parse_args(["--out", str(tmp_path / "x.json")])
    doc = hb.document(args, {"gpu": "test"}, [rec, crec], 0.0, True, ["a note"])
    hb.write_json(Path(args.out), doc)
    back = json.loads(Path(args.out).read_text())
    assert back["schema"] == hb.SCHEMA and back["complete"] is True
    assert {"env", "config", "protocol", "notes", "rows", "elapsed_s"} <= set(back)
    assert "excluded" in back["protocol"]["block_mask_build"]
    assert back["protocol"]["bars"]["hook_cost"] == 0.98 and len(back["rows"]) == 2


def test_row_masks_of_the_hook_cost_pairs() -> None:
    masks = {n: hb.row_mask(hb.Row("hook_cost", n, 128, 16384, 1, 16, "fwd")) for n in hb.HOOK_COST}
    assert masks["softcap"] == masks["alibi"] == "full"
    assert masks["causal-mask"] == masks["alibi-causal"] == "causal"
    assert masks["window-mask"] == masks["window+hook"] == "window"


@pytest.mark.parametrize(
    "fake", [None, types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False))]
)
def test_without_cuda_one_line_and_status_2(
    fake: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "torch", fake)  # None: `import torch` raises ImportError
    assert hb.main(["--out", str(tmp_path / "x.json")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("hooks_bench: needs")
    assert "Traceback" not in err and not (tmp_path / "x.json").exists()
