"""`flashgen bench` and `flashgen tune`: the GPU-timing commands (registered on the main group)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import click

from flashgen.cli.app import CliError, env_arch, format_table, friendly
from flashgen.cli.group import main
from flashgen.generator.spec import KernelSpec
from flashgen.perf import bench as bench_mod

DEFAULT_RESULTS = Path("bench/results")


def _gpu_or_fail(command: str) -> tuple[str, str]:
    """(GPU name, arch) of device 0, or a one-line CliError naming `command` when torch,
    PyCUDA or a GPU is missing."""
    from flashgen.runtime import gpu as runtime

    env_arch()  # kernels are compiled for FLASHGEN_ARCH when it is set
    try:
        torch = bench_mod._torch()
        return str(torch.cuda.get_device_name(0)), runtime.device_arch()
    except (bench_mod.BenchUnavailable, runtime.GpuUnavailable) as exc:
        # the generator's message names `bench`; tune shares the requirement, not the name
        msg = re.sub(r"\bbench\b", command, str(exc))
        raise CliError(" ".join(msg.split())) from exc


def _progress() -> Any:
    """A rich progress bar on a terminal (silent when stderr is piped)."""
    from rich.progress import Progress

    return Progress(transient=False, disable=not sys.stderr.isatty())


def _fmt(x: float | None, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


@main.command(
    "bench",
    epilog="""\b
Examples:
  flashgen bench --plot                       # the whole protocol, JSON + PNG
  flashgen bench --d 128 --dtype bf16 --t 4096 --t 16384 --all-variants
  flashgen bench --dtype bf16 --t 4096 --t 16384 --no-features --no-overhead --no-serving
  flashgen bench --dtype bf16 --d 128 --t 4096 --no-features --no-memory --no-overhead
""",
)
@click.option("--dtype", "dtypes", multiple=True, type=click.Choice(bench_mod.DTYPES),
              help="Storage dtype(s) [default: bf16 and fp16].")  # fmt: skip
@click.option("--d", "head_dims", multiple=True, type=int,
              help="Head dim(s): multiples of 8 up to 256, H = 2048 // d heads [default: 64 and "
                   "128; above 128, forward rows only].")  # fmt: skip
@click.option("--t", "seq_lens", multiple=True, type=click.IntRange(min=16),
              help="Sequence length(s) [default: 512 ... 16384].")  # fmt: skip
@click.option("--causal/--no-causal", "causal_only", default=None,
              help="Causal only / non-causal only [default: both].")  # fmt: skip
@click.option("--all-variants", is_flag=True,
              help="Time every shipped mma variant, not just the tuned one.")  # fmt: skip
@click.option("--peers/--no-peers", default=True, show_default=True,
              help="Time torch SDPA backends too.")  # fmt: skip
@click.option("--reps", type=click.IntRange(min=3), default=bench_mod.REPS, show_default=True,
              help="CUDA-event timings per row; the median is reported.")  # fmt: skip
@click.option("--warmup-s", type=click.FloatRange(min=0.0), default=bench_mod.WARMUP_S,
              show_default=True,
              help="Seconds of back-to-back calls before each row's timed reps, so the "
                   "GPU clock has settled under its power cap (0: only the fixed warm-up "
                   "calls).")  # fmt: skip
@click.option("--memory/--no-memory", default=True, show_default=True,
              help="Extra peak memory at T=8192 vs naive attention.")  # fmt: skip
@click.option("--overhead/--no-overhead", default=True, show_default=True,
              help="Host overhead per call on small problems: flashgen.torch, GPUArray and "
                   "NumPy paths vs torch SDPA.")  # fmt: skip
@click.option("--features/--no-features", "feature_rows", default=True, show_default=True,
              help="GQA (32 query heads on 8 K/V heads) and sliding-window (4096 back, "
                   "causal) rows, each against the plain kernel and the peers with the "
                   "feature.")  # fmt: skip
@click.option("--backward/--no-backward", default=True, show_default=True,
              help="Backward rows: the backward alone (torch.autograd.grad after one forward, "
                   "FLOPs 2.5x the forward's) of flashgen.torch, SDPA's FA2 and cuDNN, and FA4 "
                   "when importable. Only fp16/bf16 cases with d <= 128 (the backward's range); "
                   "fp32 or d > 128 cases silently get none.")  # fmt: skip
@click.option("--serving/--no-serving", default=True, show_default=True,
              help="Serving rows: decode GB/s (bf16 d 128, GQA 32/8 and 8/1, Tq 1 and 4, "
                   "B 1-32, Tk 4k-128k; contiguous and paged caches vs SDPA, FlashInfer and a "
                   "device copy; only with bf16) and varlen prefill TFLOP/s of useful work (16 "
                   "packed sequences, 16384 tokens, causal unless --no-causal; vs dense at the "
                   "same token count and FA4), forward, and backward with --backward.")  # fmt: skip
@click.option("--training/--no-training", default=True, show_default=True,
              help="Training-step rows: forward + backward through autograd on (B, T, H, d) "
                   "views of a packed projection, host time included (B 2, T 8192, d 64 and "
                   "128, causal and not; in each --dtype, bf16 when none is given), against "
                   "SDPA's default and FA4 when importable.")  # fmt: skip
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=DEFAULT_RESULTS,
              show_default=True, help="Folder for the JSON (and PNG).")  # fmt: skip
@click.option("--plot", is_flag=True,
              help="Also write a PNG of TFLOP/s against T (backward panels after the "
                   "forward's), and one of the serving rows (<name>-serving.png).")  # fmt: skip
@friendly
def bench(
    dtypes: tuple[str, ...], head_dims: tuple[int, ...], seq_lens: tuple[int, ...],
    causal_only: bool | None, all_variants: bool, peers: bool, reps: int, warmup_s: float,
    memory: bool, overhead: bool, feature_rows: bool, backward: bool, serving: bool,
    training: bool, out: Path, plot: bool,
) -> None:  # fmt: skip
    """Time flashgen against torch SDPA (FA2, cuDNN, efficient) on this GPU, forward and
    backward; write JSON."""
    from flashgen.generator.select import select
    from flashgen.perf.tune import candidates

    for d in head_dims:
        why = bench_mod.head_dim_error(d)
        if why:
            raise CliError(why)
    gpu_name, arch = _gpu_or_fail("bench")
    bench_mod.WARMUP_S = warmup_s  # every row's time_ms (and the protocol in the JSON) reads it
    causal = (False, True) if causal_only is None else (causal_only,)
    todo = bench_mod.cases(
        dtypes or bench_mod.DTYPES,
        head_dims or bench_mod.HEAD_DIMS,
        seq_lens or bench_mod.SEQ_LENS,
        causal,
    )

    def specs_for(c: bench_mod.Case) -> list[KernelSpec]:
        if all_variants:
            return candidates(c.d, c.dtype, c.causal, arch)
        return [select(c.d, c.dtype, c.causal, arch, gpu_name=gpu_name)]

    result = bench_mod.BenchResult(env=bench_mod.environment())
    with _progress() as prog:
        task = prog.add_task("bench", total=len(todo))
        for c in todo:
            prog.update(task, description=f"{c.dtype} d={c.d} causal={c.causal} T={c.t}")
            result.rows += bench_mod.bench_case(
                c, specs_for(c), peers=bench_mod.available_peers() if peers else (), reps=reps
            )
            if backward and bench_mod.backward_supported(c):
                prog.update(task, description=f"{c.dtype} d={c.d} causal={c.causal} T={c.t} bwd")
                result.rows += bench_mod.bench_backward_case(
                    c, peers=bench_mod.available_bwd_peers() if peers else (), reps=reps
                )
            prog.advance(task)
    if feature_rows:
        from flashgen.perf import bench_features as bf

        todo_f = bf.feature_cases(dtypes or bench_mod.DTYPES)
        with _progress() as prog:
            task = prog.add_task("features", total=len(todo_f))
            for fc in todo_f:
                prog.update(task, description=f"{fc.label} {fc.dtype} causal={fc.causal} T={fc.t}")
                plain = select(fc.d, fc.dtype, fc.causal, arch, gpu_name=gpu_name)
                result.rows += bf.bench_feature_case(fc, plain, peers=peers, reps=reps)
                prog.advance(task)
    if serving:
        masks = (True,) if causal_only is None else (causal_only,)  # varlen: causal by default
        result.serving = serving_rows(dtypes or bench_mod.DTYPES, masks, peers, backward, reps)
    if training:
        result.training = training_rows(dtypes, causal, peers, reps)
    if memory:
        spec = select(64, "bf16", True, arch, gpu_name=gpu_name)
        result.memory = bench_mod.memory_comparison(spec)
    if overhead:
        result.overhead = bench_mod.host_overhead(causal=causal)

    click.echo(f"{gpu_name} ({arch}), TFLOP/s, median of {reps} CUDA-event timings")
    for line in summary_lines(result.rows, "fwd"):
        click.echo(line)
    bwd_lines = summary_lines(result.rows, "bwd")
    if bwd_lines:
        click.echo("backward alone (autograd.grad after one forward), TFLOP/s at 2.5x the "
                   "forward's FLOPs")  # fmt: skip
        for line in bwd_lines:
            click.echo(line)
    feats = []
    if feature_rows:
        from flashgen.perf import bench_features as bf

        feats = bf.feature_summary(result.rows)
    if feats:
        click.echo(f"features, TFLOP/s of useful work (x plain: the feature's cost; bar >= "
                   f"{bf.COST_BAR})")  # fmt: skip
        headers_f = ["feature", "dtype", "causal", "T", "flashgen", "plain", "x plain", "FA2",
                     "cuDNN", "FA4", "variant"]  # fmt: skip
        lines_f = [
            [x["feature"], x["dtype"], "yes" if x["causal"] else "no", x["T"],
             _fmt(x["flashgen"]), _fmt(x["plain"]), _fmt(x["x_plain"], 2),
             _fmt(x["sdpa-flash"]), _fmt(x["sdpa-cudnn"]), _fmt(x["fa4"]), x["variant"] or "-"]
            for x in feats
        ]  # fmt: skip
        for line in format_table(headers_f, lines_f):
            click.echo(line)
    for line in serving_lines(result.serving):
        click.echo(line)
    for line in training_lines(result.training):
        click.echo(line)
    if result.memory:
        m = result.memory
        click.echo(
            f"extra peak memory at B=1 H={m['H']} T={m['T']} d={m['d']} causal: naive "
            f"{m['naive_mib']:.1f} MiB, sdpa-flash {m['sdpa_flash_mib']:.1f} MiB, "
            f"flashgen {m['flashgen_mib']:.1f} MiB"
        )
    if result.overhead:
        click.echo("host overhead: median wall time per call (us), bf16")
        for line in format_table(*bench_mod.overhead_table(result.overhead)):
            click.echo(line)
        for o in result.overhead:
            if o.error:
                click.echo(f"note: overhead {o.impl} T={o.t}: {o.error}", err=True)
    errors = [r for r in result.rows if r.error]
    for r in errors:
        where = " bwd" if r.direction == "bwd" else ""
        click.echo(f"note: {r.impl} {r.variant or ''} T={r.t}{where}: {r.error}", err=True)
    if result.serving:
        from flashgen.perf import bench_serving as bs

        for note in bs.serving_notes(result.serving):
            click.echo(f"note: {note}", err=True)
    if result.training:
        from flashgen.perf import bench_training as bt

        for note in bt.error_notes(result.training):
            click.echo(f"note: {note}", err=True)
    out.mkdir(parents=True, exist_ok=True)
    path = bench_mod.result_path(result.env, out)
    path.write_text(result.to_json() + "\n")
    click.echo(f"wrote {path}")
    if plot:
        png = path.with_suffix(".png")
        bench_mod.plot(result.rows, png)
        click.echo(f"wrote {png}")
        from flashgen.perf import serving_plot

        serving_png = path.with_name(f"{path.stem}-serving.png")
        if serving_plot.plot(result.serving, serving_png, str(result.env.get("gpu", ""))):
            click.echo(f"wrote {serving_png}")


def summary_lines(rows: list[bench_mod.Row], direction: str) -> list[str]:
    """The printed table of one direction's rows: TFLOP/s per implementation, ratios x FA2
    and x cuDNN (x FA4 when FA4 ran); the forward also shows SDPA's efficient backend, the
    backward only the peers it times. A backward without timed rows prints nothing."""
    lines = bench_mod.summary_table(rows, direction)
    if not lines and direction != "fwd":
        return []
    fa4 = any(x["fa4"] is not None for x in lines)  # FA4 was importable and timed
    effic = direction == "fwd"
    headers = ["dtype", "d", "causal", "T", "flashgen", "FA2", "cuDNN",
               *(["effic."] if effic else []), *(["FA4"] if fa4 else []), "x FA2", "x cuDNN",
               *(["x FA4"] if fa4 else []), "variant"]  # fmt: skip
    table = [
        [x["dtype"], x["d"], "yes" if x["causal"] else "no", x["T"], _fmt(x["flashgen"]),
         _fmt(x["sdpa-flash"]), _fmt(x["sdpa-cudnn"]),
         *([_fmt(x["sdpa-efficient"])] if effic else []), *([_fmt(x["fa4"])] if fa4 else []),
         _fmt(x["x_sdpa-flash"], 2), _fmt(x["x_sdpa-cudnn"], 2),
         *([_fmt(x["x_fa4"], 2)] if fa4 else []), x["variant"] or "-"]
        for x in lines
    ]  # fmt: skip
    return list(format_table(headers, table))


def serving_rows(
    dtypes: tuple[str, ...], causal: tuple[bool, ...], peers: bool, backward: bool, reps: int
) -> list[dict[str, Any]]:
    """bench_serving's rows: the decode rows (when bf16 is among `dtypes`), then the varlen
    rows of each dtype and mask, forward and (with `backward`) backward."""
    from flashgen.perf import bench_serving as bs

    rows: list[dict[str, Any]] = []
    todo_d = bs.decode_cases() if bs.DECODE_DTYPE in dtypes else []
    todo_v = [(dt, c, direction) for dt in dtypes if dt in bs.VARLEN_DTYPES for c in causal
              for direction in ("fwd", "bwd") if direction == "fwd" or backward]  # fmt: skip
    with _progress() as prog:
        task = prog.add_task("serving", total=len(todo_d) + len(todo_v))
        for dc in todo_d:
            prog.update(task, description=f"decode {dc.label}")
            rows.append(bs.decode_row(dc, peers=peers))
            prog.advance(task)
        for dt, c, direction in todo_v:
            prog.update(task, description=f"varlen {dt} causal={c} {direction}")
            rows += bs.varlen_rows(dt, c, direction, peers=peers, reps=reps)
            prog.advance(task)
    return rows


def training_rows(
    dtypes: tuple[str, ...], causal: tuple[bool, ...], peers: bool, reps: int
) -> list[dict[str, Any]]:
    """bench_training's rows: each case of `causal`'s masks in each of `dtypes` (the issue's
    bf16 when the command named none), flashgen and (with `peers`) SDPA's default and FA4."""
    from flashgen.perf import bench_training as bt

    todo = [c for c in bt.training_cases(dtypes or (bt.TRAIN_DTYPE,)) if c.causal in causal]
    rows: list[dict[str, Any]] = []
    with _progress() as prog:
        task = prog.add_task("training", total=len(todo))
        for tc in todo:
            prog.update(task, description=f"training {tc.label}")
            rows += bt.training_row(tc, peers=peers, reps=reps)
            prog.advance(task)
    return rows


def training_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The printed training-step table, when there are rows."""
    from flashgen.perf import bench_training as bt

    headers, lines = bt.training_table(rows)
    if not lines:
        return []
    title = ("training step (forward + backward through autograd on "
             f"(B, T, H, d) views, host time included): ms (TFLOP/s at "
             f"{bt.TRAIN_FLOPS_FACTOR}x the forward's FLOPs); x peer: the best peer's time over "
             "flashgen's")  # fmt: skip
    return [title, *format_table(headers, lines)]


def serving_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The printed serving tables: decode (GB/s) and varlen prefill (TFLOP/s), each only
    when it has rows."""
    from flashgen.perf import bench_serving as bs

    titles = {
        bs.decode_table: f"decode, {bs.DECODE_DTYPE} d={bs.DECODE_D}: GB/s of K+V read per call "
        f"(CUDA graph of {bs.DECODE_REPS} calls); x copy: over a device copy of the same bytes; "
        "x peer: over the best of SDPA and FlashInfer",
        bs.varlen_table: f"varlen prefill, {len(bs.SHUFFLED)} packed sequences "
        f"({sum(bs.SHUFFLED)} tokens), H={bs.VARLEN_HEADS} d={bs.VARLEN_D}: TFLOP/s of useful "
        "work (bwd: 2.5x the forward's FLOPs)",
    }
    out: list[str] = []
    for table, title in titles.items():
        headers, lines = table(rows)
        if lines:
            out += [title, *format_table(headers, lines)]
    return out


@main.command(
    "tune",
    epilog="""\b
Example:
  flashgen tune --d 64 --d 128 --dtype bf16 --dtype fp16
""",
)
@click.option("--dtype", "dtypes", multiple=True, type=click.Choice(bench_mod.DTYPES),
              help="Storage dtype(s) to tune [default: bf16 and fp16].")  # fmt: skip
@click.option("--d", "head_dims", multiple=True, type=click.IntRange(min=16),
              help="Head dim(s) to tune [default: 64 and 128].")  # fmt: skip
@click.option("--t", "seq_lens", multiple=True, type=click.IntRange(min=16),
              help="Sequence lengths to time [default: 4096 and 16384].")  # fmt: skip
@click.option("--reps", type=click.IntRange(min=3), default=15, show_default=True,
              help="CUDA-event timings per variant and length (median compared).")  # fmt: skip
@click.option("--table", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Table to update [default: the package's tuning/<gpu>.json].")  # fmt: skip
@friendly
def tune(
    dtypes: tuple[str, ...], head_dims: tuple[int, ...], seq_lens: tuple[int, ...], reps: int,
    table: Path | None,
) -> None:  # fmt: skip
    """Time every shipped tensor-core variant (mma; wgmma on Hopper) per (d, dtype, causal) and
    record the fastest."""
    from flashgen.generator import tables
    from flashgen.perf import tune as tuning

    gpu_name, arch = _gpu_or_fail("tune")
    outcomes = []
    for dt in dtypes or bench_mod.DTYPES:
        for d in head_dims or bench_mod.HEAD_DIMS:
            for causal in (False, True):
                cands = tuning.candidates(d, dt, causal, arch)
                if not cands:
                    raise CliError(
                        f"d={d}, dtype={dt}: no shipped mma variant to tune; see `flashgen list`"
                    )
                timings: dict[str, dict[int, float]] = {s.name: {} for s in cands}
                for t in seq_lens or tuning.TUNE_SEQ_LENS:
                    case = bench_mod.Case(dt, d, causal, t)
                    for row in bench_mod.bench_case(case, cands, peers=(), reps=reps):
                        if row.tflops is not None and row.variant is not None:
                            timings[row.variant][t] = row.tflops
                o = tuning.pick_winner(tables.entry_key(d, dt, causal), timings)
                outcomes.append(o)
                click.echo(f"{o.key}: {o.winner} ({o.geomean_tflops:.1f} TFLOP/s geomean)")
    path = table or tables.table_dir() / f"{tables.gpu_slug(gpu_name)}.json"
    tuning.write_table(gpu_name, arch, outcomes, path)
    click.echo(f"wrote {path}")
