"""Plots for the example: two training runs' loss curves, and the sweep's memory and time.

    python examples/nanogpt/plot.py losses runs/manual/metrics.json runs/flashgen/metrics.json \
        --out runs/losses.png
    python examples/nanogpt/plot.py sweep runs/sweep.json --out runs/sweep.png

Needs matplotlib, which flashgen does not depend on: `pip install matplotlib` (or
`pip install -e ".[plot]"` in the repository root). Without it this script says so and exits;
the rest of the example does not import it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MISSING_MATPLOTLIB = (
    "plot.py needs matplotlib, which is not installed: pip install matplotlib "
    '(or pip install -e ".[plot]" in the repository root)'
)


def _pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend, or SystemExit naming the install."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(f"error: {MISSING_MATPLOTLIB}") from None
    matplotlib.use("Agg")  # no display needed: these plots only go to files
    import matplotlib.pyplot as plt

    return plt


def _load(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())  # type: ignore[no-any-return]


def _ema(values: Sequence[float], alpha: float = 0.1) -> list[float]:
    """Exponential moving average: per-step losses are noisy (one batch each)."""
    out: list[float] = []
    acc: float | None = None
    for v in values:
        acc = v if acc is None else (1 - alpha) * acc + alpha * v
        out.append(acc)
    return out


def _label(run: dict[str, Any]) -> str:
    return f"{run['attention']} ({run['dtype']}, seed {run['seed']})"


def _short(run: dict[str, Any]) -> str:
    return f"{run['attention']} {run['dtype']}"


def plot_losses(paths: Sequence[Path], out: Path) -> Path:
    """Training losses of the runs (raw and smoothed, with val points) and their difference."""
    if len(paths) < 1:
        raise ValueError("plot losses needs at least one metrics.json")
    runs = []
    for path in paths:
        run = _load(path)
        if not run.get("losses"):  # a run that failed before its first step (see its error)
            print(f"warning: {path} has no losses, left out: {run.get('error')}", file=sys.stderr)
            continue
        runs.append(run)
    if not runs:
        raise SystemExit("error: none of the runs has losses to plot")
    hashes = {r["corpus"]["sha256"] for r in runs}
    if len(hashes) > 1:
        print(
            "warning: the runs used different corpora (the repository text changed between "
            "them?); their curves are not step-for-step comparable",
            file=sys.stderr,
        )
    plt = _pyplot()
    two = len(runs) == 2
    fig, axes = plt.subplots(
        2 if two else 1, 1, figsize=(8, 7 if two else 4.5), sharex=True, squeeze=False
    )
    ax = axes[0][0]
    for i, run in enumerate(runs):
        color = f"C{i}"
        losses = run["losses"]
        steps = range(len(losses))
        ax.plot(steps, losses, color=color, alpha=0.25, linewidth=0.8)
        ax.plot(steps, _ema(losses), color=color, label=f"{_label(run)} train (EMA)")
        val = run.get("val") or []
        if val:
            ax.plot(
                [v["step"] for v in val], [v["loss"] for v in val], "o--", color=color,
                markersize=3, label=f"{_label(run)} val",
            )  # fmt: skip
    ax.set_ylabel("cross-entropy (nats/char)")
    seeds = {r["seed"] for r in runs}
    same = "same seed, same init and batches" if len(seeds) == 1 else "different seeds"
    ax.set_title(f"nanoGPT example: {' vs '.join(_short(r) for r in runs)} ({same})", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    if two:
        # the point of the comparison: how far apart the curves are, step by step
        a, b = runs[0]["losses"], runs[1]["losses"]
        n = min(len(a), len(b))
        diff = [b[i] - a[i] for i in range(n)]
        dax = axes[1][0]
        dax.plot(range(n), diff, color="C2", linewidth=0.8)
        dax.axhline(0.0, color="black", linewidth=0.5)
        dax.set_ylabel(f"loss: {_short(runs[1])} - {_short(runs[0])}")
        dax.grid(alpha=0.3)
        dax.set_xlabel("step")
    else:
        ax.set_xlabel("step")
    return _save(fig, plt, out)


def plot_sweep(path: Path, out: Path) -> Path:
    """Extra peak memory and time per call against T, log-log, one line per attention x mode."""
    sweep = _load(path)
    rows = sweep["rows"]
    plt = _pyplot()
    fig, (mem_ax, time_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    series = sorted({(r["attention"], r["mode"]) for r in rows})
    for i, (impl, mode) in enumerate(series):
        pts = sorted((r for r in rows if (r["attention"], r["mode"]) == (impl, mode)),
                     key=lambda r: r["T"])  # fmt: skip
        ok = [r for r in pts if r["status"] == "ok"]
        style = {"color": f"C{i}", "marker": "o", "linestyle": "-" if mode == "fwd" else "--"}
        label = f"{impl} {mode}"
        mem = [r for r in ok if r.get("extra_peak_bytes") is not None]
        if mem:
            mem_ax.plot([r["T"] for r in mem], [max(r["extra_peak_bytes"], 1) / 2**20 for r in mem],
                        label=label, **style)  # fmt: skip
        if ok:
            time_ax.plot([r["T"] for r in ok], [r["ms"] for r in ok], label=label, **style)
        for r in pts:
            if r["status"] in ("oom", "skipped"):
                # out of memory: an x on the T axis, so a missing point reads as a failure
                for ax in (mem_ax, time_ax):
                    ax.plot([r["T"]], [0], marker="x", color=f"C{i}", markersize=9,
                            transform=ax.get_xaxis_transform(), clip_on=False)  # fmt: skip
    # one (B, H, T, T) score matrix, the thing the manual path writes and flashgen never does
    score = sorted({(r["T"], r["score_matrix_bytes"]) for r in rows})
    if score:
        mem_ax.plot([t for t, _ in score], [s / 2**20 for _, s in score], color="gray",
                    linestyle=":", label="one T x T score matrix")  # fmt: skip
    settings = sweep.get("settings", {})
    gpu = sweep.get("env", {}).get("gpu", sweep.get("env", {}).get("device", "?"))
    what = (
        f"H={settings.get('heads')}, d={settings.get('head_dim')}, {settings.get('dtype')}, "
        f"causal; {'B*T=' + str(settings['tokens']) if settings.get('tokens') else 'B=1'}"
    )
    for ax, ylabel in ((mem_ax, "extra peak memory (MiB)"), (time_ax, "time per call (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    mem_ax.set_title(f"one attention layer, {what}", fontsize=9)
    time_ax.set_title(f"{gpu}; x on the axis = out of memory", fontsize=9)
    return _save(fig, plt, out)


def _save(fig: Any, plt: Any, out: Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    print(f"wrote {out}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Plot the nanoGPT example's runs and sweep.")
    sub = p.add_subparsers(dest="what", required=True)
    lp = sub.add_parser("losses", help="loss curves of training runs (metrics.json files)")
    lp.add_argument("metrics", type=Path, nargs="+")
    lp.add_argument("--out", type=Path, required=True, help="PNG to write")
    sp = sub.add_parser("sweep", help="memory and time against T (a sweep.py JSON)")
    sp.add_argument("sweep", type=Path)
    sp.add_argument("--out", type=Path, required=True, help="PNG to write")
    args = p.parse_args(argv)
    if args.what == "losses":
        plot_losses(args.metrics, args.out)
    else:
        plot_sweep(args.sweep, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
