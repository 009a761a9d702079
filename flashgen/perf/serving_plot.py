"""PNG of the serving rows (`bench_serving`): decode GB/s per row, one panel per (GQA group, new
tokens Tq), one line per path -- flashgen on a contiguous cache and on shuffled pages of 16 and
256, the best peer the row timed (SDPA, FlashInfer), and a device copy of the same bytes (read
and written, so the line a pure read can reach and pass); varlen prefill TFLOP/s of useful work
as bars, one group per (dtype, causal, direction), one bar per kernel.

`flashgen bench` draws it beside the forward's PNG when it ran serving rows;
scripts/decode_bench.py beside its JSON. Both need matplotlib (`pip install matplotlib`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flashgen.perf import bench_serving as bs

DECODE_LINES = (
    ("flashgen", "flashgen", "o", "-"),
    ("paged16", "flashgen, pages of 16", "v", "--"),
    ("paged256", "flashgen, pages of 256", "^", "--"),
    ("peer", "best peer", "s", "-"),
    ("copy", "device copy (read + write)", "", ":"),
)
"""(key of `decode_series`, label, marker, line style) of each decode line."""


def decode_panels(rows: list[dict[str, Any]]) -> dict[tuple[int, int, int], list[dict[str, Any]]]:
    """The timed decode rows by panel (H, H_kv, Tq), each panel's rows by bytes of K and V
    (then B): the order their points take left to right."""
    panels: dict[tuple[int, int, int], list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("kind") == "decode" and "skipped" not in r and r.get("flashgen_gbs"):
            panels.setdefault((r["h"], r["h_kv"], r["tq"]), []).append(r)
    for got in panels.values():
        got.sort(key=lambda r: (r["bytes"], r["b"]))
    return dict(sorted(panels.items(), key=lambda kv: (-kv[0][0], kv[0][1], kv[0][2])))


def decode_series(row: dict[str, Any]) -> dict[str, float | None]:
    """One decode row's points in GB/s by `DECODE_LINES` key (None: not timed)."""
    peer = bs.best_peer(row)
    return {
        "flashgen": row.get("flashgen_gbs"),
        **{f"paged{p}": row.get(f"paged{p}_gbs") for p in bs.PAGE_SIZES},
        "peer": peer[1] if peer else None,
        "copy": row.get("copy_gbs"),
    }


def varlen_groups(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The timed varlen rows as {group label: {kernel: TFLOP/s}} in the order they ran (a
    kernel timed twice in a group: the last row's)."""
    groups: dict[str, dict[str, float]] = {}
    for r in rows:
        if r.get("kind") == "varlen" and r.get("tflops") is not None:
            label = f"{r['dtype']} {r['direction']} {'causal' if r['causal'] else 'non-causal'}"
            groups.setdefault(label, {})[r["kernel"]] = r["tflops"]
    return groups


def plot(rows: list[dict[str, Any]], path: Path, title: str = "") -> bool:
    """Write the serving PNG of `rows` to `path` (module docstring); False, writing nothing,
    when no row was timed."""
    panels = decode_panels(rows)
    groups = varlen_groups(rows)
    n = len(panels) + (1 if groups else 0)
    if n == 0:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(n, 2)
    nrows = -(-n // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(7.0 * cols, 3.8 * nrows), squeeze=False)
    flat = list(axes.flat)
    for ax, ((h, h_kv, tq), got) in zip(flat, panels.items(), strict=False):
        xs = list(range(len(got)))
        series = [decode_series(r) for r in got]
        for key, label, marker, style in DECODE_LINES:
            pts = [(x, s[key]) for x, s in zip(xs, series, strict=True) if s[key] is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker or None,
                        linestyle=style, label=label)  # fmt: skip
        ax.set_xticks(xs)
        ax.set_xticklabels([f"B{r['b']}\n{r['tk'] // 1024}k" for r in got], fontsize=8)
        ax.set_title(f"decode bf16 d={got[0]['d']}, GQA {h}/{h_kv}, Tq {tq}", fontsize=10)
        ax.set_xlabel("batch, cached keys per sequence (by bytes of K and V)")
        ax.set_ylabel("GB/s of K and V")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    if panels:
        flat[0].legend(fontsize=7)
    if groups:
        ax = flat[len(panels)]
        kernels = list(dict.fromkeys(k for g in groups.values() for k in g))
        width = 0.8 / len(kernels)
        for i, kernel in enumerate(kernels):
            bars = [j + (i - (len(kernels) - 1) / 2) * width for j in range(len(groups))]
            ys = [g.get(kernel, 0.0) for g in groups.values()]
            ax.bar(bars, ys, width=width, label=kernel)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(list(groups), fontsize=8)
        ax.set_title("varlen prefill (useful work)", fontsize=10)
        ax.set_ylabel("TFLOP/s")
        top = max(v for g in groups.values() for v in g.values())
        ax.set_ylim(0, 1.4 * top)  # room for the legend above the bars
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7, ncol=3, loc="upper center")
    for ax in flat[n:]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
