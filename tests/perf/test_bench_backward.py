"""Backward rows of `flashgen bench` without a GPU: their FLOPs, directions kept apart in the
tables, the JSON (old files have no `direction`), `--no-backward`, and the cases that get none.

The timing itself needs torch with CUDA; `bench_backward_case`'s bookkeeping is checked on the
CPU build of torch with the forwards and the timer faked (skipped without torch).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli.test_cli import run, sandbox  # noqa: F401

from flashgen.cli import perf as cli_perf
from flashgen.perf import bench
from flashgen.perf.bench import BenchResult, Case, Row
from perf._bench_cli import fake_gpu, quick_flags


def _row(impl: str, tflops: float | None, direction: str = "fwd", t: int = 4096,
         causal: bool = False) -> Row:  # fmt: skip
    case = Case("bf16", 128, causal, t)
    return Row(impl, "v" if impl == "flashgen" else None, "bf16", 128, causal, t, case.b,
               case.h, 1.0 if tflops else None, tflops, direction=direction)  # fmt: skip


# ---- FLOPs -------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
def test_backward_flops_are_two_and_a_half_forwards(causal: bool) -> None:
    case = Case("bf16", 64, causal, 4096)
    fwd = 4.0 * case.b * case.h * 4096 * 4096 * 64 * (0.5 if causal else 1.0)
    assert case.b * 4096 == bench.TOKENS and case.h * 64 == bench.MODEL_DIM
    assert case.flops == fwd
    assert case.bwd_flops == 2.5 * fwd


def test_a_backward_row_counts_backward_flops() -> None:
    case = Case("fp16", 128, True, 16384)
    fwd = bench._row("sdpa-flash", None, case, 2.0)
    bwd = bench._row("sdpa-flash", None, case, 2.0, direction="bwd")
    assert fwd.direction == "fwd" and bwd.direction == "bwd"
    assert fwd.tflops == pytest.approx(case.flops / 2e-3 / 1e12)
    assert bwd.tflops == pytest.approx(case.bwd_flops / 2e-3 / 1e12)
    assert bwd.tflops == pytest.approx(2.5 * fwd.tflops)
    assert bench._row("fa4", None, case, None, direction="bwd", error="x").tflops is None


# ---- which cases -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dtype", "d", "supported"),
    [("bf16", 64, True), ("fp16", 128, True), ("bf16", 32, True), ("fp32", 64, False),
     ("bf16", 256, False), ("fp16", 192, False)],
)  # fmt: skip
def test_only_fp16_bf16_up_to_d128_get_backward_rows(
    monkeypatch: pytest.MonkeyPatch, dtype: str, d: int, supported: bool
) -> None:
    case = Case(dtype, d, False, 1024)
    assert bench.backward_supported(case) is supported
    if not supported:  # no rows, and no torch needed to say so

        def no_torch() -> Any:
            raise bench.BenchUnavailable("torch touched")

        monkeypatch.setattr(bench, "_torch", no_torch)
        assert bench.bench_backward_case(case) == []


# ---- tables keep the directions apart ----------------------------------------------------------
def test_best_rows_and_summary_table_keep_directions_apart() -> None:
    rows = [
        _row("flashgen", 600.0), _row("sdpa-flash", 400.0), _row("sdpa-cudnn", 500.0),
        _row("flashgen", 300.0, "bwd"), _row("sdpa-flash", 250.0, "bwd"),
        _row("sdpa-cudnn", 360.0, "bwd"), _row("fa4", None, "bwd"),
    ]  # fmt: skip
    fwd, bwd = bench.best_rows(rows), bench.best_rows(rows, "bwd")
    assert {r.direction for r in fwd.values()} == {"fwd"}
    assert {r.direction for r in bwd.values()} == {"bwd"}
    assert fwd[("bf16", 128, False, 4096, "flashgen")].tflops == 600.0
    assert bwd[("bf16", 128, False, 4096, "flashgen")].tflops == 300.0
    [f] = bench.summary_table(rows)
    [b] = bench.summary_table(rows, "bwd")
    assert f["flashgen"] == 600.0 and f["x_sdpa-flash"] == pytest.approx(1.5)
    assert b["flashgen"] == 300.0 and b["x_sdpa-flash"] == pytest.approx(300 / 250)
    assert b["x_sdpa-cudnn"] == pytest.approx(300 / 360)
    assert b["sdpa-efficient"] is None and b["fa4"] is None  # not timed, or failed


def test_a_slower_backward_never_hides_behind_a_faster_forward() -> None:
    # the same (case, impl) in both directions: each table keeps its own, not the max
    rows = [_row("flashgen", 900.0), _row("flashgen", 100.0, "bwd")]
    assert bench.summary_table(rows, "bwd")[0]["flashgen"] == 100.0
    assert bench.summary_table(rows)[0]["flashgen"] == 900.0
    assert bench.summary_table([_row("flashgen", 100.0, "bwd")]) == []


def test_printed_backward_table_has_ratios_against_fa2_and_cudnn() -> None:
    rows = [_row("flashgen", 600.0), _row("sdpa-flash", 400.0),
            _row("flashgen", 300.0, "bwd"), _row("sdpa-flash", 250.0, "bwd"),
            _row("sdpa-cudnn", 375.0, "bwd")]  # fmt: skip
    fwd = cli_perf.summary_lines(rows, "fwd")
    bwd = cli_perf.summary_lines(rows, "bwd")
    assert "effic." in fwd[0] and "effic." not in bwd[0]
    assert "x FA2" in bwd[0] and "x cuDNN" in bwd[0] and "FA4" not in bwd[0]
    assert bwd[-1].split()[-3:] == ["1.20", "0.80", "v"]
    assert cli_perf.summary_lines(rows[:2], "bwd") == []  # no backward rows: no table
    assert cli_perf.summary_lines([], "fwd")  # the forward's header always prints


def test_plot_draws_backward_panels_after_the_forward(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rows = [_row("flashgen", 600.0), _row("flashgen", 300.0, "bwd"),
            _row("sdpa-flash", 250.0, "bwd", t=8192)]  # fmt: skip
    bench.plot(rows, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0


# ---- JSON --------------------------------------------------------------------------------------
def test_json_round_trip_keeps_the_direction() -> None:
    rows = [_row("flashgen", 600.0), _row("sdpa-cudnn", 350.0, "bwd"), _row("fa4", None, "bwd")]
    rows[-1].error = "ImportError: no flash_attn"
    res = BenchResult(env={"gpu": "H200"}, rows=rows, memory={"T": 8192})
    data = json.loads(res.to_json())
    assert [r["direction"] for r in data["rows"]] == ["fwd", "bwd", "bwd"]
    back = BenchResult.from_json(res.to_json())
    assert back.rows == rows and back.env == res.env and back.memory == res.memory


def test_json_written_before_backward_rows_reads_as_forward_rows() -> None:
    old = json.loads(BenchResult(env={}, rows=[_row("flashgen", 600.0)]).to_json())
    for r in old["rows"]:
        del r["direction"]
    old["overhead"] = [{"impl": "sdpa", "dtype": "bf16", "b": 1, "h": 8, "t": 1, "d": 128,
                        "causal": False, "us": 20.0, "p90_us": 21.0, "calls": 100}]  # fmt: skip
    back = BenchResult.from_json(json.dumps(old))
    [row] = back.rows
    assert row.direction == "fwd" and row == _row("flashgen", 600.0)
    assert back.overhead[0].us == 20.0 and back.overhead[0].x_sdpa is None
    assert bench.summary_table(back.rows)[0]["flashgen"] == 600.0


# ---- the CLI -----------------------------------------------------------------------------------
def _fake_bench(monkeypatch: pytest.MonkeyPatch) -> list[Case]:
    """`flashgen bench` with every GPU step faked; returns the cases the backward saw."""
    seen: list[Case] = []
    fake_gpu(monkeypatch)

    def fwd(case: Case, specs: Any, peers: Any = None, reps: int = 30) -> list[Row]:
        return [bench._row("flashgen", "fwd-v", case, 1.0),
                bench._row("sdpa-flash", None, case, 2.0)]  # fmt: skip

    def bwd(case: Case, peers: Any = None, reps: int = 30) -> list[Row]:
        seen.append(case)
        assert tuple(peers) == bench.available_bwd_peers()
        return [bench._row("flashgen", "bwd-v", case, 2.0, direction="bwd"),
                bench._row("sdpa-flash", None, case, 3.0, direction="bwd"),
                bench._row("sdpa-cudnn", None, case, None, direction="bwd",
                           error="RuntimeError: no cuDNN")]  # fmt: skip

    monkeypatch.setattr(bench, "bench_case", fwd)
    monkeypatch.setattr(bench, "bench_backward_case", bwd)
    return seen


_QUICK = ["--dtype", "bf16", *quick_flags("--t", "4096", "--no-serving", "--no-training")]


def test_bench_times_the_backward_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _fake_bench(monkeypatch)
    result = run("bench", *_QUICK)
    assert result.exit_code == 0, result.output
    assert sorted((c.t, c.causal) for c in seen) == [(1024, False), (1024, True),
                                                     (4096, False), (4096, True)]  # fmt: skip
    out = result.stdout
    assert "backward alone" in out and "x FA2" in out and "x cuDNN" in out
    bwd_part = out.split("backward alone")[1]
    assert "bwd-v" in bwd_part and "fwd-v" not in bwd_part
    assert "1.50" in bwd_part  # flashgen 2 ms vs FA2 3 ms
    assert "sdpa-cudnn  T=1024 bwd: RuntimeError: no cuDNN" in result.stderr
    [path] = Path("out").glob("*.json")
    rows = BenchResult.from_json(path.read_text()).rows
    assert sum(r.direction == "bwd" for r in rows) == 4 * 3
    assert sum(r.direction == "fwd" for r in rows) == 4 * 2


def test_no_backward_skips_the_backward_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _fake_bench(monkeypatch)
    result = run("bench", *_QUICK, "--no-backward")
    assert result.exit_code == 0, result.output
    assert seen == []
    assert "backward alone" not in result.stdout
    [path] = Path("out").glob("*.json")
    assert {r["direction"] for r in json.loads(path.read_text())["rows"]} == {"fwd"}


def test_bench_help_names_the_backward_switch_and_its_range() -> None:
    text = " ".join(run("bench", "--help").stdout.split())
    assert "--backward / --no-backward" in text
    assert "fp32 or d > 128 cases silently get none" in text


def test_the_cli_skips_cases_outside_the_backward_range(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _fake_bench(monkeypatch)
    monkeypatch.setattr(bench, "backward_supported", lambda case: case.t != 4096)
    result = run("bench", *_QUICK)
    assert result.exit_code == 0, result.output
    assert {c.t for c in seen} == {1024}


# ---- bench_backward_case's bookkeeping, on the CPU build of torch ------------------------------
def test_bench_backward_case_rows_errors_and_gradient_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch = pytest.importorskip("torch")
    case = Case("bf16", 64, True, 1024)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    forwards: list[str] = []

    def inputs(c: Case, seed: int = 0) -> tuple[Any, ...]:
        g = torch.Generator().manual_seed(seed)
        return tuple(torch.randn(1, 2, 32, 16, generator=g) for _ in range(3))

    def forward(impl: str, q: Any, k: Any, v: Any, causal: bool) -> tuple[Any, Any]:
        forwards.append(impl)
        assert q.requires_grad and causal
        if impl == "sdpa-cudnn":
            raise RuntimeError("No available kernel")
        return sdpa(q, k, v, is_causal=causal), (q, k, v)

    calls: list[int] = []

    def timer(fn: Any, warmup: int = 5, reps: int = 30) -> float:
        grads = fn()  # the timed call is autograd.grad: one gradient per input
        calls.append(len(grads))
        return 4.0

    monkeypatch.setattr(bench, "_torch", lambda: torch)
    monkeypatch.setattr(bench, "_inputs", inputs)
    monkeypatch.setattr(bench, "backward_forward", forward)
    monkeypatch.setattr(bench, "time_ms", timer)
    monkeypatch.setattr(bench, "_bwd_variant", lambda c, q, k, v: "mma_bwd_d64")
    rows = bench.bench_backward_case(case, peers=("sdpa-flash", "sdpa-cudnn"), reps=7)
    assert forwards == ["sdpa-flash", "sdpa-cudnn", "flashgen"]  # each forward runs once
    assert [r.impl for r in rows] == ["sdpa-flash", "sdpa-cudnn", "flashgen"]
    assert {r.direction for r in rows} == {"bwd"} and calls == [3, 3]
    fa2, cudnn, ours = rows
    assert fa2.ms == 4.0 and fa2.tflops == pytest.approx(case.bwd_flops / 4e-3 / 1e12)
    assert cudnn.ms is None and cudnn.tflops is None
    assert cudnn.error == "RuntimeError: No available kernel"
    assert ours.variant == "mma_bwd_d64" and ours.max_err_vs_flash == 0.0
    assert fa2.max_err_vs_flash is None
    assert bench.summary_table(rows, "bwd")[0]["x_sdpa-flash"] == pytest.approx(1.0)


def test_bench_d256_gets_forward_rows_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # d = 256 is outside the backward's range: `--d 256` times the forward, the backward skips it
    seen = _fake_bench(monkeypatch)
    args = ["--dtype", "bf16", "--d", "64", "--d", "256", "--t", "4096", "--no-memory",
            "--no-overhead", "--no-features", "--no-serving", "--no-training", "--out",
            "out"]  # fmt: skip
    result = run("bench", *args)
    assert result.exit_code == 0, result.output
    assert {c.d for c in seen} == {64}
    [path] = Path("out").glob("*.json")
    rows = json.loads(path.read_text())["rows"]
    assert {(r["d"], r["direction"]) for r in rows} == {(64, "fwd"), (64, "bwd"), (256, "fwd")}
    assert {r["h"] for r in rows if r["d"] == 256} == {8}  # H * d = 2048
