"""Do two flashgen trees generate the same forward kernels? Render, `nvcc -ptx`, compare.

    python3 scripts/dev/ptx_compare.py BASE_TREE NEW_TREE [--sample 40 | --all] [--seed 0]
                                       [--jobs 1] [--family F] [--every-arch] [--sass]
                                       [--keep DIR]

For shipped forward variants (`space.shipped()`, the names both trees ship), each tree renders
the kernel with its own templates (a subprocess whose PYTHONPATH is the tree, so that tree's
flashgen is imported) and nvcc compiles it to PTX with the tree's own flags
(`compile.BASE_FLAGS`, less the ptxas ones) for the variant's first arch (`--every-arch`: each
of `spec.archs`), `-ptx` and the arch's `ptx_gencode` in place of `-cubin` and its gencode.
No GPU and no cuobjdump needed: a CPU and nvcc do (cicc runs, ptxas does not).

The sample (`--sample N`, default 40) is stratified: variants are picked greedily until every
(family, feature set), (family, causal), (family, dtype) and (family, d) is covered, ties
broken at random (`--seed`), then filled at random up to N; `--all` takes every variant.

Compared: the PTX's code, i.e. the text without its line information (`.loc` and `.file`
lines and the `.debug_str` section of inlined functions' names, which `-lineinfo` adds and
which change whenever template lines move). A refactor that moves code without changing what
the kernels do gives identical code; the line information is then the only difference
(`raw identical` counts the variants whose whole PTX is the same too). Exit 0 only when every
variant's code is identical; otherwise the first differing lines of each are printed.

PTX is emitted in source order, so moving an independent statement (a special-register read
ahead of or behind another) changes the PTX text, not the kernel: `--sass` then compiles
both sides of each differing variant to a cubin (the tree's `compile.cubin_flags`, ptxas
included) and accepts the variant when every ELF section but the line information is
byte-identical (the machine code `.text.<kernel>`, its resource and attribute tables).
`--keep DIR` keeps the sources and PTX (`DIR/base|new/<name>.<arch>.{cu,ptx}`).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

WORKER = "_worker"  # the subcommand run inside a tree's subprocess
NVCC_TIMEOUT_S = 600
DIFF_LINES = 12  # differing lines shown per variant


# ---- inside a tree's subprocess -------------------------------------------------------------
def worker(mode: str) -> None:
    """`list`: every shipped forward variant as JSON rows; `render`: for the (name, every_arch)
    request on stdin, each (name, arch) job's source and nvcc command (JSON on stdout)."""
    import flashgen
    from flashgen.generator.arch import arch_info
    from flashgen.generator.compile import BASE_FLAGS, cubin_flags
    from flashgen.generator.nvcc import find_nvcc
    from flashgen.generator.render import render
    from flashgen.generator.space import shipped
    from flashgen.generator.spec import KernelSpec

    here = Path(flashgen.__file__).resolve().parent.parent
    if here != Path.cwd().resolve():  # an installed flashgen shadowed the tree's
        raise SystemExit(f"imported flashgen from {here}, not the tree {Path.cwd()}")
    if mode == "list":
        rows = [
            {"name": s.name, "family": s.family, "features": list(s.features),
             "causal": s.causal, "dtype": s.dtype, "d": s.d}
            for s in shipped()
        ]
        json.dump(rows, sys.stdout)
        return
    request = json.load(sys.stdin)
    flags = [f for f in BASE_FLAGS if not f.startswith("-Xptxas")]
    jobs = []
    for name in request["names"]:
        spec = KernelSpec.from_name(name)
        source = render(spec).source
        for arch in spec.archs if request["every_arch"] else spec.archs[:1]:
            info = arch_info(arch)
            jobs.append({"name": name, "arch": arch, "source": source,
                         "command": [str(find_nvcc()), *flags, "-ptx", info.ptx_gencode],
                         "cubin": [str(find_nvcc()), *cubin_flags(info.gencode)]})
    json.dump(jobs, sys.stdout)


# ---- the driver -------------------------------------------------------------------------------
def in_tree(tree: Path, mode: str, stdin: str = "") -> Any:
    """Run `worker(mode)` with `tree` first on PYTHONPATH; its JSON answer."""
    path = os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), WORKER, mode],
        input=stdin, capture_output=True, text=True, env=env, cwd=tree, check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: the {mode} worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def pick(rows: list[dict[str, Any]], n: int, seed: int) -> list[str]:
    """Up to n names covering every (family, features/causal/dtype/d) value, then at random."""
    rng = random.Random(seed)
    rows = sorted(rows, key=lambda r: r["name"])
    rng.shuffle(rows)

    def traits(r: dict[str, Any]) -> set[tuple[Any, ...]]:
        f = r["family"]
        return {(f, "features", tuple(r["features"])), (f, "causal", r["causal"]),
                (f, "dtype", r["dtype"]), (f, "d", r["d"])}

    todo = set().union(*(traits(r) for r in rows))
    chosen: list[dict[str, Any]] = []
    while todo:
        best = max(rows, key=lambda r: len(traits(r) & todo))  # first of the best: the shuffle
        chosen.append(best)
        todo -= traits(best)
    rest = [r for r in rows if r not in chosen]
    chosen += rest[: max(0, n - len(chosen))]
    return sorted(r["name"] for r in chosen)


def to_ptx(job: dict[str, Any], folder: Path) -> str:
    """Compile one job's source to PTX in `folder`; the PTX text."""
    stem = f"{job['name']}.{job['arch']}"
    src, out = folder / f"{stem}.cu", folder / f"{stem}.ptx"
    src.write_text(job["source"])
    proc = subprocess.run([*job["command"], "-o", str(out), str(src)], capture_output=True,
                          text=True, check=False, timeout=NVCC_TIMEOUT_S)
    if proc.returncode != 0:
        return f"<nvcc failed, exit {proc.returncode}>\n{proc.stderr[-2000:]}"
    return out.read_text().replace(str(folder), "<folder>")  # the same in both trees


def to_cubin(job: dict[str, Any], folder: Path) -> bytes:
    """Compile one job's source to a cubin with the tree's own cubin flags; its bytes."""
    stem = f"{job['name']}.{job['arch']}"
    src, out = folder / f"{stem}.cu", folder / f"{stem}.cubin"
    proc = subprocess.run([*job["cubin"], "-o", str(out), str(src)], capture_output=True,
                          text=True, check=False, timeout=NVCC_TIMEOUT_S)
    if proc.returncode != 0:
        raise SystemExit(f"nvcc -cubin failed for {src}:\n{proc.stderr[-2000:]}")
    return out.read_bytes()


def machine_code(cubin: bytes) -> dict[str, bytes]:
    """A cubin's ELF sections by name, less the line information (.debug_*, .nv_debug_*,
    .rel[a].debug_*): the SASS (.text.<kernel>), its resource and attribute tables, constants."""
    assert cubin[:5] == b"\x7fELF\x02", "not a 64-bit ELF"
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    size, count, names = struct.unpack_from("<HHH", cubin, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * size) for i in range(count)]
    base = heads[names][4]
    out = {}
    for name_at, kind, _, _, offset, length, *_ in heads:
        name = cubin[base + name_at : cubin.index(b"\0", base + name_at)].decode()
        if not name.startswith((".debug", ".nv_debug", ".rel.debug", ".rela.debug")):
            out[name] = b"" if kind == 8 else cubin[offset : offset + length]  # 8: NOBITS
    return out


def code_of(ptx: str) -> list[str]:
    """The PTX without its line information (.loc/.file lines, the .debug_str section)."""
    lines, skip = [], False
    for line in ptx.splitlines():
        word = line.strip()
        if word.startswith(".section") and ".debug_str" in word:
            skip = True
        if skip:
            skip = word != "}"
            continue
        if word.startswith((".loc", ".file")):
            continue
        lines.append(line)
    return lines


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == WORKER:
        worker(sys.argv[2])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", type=Path, help="the reference tree (a checkout's root)")
    ap.add_argument("new", type=Path, help="the tree under test")
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--sample", type=int, default=40, help="variants to compare (default 40)")
    size.add_argument("--all", action="store_true", help="every shipped forward variant")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--family", help="only this family's variants")
    ap.add_argument("--every-arch", action="store_true", help="each of spec.archs, not the first")
    ap.add_argument("--jobs", type=int, default=1, help="nvcc runs at a time (default 1)")
    ap.add_argument("--keep", type=Path, help="keep sources and PTX here")
    ap.add_argument("--sass", action="store_true",
                    help="where the PTX differs, compare the cubins' machine code (ptxas)")
    args = ap.parse_args()
    trees = {"base": args.base.resolve(), "new": args.new.resolve()}

    listed = {label: in_tree(tree, "list") for label, tree in trees.items()}
    names = {label: {r["name"] for r in rows} for label, rows in listed.items()}
    for a, b in (("base", "new"), ("new", "base")):
        if only := sorted(names[a] - names[b]):
            print(f"{len(only)} variants shipped by {a} only (left out): {', '.join(only[:5])}")
    rows = [r for r in listed["base"] if r["name"] in names["new"]
            and (args.family is None or r["family"] == args.family)]
    chosen = sorted(r["name"] for r in rows) if args.all else pick(rows, args.sample, args.seed)
    request = json.dumps({"names": chosen, "every_arch": args.every_arch})
    jobs = {label: in_tree(tree, "render", request) for label, tree in trees.items()}

    tmp = tempfile.TemporaryDirectory(prefix="ptx-compare-")
    root = args.keep or Path(tmp.name)
    ptx: dict[str, list[str]] = {}
    for label in trees:
        (root / label).mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            ptx[label] = list(pool.map(lambda j, f=root / label: to_ptx(j, f), jobs[label]))

    raw = code = sources = sass = 0
    failed: list[str] = []
    for i, job in enumerate(jobs["base"]):
        new_job = jobs["new"][i]
        assert (job["name"], job["arch"]) == (new_job["name"], new_job["arch"])
        key = f"{job['name']} ({job['arch']})"
        old_ptx, new_ptx = ptx["base"][i], ptx["new"][i]
        sources += job["source"] == new_job["source"]
        if old_ptx.startswith("<nvcc failed") or new_ptx.startswith("<nvcc failed"):
            failed.append(key)
            print(f"FAILED {key}:\n{old_ptx[:600] if old_ptx.startswith('<') else new_ptx[:600]}")
            continue
        raw += old_ptx == new_ptx
        old_code, new_code = code_of(old_ptx), code_of(new_ptx)
        if old_code == new_code:
            code += 1
            continue
        diff = list(difflib.unified_diff(old_code, new_code, "base", "new", n=1, lineterm=""))
        changed = sum(1 for d in diff[2:] if d[:1] in "+-")
        if args.sass:  # the machine code may still be the same
            cubins = [machine_code(to_cubin(j, root / label))
                      for j, label in ((job, "base"), (new_job, "new"))]
            if cubins[0] == cubins[1]:
                sass += 1
                print(f"PTX differs ({changed} lines), machine code identical: {key}")
                continue
        failed.append(key)
        print(f"DIFFERS {key} ({changed} PTX lines):\n" + "\n".join(diff[: DIFF_LINES + 2]))

    tmp.cleanup()
    total = len(jobs["base"])
    families = sorted({n.split("_")[2] for n in chosen})
    print(
        f"{total} PTX compiles ({len(chosen)} variants; families {', '.join(families)}): "
        f"code identical {code}/{total}, raw identical (line info too) {raw}/{total}, "
        f"rendered sources identical {sources}/{total}"
        + (f"; PTX differing but machine code identical {sass}/{total}" if args.sass else "")
    )
    if args.keep:
        print(f"sources and PTX kept in {args.keep}/base and {args.keep}/new")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
