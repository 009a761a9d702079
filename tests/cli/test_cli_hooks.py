"""`flashgen build|show --score-mod/--mask-mod FILE:NAME`: user hooks from a Python file."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from flashgen.cli.group import main
from flashgen.generator.hooks import library

HOOKS = """
from flashgen.generator import hooks as hk

def cap(score, b, h, q_idx, kv_idx):
    return 30.0 * hk.tanh(score / 30.0)

def docs_fn(b, h, q_idx, kv_idx, doc_ids):
    return doc_ids[q_idx] == doc_ids[kv_idx]

docs = hk.trace_mask_mod(docs_fn, hk.Aux("doc_ids", "int32", 1))
not_a_hook = 3
"""


@pytest.fixture
def hooks_file(tmp_path: Path) -> Path:
    path = tmp_path / "hooks.py"
    path.write_text(HOOKS)
    return path


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_build_writes_a_hooked_kernel_with_both_hooks_inline(hooks_file: Path, tmp_path: Path):
    code, out = _run(
        "build", "--family", "mma", "--d", "64", "--causal", "--score-mod", f"{hooks_file}:cap",
        "--mask-mod", f"{hooks_file}:docs", "--out", str(tmp_path / "gen"), "--no-compile",
    )  # fmt: skip
    assert code == 0, out
    (path,) = (tmp_path / "gen").glob("*.cu")
    assert "_scoremod" in path.name and "_maskmod" in path.name
    source = path.read_text()
    assert "tanhf" in source and "doc_ids" in source


@pytest.mark.parametrize("mod", [("--score-mod", "cap"), ("--mask-mod", "docs")])
def test_a_hooked_wgmma_backward_at_d64_gets_the_tile_that_takes_hooks(
    hooks_file: Path, tmp_path: Path, mod: tuple[str, str]
) -> None:
    """d 64's default backward tile (128 x 128) takes no hooks: with one, build picks the
    64-row tile, as the spec would with the hook among its features from the start."""
    code, out = _run(
        "build", "--family", "wgmma", "--direction", "bwd", "--d", "64", mod[0],
        f"{hooks_file}:{mod[1]}", "--out", str(tmp_path / "gen"), "--no-compile",
    )  # fmt: skip
    assert code == 0, out
    (path,) = (tmp_path / "gen").glob("*.cu")
    assert path.name.startswith("flash_bwd_wgmma_d64_br64_bc128_bf16_noncausal_")


def test_show_takes_a_library_hook_the_same_digest(hooks_file: Path, tmp_path: Path):
    lib = tmp_path / "lib.py"
    lib.write_text("from flashgen.generator.hooks import library\nsc = library.softcap_hook()\n")
    code, out = _run("show", "--family", "mma", "--d", "64", "--score-mod", f"{lib}:sc")
    assert code == 0, out
    assert f"scoremod{library.softcap_hook().digest}" in out


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--score-mod", "{f}", "expected FILE:NAME"),
        ("--score-mod", "{f}:nothere", "defines no nothere"),
        ("--score-mod", "{f}:docs", "docs is a mask_mod hook; pass it with --mask-mod"),
        ("--mask-mod", "{f}:docs_fn", "must be traced in the file: NAME = hk.trace_mask_mod"),
        ("--mask-mod", "{f}:not_a_hook", "not_a_hook is a int; it must be a traced hook"),
        ("--mask-mod", "{d}/missing.py:x", "is not a file"),
    ],
)
def test_bad_hook_options_give_one_line_errors(
    hooks_file: Path, option: str, value: str, message: str
):
    arg = value.format(f=hooks_file, d=hooks_file.parent)
    code, out = _run("show", "--family", "mma", "--d", "64", option, arg)
    assert code == 2, out
    assert message in out and "Traceback" not in out
    assert len(out.strip().splitlines()) == 1, out


def test_a_file_that_raises_is_reported_in_one_line(tmp_path: Path):
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('boom')\n")
    code, out = _run("show", "--family", "mma", "--d", "64", "--score-mod", f"{bad}:x")
    assert code == 2 and "raised RuntimeError: boom" in out, out


def test_a_family_without_hooks_refuses_them(hooks_file: Path):
    code, out = _run("show", "--family", "simt", "--d", "64", "--score-mod", f"{hooks_file}:cap")
    assert code == 2 and "scoremod hook is not supported by family simt" in out, out


def test_name_with_hook_tokens_needs_the_same_hooks(hooks_file: Path, tmp_path: Path):
    code, out = _run(
        "build", "--family", "mma", "--d", "64", "--score-mod", f"{hooks_file}:cap",
        "--out", str(tmp_path), "--no-compile",
    )  # fmt: skip
    assert code == 0, out
    (path,) = tmp_path.glob("*.cu")
    name = path.stem
    code, out = _run("show", "--name", name, "--score-mod", f"{hooks_file}:cap")
    assert code == 0 and name in out
    code, out = _run("show", "--name", name, "--mask-mod", f"{hooks_file}:docs")
    assert code == 2 and "pass the hooks with those digests" in out, out


def test_bundle_takes_a_mask_mod_and_writes_the_hooked_c_api(hooks_file: Path, tmp_path: Path):
    out_dir = tmp_path / "attn"
    code, out = _run(
        "bundle", str(out_dir), "--d", "64", "--causal", "--mask-mod", f"{hooks_file}:docs"
    )
    assert code == 0, out
    (kernel,) = (out_dir / "kernels").glob("*.cu")
    assert "_maskmod" in kernel.name and "_mma_" in kernel.name
    header = (out_dir / "flashgen_attention.h").read_text()
    assert "flashgen_hook_aux" in header and "_DOC_IDS(aux) ((aux).ptr[0])" in header


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dtype", "fp32"], "hooks compile into families mma and wgmma"),
        (["--mask-mod", "nofile.py:docs"], "nofile.py is not a file"),
        (["--score-mod", "HOOKS:docs"], "is a mask_mod hook; pass it with --mask-mod"),
    ],
)
def test_bundle_refuses_a_bad_hook_in_one_line(
    hooks_file: Path, tmp_path: Path, args: list[str], message: str
):
    args = [a.replace("HOOKS", str(hooks_file)) for a in args]
    if "--mask-mod" not in args and "--score-mod" not in args:
        args += ["--mask-mod", f"{hooks_file}:docs"]
    code, out = _run("bundle", str(tmp_path / "attn"), "--d", "64", *args)
    assert code == 2, out
    assert message in out and len(out.strip().splitlines()) == 1, out
    assert not (tmp_path / "attn").exists()
