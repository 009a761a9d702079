"""Interleaved GPU A/B of kernel patches: prepare on the CPU host, run in one `run`, report here.

    python3 scripts/dev/ab_patches.py prepare SNAP --names NAME [NAME ...]
                                            [--patch LABEL=FILE ...] [--rounds 3] [--grid auto]
    (device)  bash SNAP/run.sh          # carry SNAP; results in $OUT/ab.tgz
    python3 scripts/dev/ab_patches.py report RESULT_DIR_OR_TGZ

`prepare` copies this checkout (tracked and untracked-but-not-ignored files, without
bench/results) to SNAP/base and, per --patch, to SNAP/LABEL with the patch applied (`git apply`),
compiles every NAME for sm_90 in each tree into SNAP/fgc (no GPU needed: the compile cache is
keyed by the rendered source, so each tree gets its own cubins), copies the PyCUDA wheels
(.whl, see ../shared/gpu-host) and writes SNAP/run.sh. On the GPU host run.sh checks every
tree's kernels on ragged problems (`scripts/dev/wgmma_dev.py`, also as 3 SMs so the persistent
grid walks many items), then times all NAMEs in every tree, round after round, each tree in its
own process (base, A, B, base, A, B, ...: clocks drift between processes on the H200, so only
interleaved medians are compared). `report` prints each kernel's TFLOP/s per tree and the
median ratio to base.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SKIP = ("bench/results/", "examples/nanogpt/results/")

RUN_SH = """#!/bin/bash
# written by scripts/dev/ab_patches.py prepare: checks, then {rounds} interleaved timing rounds
set -u
S=$(cd "$(dirname "$0")" && pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $S/.whl/*.whl \
  >/dev/null 2>&1
mkdir -p /tmp/fgc && cp -r $S/fgc/. /tmp/fgc/
export FLASHGEN_CACHE_DIR=/tmp/fgc FLASHGEN_REQUIRE_GPU=1
names="{names}"
trees="{trees}"
for t in $trees; do
  cd $S/$t; export PYTHONPATH=/tmp/site:$S/$t
  python3 scripts/dev/wgmma_dev.py $OUT/check-$t.json $names --no-bench > $OUT/check-$t.log 2>&1
  python3 scripts/dev/wgmma_dev.py $OUT/check3-$t.json $names --no-bench --grid persistent \\
    --sms 3 > $OUT/check3-$t.log 2>&1
  echo "$t: $(grep 'checks failed' $OUT/check-$t.log)" \
    "/ as 3 SMs: $(grep 'checks failed' $OUT/check3-$t.log)"
done
for r in $(seq 1 {rounds}); do
  for t in $trees; do
    cd $S/$t; export PYTHONPATH=/tmp/site:$S/$t
    python3 scripts/dev/wgmma_dev.py $OUT/dev-$t-$r.json $names --no-check --grid {grid} \\
      > $OUT/dev-$t-$r.log 2>&1 || tail -n 3 $OUT/dev-$t-$r.log
  done
done
cd $OUT && tar czf ab.tgz *.json *.log && rm -f *.json *.log
cd $S/base && PYTHONPATH=$S/base python3 scripts/dev/ab_patches.py report $OUT/ab.tgz
"""


def copy_tree(dest: Path, snap: Path) -> None:
    """This checkout's files (tracked, or untracked and not ignored) into `dest`, leaving out
    the snapshot `snap` itself (when it is not git-ignored, the trees copied first would
    otherwise be copied into every later one)."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
        capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    for f in files:
        src = ROOT / f
        if f.startswith(SKIP) or not src.is_file() or src.resolve().is_relative_to(snap):
            continue
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / f)


def compile_for_sm90(tree: Path, names: list[str], cache: Path) -> None:
    """Compile `names` from `tree`'s templates for sm_90 into `cache` (a subprocess, so that
    each tree's flashgen is the one imported)."""
    code = (
        "import sys\n"
        "from unittest import mock\n"
        "from flashgen.runtime import gpu as runtime\n"
        "from flashgen.verify import checks\n"
        "from flashgen.generator.spec import KernelSpec\n"
        "with mock.patch.object(runtime, 'device_arch', lambda *a, **k: 'sm_90'):\n"
        "    r = checks.compile_all([KernelSpec.from_name(n) for n in sys.argv[1:]])\n"
        "bad = {s.name: str(c)[:300] for s, c in r.items() if isinstance(c, Exception)}\n"
        "spill = [s.name for s, c in r.items() if not isinstance(c, Exception)\n"
        "         and (c.report.spill_stores or c.report.spill_loads)]\n"
        "print('failed:', bad, 'spills:', spill)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tree), "FLASHGEN_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, "-c", code, *names], cwd=tree, env=env,
                         capture_output=True, text=True)  # fmt: skip
    print(f"{tree.name}: {out.stdout.strip()}{out.stderr.strip()[-500:]}")
    if out.returncode:
        raise SystemExit(f"{tree.name}: compile failed")


def patched_files(patch: str) -> list[str]:
    """The paths a unified diff writes (its `+++ b/...` lines)."""
    lines = Path(patch).read_text().splitlines()
    return [ln[6:].split("\t")[0] for ln in lines if ln.startswith("+++ b/")]


def filecmp_differs(a: Path, b: Path, rel: str) -> bool:
    """Whether `rel` differs between trees `a` and `b` (missing on one side counts)."""
    fa, fb = a / rel, b / rel
    if not (fa.is_file() and fb.is_file()):
        return fa.is_file() != fb.is_file()
    return fa.read_bytes() != fb.read_bytes()


def prepare(args: argparse.Namespace) -> None:
    snap = Path(args.snap).resolve()
    if snap.exists():
        shutil.rmtree(snap)
    (snap / "fgc").mkdir(parents=True)
    trees = ["base"]
    copy_tree(snap / "base", snap)
    for item in args.patch:
        label, _, file = item.partition("=")
        if not label.isidentifier() or not file:
            raise SystemExit(f"--patch {item!r}: expected LABEL=FILE with LABEL a plain word")
        copy_tree(snap / label, snap)
        # not `git apply`: inside this checkout's work tree (SNAP is usually under it) it would
        # resolve paths against the checkout's root and silently skip every file
        patch = ["patch", "-p1", "--batch", "--forward", "-s", "-i", str(Path(file).resolve())]
        subprocess.run(patch, cwd=snap / label, check=True)
        if not any(filecmp_differs(snap / "base", snap / label, f) for f in patched_files(file)):
            raise SystemExit(f"--patch {item!r}: applied, but no file differs from base")
        trees.append(label)
    for t in trees:
        compile_for_sm90(snap / t, args.names, snap / "fgc")
    wheels = ROOT / ".whl"
    if wheels.is_dir():
        shutil.copytree(wheels, snap / ".whl")
    else:
        print("no .whl here: run ../shared/gpu-host/stage-wheels.sh first")
    run = RUN_SH.format(rounds=args.rounds, names=" ".join(args.names), trees=" ".join(trees),
                        grid=args.grid)  # fmt: skip
    (snap / "run.sh").write_text(run)
    size = sum(p.stat().st_size for p in snap.rglob("*") if p.is_file()) / 2**20
    rel = snap.relative_to(ROOT) if snap.is_relative_to(ROOT) else snap
    print(f"{snap}: {size:.1f} MiB (the carry limit is 64 MiB); on the device: bash {rel}/run.sh")


def report(args: argparse.Namespace) -> None:
    src = Path(args.result)
    with tempfile.TemporaryDirectory() as tmp:
        if src.suffix == ".tgz":
            with tarfile.open(src) as tar:
                tar.extractall(tmp, filter="data")
            src = Path(tmp)
        rows: dict[tuple[str, int], dict[str, list[float]]] = collections.defaultdict(
            lambda: collections.defaultdict(list)
        )
        trees: list[str] = []
        for f in sorted(src.glob("dev-*.json")):
            tree = f.stem.split("-")[1]
            if tree not in trees:
                trees.append(tree)
            data: dict[str, Any] = json.loads(f.read_text())
            for row in data.get("bench", []):
                for k, v in row.items():
                    if k.startswith("flash_") and v:
                        rows[(k, row["t"])][tree].append(v)
    if "base" in trees:
        trees.remove("base")
        trees.insert(0, "base")
    print(f"{'kernel':52s} {'T':>6s} " + " ".join(f"{t:>16s}" for t in trees)
          + "  " + " ".join(f"{t + '/base':>10s}" for t in trees[1:]))  # fmt: skip
    for (name, t), per in sorted(rows.items()):
        cells = " ".join(f"{'/'.join(f'{x:.0f}' for x in per.get(tr, [])):>16s}" for tr in trees)
        base = statistics.median(per["base"]) if per.get("base") else 0.0
        ratios = " ".join(
            f"{statistics.median(per[tr]) / base:10.3f}" if base and per.get(tr) else f"{'-':>10s}"
            for tr in trees[1:]
        )
        print(f"{name.replace('flash_fwd_', ''):52s} {t:6d} {cells}  {ratios}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("snap")
    p.add_argument("--names", nargs="+", required=True)
    p.add_argument("--patch", action="append", default=[], metavar="LABEL=FILE")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--grid", choices=("auto", "tiles", "persistent"), default="auto")
    r = sub.add_parser("report")
    r.add_argument("result")
    args = ap.parse_args()
    prepare(args) if args.cmd == "prepare" else report(args)


if __name__ == "__main__":
    main()
