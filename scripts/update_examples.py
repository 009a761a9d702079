#!/usr/bin/env python3
"""Regenerate generated/examples/: one committed reference variant per kernel family.

    python scripts/update_examples.py          # rewrite the files that drifted
    python scripts/update_examples.py --check  # exit 1 if any file drifted (what CI's test does)

tests/test_examples.py fails when a committed example no longer matches its template; run this
script, read the diff, and commit it with the template change.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES_DIR = ROOT / "generated" / "examples"

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
    return changed


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="only report drift; exit 1 if any")
    args = parser.parse_args(argv)
    if args.check:
        problems = stale()
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
