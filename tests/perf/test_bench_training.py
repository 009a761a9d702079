"""`flashgen bench`'s training-step rows without a GPU: the row set and its FLOPs, each
implementation's step on (B, T, H, d) views of a packed projection (on the CPU build of torch,
flashgen's op and FA4 faked), interleaved rounds, error rows, the ratios and the table, the JSON
(old files have no `training`) and the CLI's `--training/--no-training`."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from cli.test_cli import run, sandbox  # noqa: F401

from flashgen.perf import bench
from flashgen.perf import bench_training as bt
from flashgen.perf.bench import BenchResult
from perf._bench_cli import fake_gpu, no_kernel_rows, quick_flags


# ---- the row set -------------------------------------------------------------------------------
def test_training_cases_are_the_issues_rows() -> None:
    cases = bt.training_cases()
    assert [(c.d, c.causal) for c in cases] == [(64, False), (64, True), (128, False), (128, True)]
    assert {(c.b, c.t, c.dtype) for c in cases} == {(2, 8192, "bf16")}
    assert [c.h for c in cases] == [32, 32, 16, 16]  # H x d = 2048
    assert cases[3].label == "d128 causal B2 T8192"
    both = bt.training_cases(("fp16", "bf16"))
    assert [c.dtype for c in both] == ["fp16"] * 4 + ["bf16"] * 4
    assert [(c.d, c.causal) for c in both[4:]] == [(c.d, c.causal) for c in cases]


def test_a_step_is_three_and_a_half_forwards_of_flops() -> None:
    case = bt.TrainCase(128, False)
    fwd = 4.0 * 2 * 16 * 8192 * 8192 * 128
    assert case.flops == 3.5 * fwd
    assert bt.TrainCase(128, True).flops == case.flops / 2


# ---- training_row on the CPU build of torch ----------------------------------------------------
@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> Any:
    """torch on the CPU; bt's inputs at B 1, T 8, H 2, d 4 on the CPU; flashgen's op faked by
    plain attention on its (B, H, T, d) arguments."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(bench, "_torch", lambda: torch)

    def inputs(case: bt.TrainCase) -> tuple[Any, Any]:
        g = torch.Generator().manual_seed(0)
        qkv = torch.randn((1, 8, 3, 2, 4), generator=g, dtype=torch.float64)
        return qkv.requires_grad_(), torch.randn((1, 8, 2, 4), generator=g, dtype=torch.float64)

    monkeypatch.setattr(bt, "_inputs", inputs)
    seen: dict[str, Any] = {}

    def attention(q: Any, k: Any, v: Any, causal: bool = False) -> Any:
        seen["shape"], seen["causal"] = tuple(q.shape), causal
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    import flashgen

    monkeypatch.setattr(flashgen, "torch", types.SimpleNamespace(attention=attention),
                        raising=False)  # fmt: skip
    monkeypatch.setitem(sys.modules, "flashgen.torch", types.SimpleNamespace(attention=attention))
    return seen


def _fa4(fn: Any) -> None:
    mod = types.ModuleType("flash_attn.cute.interface")
    mod.flash_attn_func = fn  # type: ignore[attr-defined]
    sys.modules["flash_attn.cute.interface"] = mod


def test_every_step_differentiates_back_to_the_packed_projection(small: Any) -> None:
    torch = pytest.importorskip("torch")
    qkv, do = bt._inputs(bt.TrainCase(64, True))
    grads = {impl: bt.step_fn(impl, qkv, do, True)() for impl in ("flashgen", "sdpa")}
    assert small == {"shape": (1, 2, 8, 4), "causal": True}  # flashgen's op layout (B, H, T, d)
    assert grads["sdpa"].shape == qkv.shape == (1, 8, 3, 2, 4)
    torch.testing.assert_close(grads["flashgen"], grads["sdpa"])
    # FA4 gets the (B, T, H, d) views themselves
    got: dict[str, Any] = {}

    def fa4(q: Any, k: Any, v: Any, causal: bool) -> Any:
        got["shape"] = tuple(q.shape)
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal
        )
        return o.transpose(1, 2), None

    saved = sys.modules.get("flash_attn.cute.interface")
    try:
        _fa4(fa4)
        g = bt.step_fn("fa4", qkv, do, True)()
    finally:
        if saved is None:
            sys.modules.pop("flash_attn.cute.interface", None)
        else:
            sys.modules["flash_attn.cute.interface"] = saved
    assert got["shape"] == (1, 8, 2, 4)
    torch.testing.assert_close(g, grads["sdpa"])
    with pytest.raises(ValueError, match="impl='x'"):
        bt.step_fn("x", qkv, do, True)


def test_rows_interleave_rounds_and_record_a_failing_peer(
    small: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "fa4_available", lambda: True)

    def fa4(*a: Any, **k: Any) -> Any:
        raise RuntimeError("sm_90 only")

    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", types.SimpleNamespace(
        flash_attn_func=fa4))  # fmt: skip
    order: list[str] = []
    times = {"flashgen": 2.0, "sdpa": 3.0}

    def timer(fn: Any, reps: int = 30) -> float:
        grad = fn()
        assert grad.shape == (1, 8, 3, 2, 4) and reps == 7
        impl = "flashgen" if fn is steps["flashgen"] else "sdpa"
        order.append(impl)
        return times[impl]

    steps: dict[str, Any] = {}
    real_step = bt.step_fn

    def step_fn(impl: str, *a: Any) -> Any:
        steps[impl] = real_step(impl, *a)
        return steps[impl]

    monkeypatch.setattr(bt, "step_fn", step_fn)
    monkeypatch.setattr(bench, "time_ms", timer)
    case = bt.TrainCase(128, False)
    rows = bt.training_row(case, reps=7, rounds=2)
    by = {r["impl"]: r for r in rows}
    assert list(by) == ["flashgen", "sdpa", "fa4"]
    assert order == ["sdpa", "flashgen", "sdpa", "flashgen"]  # once a round each
    assert by["fa4"]["error"] == "RuntimeError: sm_90 only" and by["fa4"]["ms"] is None
    assert by["flashgen"]["ms"] == 2.0 and by["flashgen"]["tflops"] == case.flops / 2e-3 / 1e12
    assert by["flashgen"]["max_err_vs_sdpa"] < 1e-12 and "max_err_vs_sdpa" not in by["sdpa"]
    assert {r["kind"] for r in rows} == {"training"} and by["sdpa"]["h"] == 16
    headers, lines = bt.training_table(rows)
    assert headers == ["dtype", "d", "causal", "B", "T", "flashgen ms (TFLOP/s)",
                       "sdpa ms (TFLOP/s)", "fa4 ms (TFLOP/s)", "x peer"]  # fmt: skip
    assert lines == [["bf16", "128", "no", "2", "8192", f"2.00 ({case.flops / 2e-3 / 1e12:.0f})",
                      f"3.00 ({case.flops / 3e-3 / 1e12:.0f})", "error", "1.50"]]  # fmt: skip
    assert by["flashgen"]["x_sdpa"] == 1.5 and "x_fa4" not in by["flashgen"]


def test_without_peers_only_flashgen_is_timed_but_sdpa_still_checks_it(
    small: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    timed: list[Any] = []
    monkeypatch.setattr(bench, "time_ms", lambda fn, reps=30: timed.append(fn) or 1.0)
    rows = bt.training_row(bt.TrainCase(64, True), peers=False, rounds=3)
    assert [r["impl"] for r in rows] == ["flashgen"] and len(timed) == 3
    assert rows[0]["max_err_vs_sdpa"] < 1e-12
    assert bt.training_table(rows)[1] == [["bf16", "64", "yes", "2", "8192", "1.00 (" +
                                          f"{bt.TrainCase(64, True).flops / 1e-3 / 1e12:.0f})",
                                          "-"]]  # fmt: skip


# ---- JSON and the CLI --------------------------------------------------------------------------
def test_json_round_trip_keeps_the_training_rows() -> None:
    row = {"kind": "training", "impl": "flashgen", "d": 64, "ms": 1.0}
    back = BenchResult.from_json(BenchResult(env={}, training=[row]).to_json())
    assert back.training == [row]
    assert "training" not in json.loads(BenchResult(env={}).to_json())
    assert BenchResult.from_json(json.dumps({"env": {}, "rows": []})).training == []


def _fake_bench(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    seen: list[Any] = []
    fake_gpu(monkeypatch)
    no_kernel_rows(monkeypatch)

    def training_row(case: bt.TrainCase, peers: bool = True, reps: int = 30) -> list[Any]:
        seen.append((case, peers))
        base = {"kind": "training", "dtype": case.dtype, "d": case.d, "causal": case.causal,
                "b": case.b, "t": case.t, "h": case.h}  # fmt: skip
        return [{**base, "impl": "flashgen", "ms": 10.0, "tflops": 100.0},
                {**base, "impl": "sdpa", "ms": 12.0, "tflops": 80.0},
                {**base, "impl": "fa4", "ms": None, "tflops": None, "error": "ImportError: x"}]

    monkeypatch.setattr(bt, "training_row", training_row)
    return seen


_QUICK = quick_flags("--no-serving")


def test_bench_runs_the_training_rows_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _fake_bench(monkeypatch)
    result = run("bench", *_QUICK)
    assert result.exit_code == 0, result.output
    assert [c for c, _ in seen] == bt.training_cases() and {p for _, p in seen} == {True}
    assert "training step (" in result.stdout and " 1.20" in result.stdout
    assert "training fa4 bf16 d=128 causal=True: ImportError: x" in result.stderr
    [path] = Path("out").glob("*.json")
    assert len(BenchResult.from_json(path.read_text()).training) == 12


@pytest.mark.parametrize(("flags", "want"), [
    (["--no-training"], []),
    (["--causal", "--no-peers"], [(64, True, False), (128, True, False)]),
])  # fmt: skip
def test_training_options_select_the_rows(
    monkeypatch: pytest.MonkeyPatch, flags: list[str], want: list[Any]
) -> None:
    seen = _fake_bench(monkeypatch)
    result = run("bench", *_QUICK, *flags)
    assert result.exit_code == 0, result.output
    assert [(c.d, c.causal, p) for c, p in seen] == want
    assert ("training step" in result.stdout) is bool(want)
    [path] = Path("out").glob("*.json")
    assert ("training" in json.loads(path.read_text())) is bool(want)


@pytest.mark.parametrize(("dtypes", "want"), [
    (["fp16"], ["fp16"]),
    (["bf16", "fp16"], ["bf16", "fp16"]),
])  # fmt: skip
def test_the_training_rows_follow_the_asked_dtypes(
    monkeypatch: pytest.MonkeyPatch, dtypes: list[str], want: list[str]
) -> None:
    """`--dtype fp16` times fp16 steps (bf16 only when no --dtype is given)."""
    seen = _fake_bench(monkeypatch)
    flags = [x for t in dtypes for x in ("--dtype", t)]
    result = run("bench", *_QUICK, *flags)
    assert result.exit_code == 0, result.output
    assert list(dict.fromkeys(c.dtype for c, _ in seen)) == want
    assert len(seen) == 4 * len(want)
    table = result.stdout[result.stdout.index("training step ("):]
    assert all(t in table for t in want)
