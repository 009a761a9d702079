#!/usr/bin/env python3
"""Regenerate generated/examples/ (one committed reference variant per kernel family) and the
command examples of README.md and docs/*.md (real output of the commands they show).

    python scripts/update_examples.py          # rewrite the files and README blocks that drifted
    python scripts/update_examples.py --check  # exit 1 if any drifted (what the tests check)

tests/generator/test_examples.py fails when a committed example no longer matches its
template, or a README
or docs example no longer matches what its command prints; run this script, read the diff, and
commit it.

An example is a fenced block right after a line `<!-- example: flashgen ARGS -->`: the
block holds `$ flashgen ARGS` and the command's output, run for sm_90 (FLASHGEN_ARCH) with a
fresh cubin cache in an empty folder, as program `flashgen` on an 80-column terminal (so
`--help` text wraps the same everywhere). nvcc's wall time (`nvcc 0.6 s`) is not compared.
Without cuobjdump the SASS part of `inspect` output is neither compared nor rewritten.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES_DIR = ROOT / "generated" / "examples"
README = ROOT / "README.md"

# Render from this checkout's templates, never from another installed copy of flashgen:
# the examples must show what the templates next to them generate.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from flashgen.generator.families import FAMILIES  # noqa: E402
from flashgen.generator.render import environment, render  # noqa: E402
from flashgen.generator.spec import KernelSpec  # noqa: E402


def example_specs() -> list[KernelSpec]:
    """The reference variant of each family (the code a reader browses first)."""
    return [
        KernelSpec(family="simt", d=64, br=32, bc=32, dtype="fp32", causal=False),
        KernelSpec(family="mma", d=128, br=128, bc=64, dtype="bf16", causal=True),
        KernelSpec.from_name("flash_fwd_wgmma_d128_br128_bc128_bf16_causal_s2"),
    ]


def has_template(spec: KernelSpec) -> bool:
    """True when the spec's family template exists (a family may be declared before it lands)."""
    return FAMILIES[spec.family].template in environment().list_templates()


def expected() -> dict[Path, str]:
    """Every example file that should exist, with its content (families without a template
    are left out)."""
    return {
        EXAMPLES_DIR / render(s).filename: render(s).source
        for s in example_specs()
        if has_template(s)
    }


def stale() -> list[str]:
    """Problems with the committed examples: missing, drifted or no longer an example."""
    want = expected()
    problems = []
    for path, text in want.items():
        if not path.exists():
            problems.append(f"{path.relative_to(ROOT)}: missing")
        elif path.read_text() != text:
            problems.append(f"{path.relative_to(ROOT)}: differs from its template's output")
    known = {p.name for p in want} | {f"{s.name}.cu" for s in example_specs()}
    if EXAMPLES_DIR.exists():
        for path in sorted(EXAMPLES_DIR.glob("*.cu")):
            if path.name not in known:
                problems.append(f"{path.relative_to(ROOT)}: not an example spec any more")
    return problems


# ---- README and docs examples ----------------------------------------------------------------
MARKER = re.compile(
    r"^<!-- example: flashgen (?P<args>.+?) -->\n```\n(?P<body>.*?)^```$", re.M | re.S
)
_TIMING = re.compile(r"\(nvcc [\d.]+ s\)")
HELP_WIDTH = 80  # the terminal width examples run at (click wraps --help text to it)
_SASS = re.compile(r"^  SASS .*?(?=^  traffic model)", re.M | re.S)


@contextmanager
def _example_env() -> Iterator[Path]:
    """An empty cwd, a fresh cache and FLASHGEN_ARCH=sm_90, restored afterwards."""
    saved = {k: os.environ.get(k) for k in ("FLASHGEN_ARCH", "FLASHGEN_CACHE_DIR")}
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="flashgen-readme-") as tmp:
        os.environ["FLASHGEN_ARCH"] = "sm_90"
        os.environ["FLASHGEN_CACHE_DIR"] = str(Path(tmp) / "cache")
        os.chdir(tmp)
        try:
            yield Path(tmp)
        finally:
            os.chdir(cwd)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def run_example(args: str) -> str:
    """`$ flashgen ARGS` and what the command prints (stdout), as a README block body."""
    import shlex

    from click.testing import CliRunner

    from flashgen.cli import app as cli

    with _example_env():
        result = CliRunner().invoke(
            cli.main, shlex.split(args), prog_name="flashgen", terminal_width=HELP_WIDTH,
            catch_exceptions=False,
        )  # fmt: skip
    if result.exit_code != 0:
        raise RuntimeError(f"flashgen {args} exited {result.exit_code}: {result.output}")
    return f"$ flashgen {args}\n{result.stdout}"


def have_sass() -> bool:
    """True when cuobjdump and nvdisasm are available (inspect prints the SASS mix)."""
    from flashgen.perf.sass import SassUnavailable, find_cuobjdump

    try:
        find_cuobjdump()
    except SassUnavailable:
        return False
    return True


def comparable(body: str, sass: bool) -> str:
    """A block body with what may differ between runs masked (nvcc's time; SASS if absent)."""
    body = _TIMING.sub("(nvcc N s)", body)
    return body if sass else _SASS.sub("", body)


def readme_examples(text: str) -> list[tuple[str, str]]:
    """(args, body) of every README example block."""
    return [(m["args"], m["body"]) for m in MARKER.finditer(text)]


def _stale_in(text: str, label: str) -> list[str]:
    """The example blocks of `text` (a page called `label`) whose command prints something
    else now."""
    sass = have_sass()
    return [
        f"{label}: `flashgen {args}` prints something else now"
        for args, body in readme_examples(text)
        if comparable(body, sass) != comparable(run_example(args), sass)
    ]


def readme_stale(text: str | None = None) -> list[str]:
    """README examples whose command prints something else now."""
    return _stale_in(README.read_text() if text is None else text, "README.md")


def doc_pages() -> list[Path]:
    """The pages under docs/ (of ROOT, read at call time) that may hold example blocks."""
    return sorted((ROOT / "docs").glob("*.md"))


def docs_stale() -> list[str]:
    """Examples in docs/*.md whose command prints something else now."""
    return [
        problem
        for page in doc_pages()
        for problem in _stale_in(page.read_text(), str(page.relative_to(ROOT)))
    ]


def updated_readme(text: str) -> str:
    """The README with every drifted example block rewritten from its command's output."""
    sass = have_sass()

    def block(m: re.Match[str]) -> str:
        new = run_example(m["args"])
        if comparable(m["body"], sass) == comparable(new, sass):
            return m.group(0)
        if not sass:  # keep the committed SASS part rather than drop it
            old_sass = _SASS.search(m["body"])
            if old_sass:
                new = _SASS.sub(lambda _: old_sass.group(0), new)
        return f"<!-- example: flashgen {m['args']} -->\n```\n{new}```"

    return MARKER.sub(block, text)


def update() -> list[str]:
    """Write every drifted or missing example and remove stray ones; return what changed."""
    EXAMPLES_DIR.mkdir(parents=True, exist_ok=True)
    changed = []
    want = expected()
    for path, text in want.items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            changed.append(f"wrote {path.relative_to(ROOT)}")
    known = {p.name for p in want} | {f"{s.name}.cu" for s in example_specs()}
    for path in sorted(EXAMPLES_DIR.glob("*.cu")):
        if path.name not in known:
            path.unlink()
            changed.append(f"removed {path.relative_to(ROOT)}")
    for s in example_specs():
        if not has_template(s):
            changed.append(f"skipped {s.name}: templates/{FAMILIES[s.family].template} is missing")
    for page in [README, *doc_pages()]:
        if not page.exists():
            continue
        text = page.read_text()
        new = updated_readme(text)
        if new != text:
            page.write_text(new)
            changed.append(f"wrote {page.relative_to(ROOT)}")
    return changed


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="only report drift; exit 1 if any")
    args = parser.parse_args(argv)
    if args.check:
        problems = stale() + (readme_stale() if README.exists() else []) + docs_stale()
        for p in problems:
            print(p)
        if problems:
            print("run: python scripts/update_examples.py")
        return 1 if problems else 0
    for line in update() or ["examples are up to date"]:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
