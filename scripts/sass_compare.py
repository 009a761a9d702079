"""Prove that two flashgen trees build the same kernels: dump every shipped variant's SASS, compare.

What it proves: for every shipped variant, forward (`space.shipped()`) and backward
(`space.shipped(direction="bwd")`), and for each arch in `spec.archs`, the machine code
(`cuobjdump -sass` of the cubin the tree's own `compile.compile_kernel` builds) is the same in
both trees. A refactor that moves modules around but changes no kernel passes; one that changes
a template, a tile, a flag or what reaches nvcc fails, naming the variant and the first lines
that differ.

    python scripts/sass_compare.py dump --tree /tmp/fg-base --out /tmp/sass-base [--jobs N]
    python scripts/sass_compare.py dump --tree /work/main --out /tmp/sass-main [--jobs N]
    python scripts/sass_compare.py compare /tmp/sass-base /tmp/sass-main   # exit 0: identical

`dump` runs the enumeration and the compiles in a subprocess whose PYTHONPATH is the tree (so
that tree's flashgen is imported, whatever is installed) with a fresh, private
FLASHGEN_CACHE_DIR (so no cubin comes from another tree's cache), `--jobs` compiles at a time
(default 1), and writes `<name>.<arch>.sass`, `<name>.<arch>.cu` (the rendered source) and
`index.json` (variants, archs, ptxas registers and spills, errors) into `--out`, which must be
empty. `--family F` limits it to one family. Exit 1 when any variant failed to compile. A
killed dump goes on with `--resume` (same arguments): the pairs it finished, listed in
`progress.jsonl` under a digest of the tree's flashgen files, are kept when that digest is
unchanged; the rest compile with a fresh cache.

`compare A B` exits 0 only when both dumps hold the same (variant, arch) pairs and every pair's
SASS is identical (after dropping any line that carries only a file name, which cuobjdump prints
for fatbins, not for a bare cubin; function names are compared). A variant that failed to
compile has no SASS and counts as missing. Differing rendered sources alone are only noted.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from functools import cache
from pathlib import Path
from typing import Any

WORKER = "_dump-worker"  # the subcommand `dump` runs inside the tree's subprocess
# Where each module lives, as (package, module), newest layout first: the restructure moves
# sass into flashgen.perf. Spelled in parts so that a rewrite of module paths across scripts/
# leaves the old layout's name in place.
MODULES: dict[str, tuple[tuple[str, str], ...]] = {
    "space": (("flashgen.generator", "space"),),
    "compile": (("flashgen.generator", "compile"),),
    "render": (("flashgen.generator", "render"),),
    "sass": (("flashgen.perf", "sass"), ("flashgen.generator", "sass")),
}
CUOBJDUMP_TIMEOUT_S = 300
DIFF_LINES = 8  # differing lines shown per variant
SHOW = 20  # variants listed per kind of problem
PROGRESS = "progress.jsonl"  # the tree's identity, then one line per finished pair (--resume)
# cuobjdump lines that carry only a file name (`identifier = kernel.cu` for a fatbin's members)
_PATH_LINE = re.compile(r"^\s*(identifier|filename|file name)\s*=")


# ---- inside the tree's subprocess ---------------------------------------------------------------
def tree_attr(module: str, name: str) -> Any:
    """`name` from the first of MODULES[module] whose file is in the tree (the tree's layout).

    The file is looked for first: where flashgen is installed editable from another tree, that
    install would serve a module this tree lacks (`flashgen.perf` for an older tree)."""
    import flashgen

    root = Path(flashgen.__file__).parent
    for package, leaf in MODULES[module]:
        folder = root.joinpath(*package.split(".")[1:])
        if (folder / f"{leaf}.py").is_file() or (folder / leaf / "__init__.py").is_file():
            return getattr(importlib.import_module(f"{package}.{leaf}"), name)
    raise ImportError(f"no module {module!r} in {root} (looked for {MODULES[module]})")


def check_strays(tree: Path) -> None:
    """Exit when a loaded flashgen module comes from outside `tree` (another tree's install)."""
    strays = [
        name
        for name, mod in list(sys.modules.items())
        if name.split(".")[0] == "flashgen"
        and getattr(mod, "__file__", None)
        and tree.resolve() not in Path(str(mod.__file__)).resolve().parents
    ]
    if strays:
        raise SystemExit(f"flashgen modules from outside {tree}: {', '.join(sorted(strays))}")


@cache
def specs_by_name(family: str | None) -> dict[str, Any]:
    """Every shipped variant, forward then backward, by name (of one family, or all)."""
    shipped: Callable[..., list[Any]] = tree_attr("space", "shipped")
    found = [*shipped(family), *shipped(family, direction="bwd")]
    by_name = {s.name: s for s in found}
    if len(by_name) != len(found):
        raise SystemExit("two shipped variants share a name; the dump files would collide")
    return by_name


def disassemble(cuobjdump: str, cubin: bytes) -> str:
    """`cuobjdump -sass` of `cubin`, with the tool's own folder (nvdisasm) first on PATH."""
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(cuobjdump).parent), os.environ["PATH"]]))
    with tempfile.TemporaryDirectory(prefix="sass-compare-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        proc = subprocess.run(
            [cuobjdump, "-sass", str(path)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=CUOBJDUMP_TIMEOUT_S,
        )
    if proc.returncode != 0 or not proc.stdout.strip():
        err = " ".join(proc.stderr.split())[:300]
        raise RuntimeError(f"cuobjdump -sass failed (exit {proc.returncode}): {err}")
    return proc.stdout


def dump_one(name: str, arch: str, family: str | None, out: str, cuobjdump: str) -> dict[str, Any]:
    """Compile one (variant, arch) with the tree's compile_kernel, write its SASS and source;
    return its index entry (with `error` instead of the report when something failed)."""
    spec = specs_by_name(family)[name]
    entry: dict[str, Any] = {"name": name, "arch": arch, "direction": spec.direction}
    entry["family"] = spec.family
    start = time.monotonic()
    try:
        source = tree_attr("render", "render")(spec).source
        Path(out, f"{name}.{arch}.cu").write_text(source)
        compiled = tree_attr("compile", "compile_kernel")(spec, arch=arch)
        Path(out, f"{name}.{arch}.sass").write_text(disassemble(cuobjdump, compiled.cubin))
    except Exception as exc:  # recorded per variant; the dump goes on
        entry["error"] = f"{type(exc).__name__}: {exc}"
    else:
        report = getattr(compiled, "report", None)
        for key in ("registers", "spill_stores", "spill_loads"):
            entry[key] = getattr(report, key, None)
    entry["seconds"] = round(time.monotonic() - start, 2)
    return entry


def run_jobs(jobs: list[tuple[str, str]], args: argparse.Namespace, tool: str) -> list[Any]:
    """Every job through a pool of `args.jobs` processes, with a progress line now and then."""
    entries: list[dict[str, Any]] = []
    start = last = time.monotonic()
    with (
        ProcessPoolExecutor(max_workers=args.jobs) as pool,
        Path(args.out, PROGRESS).open("a") as progress,
    ):
        futures: list[Future[dict[str, Any]]] = [
            pool.submit(dump_one, name, arch, args.family, args.out, tool) for name, arch in jobs
        ]
        for future in as_completed(futures):
            entries.append(future.result())
            progress.write(json.dumps(entries[-1]) + "\n")
            progress.flush()
            if "error" in entries[-1]:
                print(
                    f"FAILED {entries[-1]['name']} [{entries[-1]['arch']}]: "
                    f"{entries[-1]['error'][:500]}",
                    file=sys.stderr,
                    flush=True,
                )
            now = time.monotonic()
            if now - last >= 60 or len(entries) == len(jobs):
                last, done = now, len(entries)
                eta = (now - start) / done * (len(jobs) - done)
                print(
                    f"[{done}/{len(jobs)}] {now - start:.0f} s, about {eta:.0f} s left",
                    file=sys.stderr,
                    flush=True,
                )
    return entries


def tree_commit(tree: Path) -> str:
    """The tree's HEAD commit, `+dirty` when flashgen/ has changes (read-only git calls)."""

    def git(*cmd: str) -> str:
        proc = subprocess.run(
            ["git", "--no-optional-locks", "-C", str(tree), *cmd],
            capture_output=True,
            text=True,
            check=False,
        )
        return proc.stdout.strip()

    head = git("rev-parse", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--", "flashgen") else "")


def resume_from(out: Path, identity: dict[str, str], resume: bool) -> dict[Any, Any]:
    """The pairs an earlier run of the same tree and code finished (with --resume), by
    (name, arch); a new progress file, headed by the tree's identity, otherwise."""
    progress = out / PROGRESS
    if not resume or not progress.is_file():
        progress.write_text(json.dumps({"identity": identity}) + "\n")
        return {}
    head, *lines = progress.read_text().splitlines()
    if json.loads(head).get("identity") != identity:
        raise SystemExit(f"{out} was dumped from other code ({head}); start a fresh dump")
    done = {}
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:  # a run killed mid-write leaves a truncated last line: redo that pair
            continue
        if "error" not in entry and Path(out, f"{entry['name']}.{entry['arch']}.sass").is_file():
            done[(entry["name"], entry["arch"])] = entry
    return done


def worker_main(args: argparse.Namespace) -> int:
    """The `dump` work itself, run with PYTHONPATH=<tree>: enumerate, compile, dump, index."""
    import flashgen

    tree, out = Path(args.tree), Path(args.out)
    if tree.resolve() not in Path(flashgen.__file__).resolve().parents:
        raise SystemExit(f"imported {flashgen.__file__}, not the flashgen of {tree}")
    tool = str(tree_attr("sass", "find_cuobjdump")())
    code = tree_attr("compile", "flashgen_version")()  # a digest of the package's files
    tree_attr("render", "render")  # imported before the pool forks, to be checked here
    check_strays(tree)
    identity = {"tree": str(tree), "commit": tree_commit(tree), "code": code}
    done = resume_from(out, identity, args.resume)
    pairs = [(n, a) for n, s in specs_by_name(args.family).items() for a in s.archs]
    todo = [p for p in pairs if p not in done]
    print(
        f"{tree}: {len(specs_by_name(args.family))} variants, {len(pairs)} compiles "
        f"({len(done)} done before), {args.jobs} at a time; cuobjdump {tool}",
        file=sys.stderr,
        flush=True,
    )
    entries = sorted(
        [*(done[p] for p in pairs if p in done), *run_jobs(todo, args, tool)],
        key=lambda e: (e["direction"] != "fwd", e["name"], e["arch"]),
    )
    index = {**identity, "flashgen": flashgen.__file__, "cuobjdump": tool}
    index.update(family=args.family, variants=entries)
    (out / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    failed = [e for e in entries if "error" in e]
    print(f"{len(entries) - len(failed)} of {len(entries)} dumped, {len(failed)} failed")
    return 1 if failed else 0


# ---- the caller's side --------------------------------------------------------------------------
def dump(args: argparse.Namespace) -> int:
    """Run WORKER in a subprocess that imports the tree's flashgen, with a fresh cubin cache."""
    tree, out = Path(args.tree).resolve(), Path(args.out).resolve()
    if not (tree / "flashgen" / "__init__.py").is_file():
        raise SystemExit(f"{tree} holds no flashgen package")
    if out.exists() and any(out.iterdir()) and not (args.resume and (out / PROGRESS).is_file()):
        raise SystemExit(f"{out} is not empty; remove it, or --resume a killed dump ({PROGRESS})")
    out.mkdir(parents=True, exist_ok=True)
    cache_dir = tempfile.mkdtemp(prefix="sass-compare-cache-")
    env = dict(os.environ, PYTHONPATH=str(tree), FLASHGEN_CACHE_DIR=cache_dir)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        WORKER,
        "--tree",
        str(tree),
        "--out",
        str(out),
        "--jobs",
        str(args.jobs),
    ]
    cmd += ["--family", args.family] if args.family else []
    cmd += ["--resume"] if args.resume else []
    start = time.monotonic()
    # a SIGTERM unwinds like Ctrl-C: the worker is killed and the private cache removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        rc = subprocess.run(cmd, env=env, cwd=tree, check=False).returncode
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    print(f"dump of {tree} into {out}: exit {rc}, wall {time.monotonic() - start:.0f} s")
    return rc


def normalise(text: str) -> list[str]:
    """SASS lines as compared: every line but those that carry only a file name."""
    return [line for line in text.splitlines() if not _PATH_LINE.match(line)]


def load_dump(folder: Path) -> dict[str, list[str] | None]:
    """`<name>.<arch>` -> normalised SASS lines, or None for a pair the index lists without SASS
    (a failed compile)."""
    if not folder.is_dir():
        raise SystemExit(f"{folder}: no such dump folder")
    found: dict[str, list[str] | None] = {}
    index = folder / "index.json"
    if index.is_file():
        for entry in json.loads(index.read_text()).get("variants", []):
            found[f"{entry['name']}.{entry['arch']}"] = None
    for path in sorted(folder.glob("*.sass")):
        found[path.name.removesuffix(".sass")] = normalise(path.read_text())
    return found


def first_diff(a: list[str], b: list[str]) -> list[str]:
    """The first DIFF_LINES changed lines (`-` A, `+` B) with the hunk header before them."""
    lines = [ln for ln in difflib.unified_diff(a, b, "A", "B", n=0, lineterm="")][2:]
    return [ln.rstrip() for ln in lines[:DIFF_LINES]]


def show(title: str, keys: list[str], detail: Callable[[str], list[str]] | None = None) -> None:
    """Print up to SHOW keys under a title (with each one's detail lines), then the rest's count."""
    if not keys:
        return
    print(f"{title} ({len(keys)}):")
    for key in keys[:SHOW]:
        print(f"  {key}")
        for line in detail(key) if detail else []:
            print(f"      {line}")
    if len(keys) > SHOW:
        print(f"  ... and {len(keys) - SHOW} more")


def source_note(a: Path, b: Path, keys: list[str]) -> str:
    """How many rendered sources differ among `keys` (informational: the SASS decides)."""
    pairs = [(a / f"{k}.cu", b / f"{k}.cu") for k in keys]
    both = [(x, y) for x, y in pairs if x.is_file() and y.is_file()]
    differ = sum(1 for x, y in both if x.read_bytes() != y.read_bytes())
    return f"rendered sources: {differ} of {len(both)} differ (noted only: the SASS decides)"


def compare(args: argparse.Namespace) -> int:
    """Compare two dumps; exit 0 only when they hold the same pairs with identical SASS."""
    a_dir, b_dir = Path(args.a), Path(args.b)
    a, b = load_dump(a_dir), load_dump(b_dir)
    keys = sorted(a.keys() | b.keys())
    missing_a = [k for k in keys if a.get(k) is None]
    missing_b = [k for k in keys if b.get(k) is None]
    both = [k for k in keys if a.get(k) is not None and b.get(k) is not None]
    differ = [k for k in both if a[k] != b[k]]
    show(
        f"SASS differs between {a_dir} and {b_dir}",
        differ,
        lambda k: first_diff(a[k] or [], b[k] or []),
    )
    show(f"no SASS in {a_dir}", missing_a)
    show(f"no SASS in {b_dir}", missing_b)
    names = {k.rsplit(".", 1)[0] for k in keys}
    bwd = sum(1 for n in names if n.startswith("flash_bwd_"))
    print(source_note(a_dir, b_dir, both))
    print(
        f"{len(names) - bwd} forward + {bwd} backward variants x archs: "
        f"{len(both) - len(differ)} SASS identical, {len(differ)} differ, "
        f"{len(set(missing_a) | set(missing_b))} missing"
    )
    return 0 if keys and not differ and not missing_a and not missing_b else 1


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (WORKER is internal: `dump` runs it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="{dump,compare}")
    for name in ("dump", WORKER):
        p = sub.add_parser(name, help="dump a tree's SASS" if name == "dump" else None)
        p.add_argument("--tree", required=True, help="a flashgen checkout (holds flashgen/)")
        p.add_argument("--out", required=True, help="an empty or new folder for the dump")
        p.add_argument("--jobs", type=int, default=1, help="compiles at a time (default 1)")
        p.add_argument("--family", default=None, help="only this family (default: all)")
        p.add_argument(
            "--resume",
            action="store_true",
            help=f"go on with a killed dump of the same code (its {PROGRESS}); a fresh cache",
        )
    p = sub.add_parser("compare", help="compare two dumps (exit 0: identical)")
    p.add_argument("a", help="a dump folder")
    p.add_argument("b", help="another dump folder")
    args = parser.parse_args(argv)
    if getattr(args, "jobs", 1) < 1:
        parser.error("--jobs must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch the subcommand; its exit status."""
    args = parse_args(argv)
    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "dump": dump,
        WORKER: worker_main,
        "compare": compare,
    }
    return commands[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
