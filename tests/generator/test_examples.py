"""generated/examples/: the committed reference variants match what the templates generate."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import click
import pytest

from flashgen.generator.families import FAMILIES
from flashgen.generator.render import render
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "update_examples.py"
FIX = "run `python scripts/update_examples.py`, review the diff and commit it"


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("update_examples", SCRIPT)
    assert spec is not None and spec.loader is not None, f"{SCRIPT} is missing"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


update_examples = _load_script()
EXAMPLES: list[KernelSpec] = update_examples.example_specs()


def test_one_example_per_family() -> None:
    assert sorted(s.family for s in EXAMPLES) == sorted(FAMILIES)


def test_examples_are_the_documented_reference_variants() -> None:
    names = {s.name for s in EXAMPLES}
    assert "flash_fwd_simt_d64_br32_bc32_fp32_noncausal" in names
    mma = KernelSpec(family="mma", d=128, br=128, bc=64, dtype="bf16", causal=True)
    assert mma.name in names


def test_examples_are_shipped_variants() -> None:
    """So the compile-all test proves the committed code compiles spill-free."""
    space = set(shipped())
    for s in EXAMPLES:
        assert s in space, f"{s.name} is an example but not a shipped variant"


@pytest.mark.parametrize("spec", EXAMPLES, ids=lambda s: s.family)
def test_committed_example_matches_its_template(spec: KernelSpec) -> None:
    if not update_examples.has_template(spec):
        assert spec.family != "simt", "templates/simt.cu.j2 must exist"
        pytest.skip(f"templates/{FAMILIES[spec.family].template} has not landed yet")
    path = update_examples.EXAMPLES_DIR / f"{spec.name}.cu"
    rel = path.relative_to(ROOT)
    assert path.exists(), f"{rel} is missing; {FIX}"
    assert path.read_text() == render(spec).source, (
        f"{rel} has drifted from templates/{spec.fam.template}; {FIX}"
    )


def test_no_stray_files_in_examples() -> None:
    known = {f"{s.name}.cu" for s in EXAMPLES}
    stray = sorted(p.name for p in update_examples.EXAMPLES_DIR.glob("*") if p.name not in known)
    assert not stray, f"generated/examples/ holds files that are no example: {stray}; {FIX}"


@pytest.fixture(scope="module")
def page_drift(nvcc_required: Path) -> dict[str, list[str]]:
    """What readme_stale() and docs_stale() report on the committed README and docs, each run
    once: their commands compile with nvcc in a fresh cache, and three tests read the result."""
    return {"readme": update_examples.readme_stale(), "docs": update_examples.docs_stale()}


def test_check_mode_passes_on_the_committed_tree(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    page_drift: dict[str, list[str]],
) -> None:
    # the README and docs checks' verdicts on this tree, as computed once in page_drift
    monkeypatch.setattr(update_examples, "readme_stale", lambda: page_drift["readme"])
    monkeypatch.setattr(update_examples, "docs_stale", lambda: page_drift["docs"])
    status = update_examples.main(["--check"])
    assert status == 0, capsys.readouterr().out


# a README of the sandbox below: one example block whose output drifted (`--help` runs in-process,
# without nvcc)
STALE_README = "# x\n\n<!-- example: flashgen --help -->\n```\n$ flashgen --help\nstale\n```\n"


def test_script_detects_and_repairs_drift(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(update_examples, "EXAMPLES_DIR", tmp_path / "examples")
    monkeypatch.setattr(update_examples, "ROOT", tmp_path)
    # the sandbox's own README (the module's README is the committed one: a check ran its nvcc
    # commands, and an update could have rewritten it)
    readme = tmp_path / "README.md"
    readme.write_text(STALE_README)
    monkeypatch.setattr(update_examples, "README", readme)
    assert update_examples.stale(), "an empty examples dir must be reported"
    assert update_examples.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "run: python scripts/update_examples.py" in out
    assert "README.md: `flashgen --help` prints something else now" in out
    assert "wrote README.md" in update_examples.update()
    assert update_examples.stale() == [] and update_examples.readme_stale() == []
    simt = tmp_path / "examples" / "flash_fwd_simt_d64_br32_bc32_fp32_noncausal.cu"
    simt.write_text(simt.read_text().replace("constexpr int BC = 32;", "constexpr int BC = 16;"))
    (tmp_path / "examples" / "flash_fwd_old.cu").write_text("// stale\n")
    problems = update_examples.stale()
    assert any("differs" in p and simt.name in p for p in problems), problems
    assert any("not an example" in p and "flash_fwd_old.cu" in p for p in problems), problems
    changed = update_examples.update()
    assert f"wrote examples/{simt.name}" in changed
    assert "removed examples/flash_fwd_old.cu" in changed
    assert update_examples.stale() == []
    assert simt.read_text() == render(EXAMPLES[0]).source


# ---- README and docs examples: real output of the commands they show -----------------------------
def test_readme_has_example_blocks_for_build_and_inspect() -> None:
    args = [a for a, _ in update_examples.readme_examples(update_examples.README.read_text())]
    assert "build --d 64 --bc 32" in args
    assert any(a.startswith("inspect") for a in args)


def test_readme_examples_are_what_the_commands_print(page_drift: dict[str, list[str]]) -> None:
    problems = page_drift["readme"]
    assert problems == [], f"{problems}; {FIX}"


@pytest.mark.compile_all  # runs the README's nvcc commands three times: the compile check's
def test_readme_check_detects_a_stale_number(nvcc_required: Path) -> None:
    text = update_examples.README.read_text()
    [(args, body)] = [(a, b) for a, b in update_examples.readme_examples(text) if a.startswith("b")]
    stale = text.replace(body, re.sub(r"\d+ registers", "999 registers", body), 1)
    assert update_examples.readme_stale(stale) == [
        f"README.md: `flashgen {args}` prints something else now"
    ]
    # two runs of the commands differ in nvcc's wall time only: compare with it masked
    fixed, fresh = update_examples.updated_readme(stale), update_examples.updated_readme(text)
    assert update_examples._TIMING.sub("", fixed) == update_examples._TIMING.sub("", fresh)


def test_docs_examples_are_what_the_commands_print(page_drift: dict[str, list[str]]) -> None:
    problems = page_drift["docs"]
    assert problems == [], f"{problems}; {FIX}"


def _help_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[str]:
    """`--help` argument strings of every command under `group`, the group's own first."""
    out = [" ".join((*prefix, "--help"))]
    for name, cmd in sorted(group.commands.items()):
        if isinstance(cmd, click.Group):
            out += _help_paths(cmd, (*prefix, name))
        else:
            out.append(" ".join((*prefix, name, "--help")))
    return out


def test_cli_reference_shows_the_help_of_every_command() -> None:
    from flashgen import cli

    text = (ROOT / "docs" / "cli.md").read_text()
    shown = {args for args, _ in update_examples.readme_examples(text)}
    missing = [a for a in _help_paths(cli.main) if a not in shown]
    assert not missing, (
        f"docs/cli.md has no example block for `flashgen {missing[0]}`: add "
        f"`<!-- example: flashgen {missing[0]} -->` and an empty fenced block, then {FIX}"
    )


# ---- the license ---------------------------------------------------------------------------------
def test_license_file_is_the_license_pyproject_declares() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'license = "Apache-2.0"' in pyproject and 'license-files = ["LICENSE"]' in pyproject
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_readme_points_at_the_design_document_inside_the_project() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "](docs/design.md)" in readme and "DESIGN.md" not in readme
    design = (ROOT / "docs" / "design.md").read_text()
    for section in ("## Architecture", "## Conventions", "## Correctness rule"):
        assert section in design, section
