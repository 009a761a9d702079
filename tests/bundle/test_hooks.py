"""Bundles of hooked forward variants (a user score_mod / mask_mod): the C API that takes the
aux values in a `flashgen_hook_aux` and names each slot after the hooks' aux declarations, the
refusals, and the example end to end on the CPU stand-ins (sources/stand_in.cpp plays the hooked
kernel from the very aux block the launcher passes, with the hooks emitted as host C++): its
float64 reference evaluates the same hooks, so it passes, and fails when the kernel's output is
wrong or the kernel ignores its hooks. The tests that build the launcher and example (g++,
nvcc) and the nvcc and CMake builds of real hooked kernels are compile_all tests: CI runs them,
the default command stays fast."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from flashgen.bundle.emit import (
    HEADER,
    LAUNCHER,
    BundleError,
    bundle_context,
    bundle_files,
    select_variants,
    write_bundle,
)
from flashgen.generator.features.hook import token_of
from flashgen.generator.hooks import Aux, trace_mask_mod
from flashgen.generator.hooks.library import document_hook, softcap_hook
from flashgen.generator.spec import KernelSpec

from ._support import (
    INVALID,
    PAIR,
    assert_declarations_match,
    build_example_on_stand_ins,
    compile_all,
    cuda_includes,
    kernel_declarations,
    prose,
    require_nvcc,
    run_program,
    symbol,
    tool,
)

DOCS = document_hook()
CAP = softcap_hook()
DOC_TOKEN, CAP_TOKEN = token_of(DOCS), token_of(CAP)
# the document mask alone (causal, as packed training runs it), and softcap + document mask
# (non-causal): family mma, the smallest tiles
DOC = KernelSpec(family="mma", d=32, br=64, bc=32, dtype="bf16", causal=True, warps=4, stages=1,
                 features=(DOC_TOKEN,))  # fmt: skip
BOTH = KernelSpec(family="mma", d=64, br=64, bc=32, dtype="fp16", causal=False, warps=4, stages=1,
                  features=(CAP_TOKEN, DOC_TOKEN))  # fmt: skip
HOOKED = [DOC, BOTH]
DOC_SET, BOTH_SET = DOC_TOKEN, f"{CAP_TOKEN}_{DOC_TOKEN}"


# ---- what the files say -------------------------------------------------------------------------
def test_hooked_variants_get_entry_points_of_their_own_never_flashgen_fwd() -> None:
    ctx = bundle_context([*PAIR, *HOOKED])
    assert [c["kernel"] for c in ctx["variants"]] == sorted(s.name for s in PAIR)
    assert [c["kernel"] for c in ctx["hook_variants"]] == sorted(s.name for s in HOOKED)
    assert [h["name"] for h in ctx["hook_sets"]] == sorted([DOC_SET, BOTH_SET])
    launcher = bundle_files([*PAIR, *HOOKED])[LAUNCHER]
    dispatch = launcher[launcher.index("// ---- dispatch on (d, dtype, causal) ----") :]
    assert symbol(DOC) not in dispatch.split("flashgen_fwd_supported")[0]


def test_the_header_names_each_aux_slot_and_shows_the_expression() -> None:
    header = bundle_files(HOOKED)[HEADER]
    text = prose(header)
    assert "typedef struct flashgen_hook_aux {" in header
    for field in ("const void* ptr[4];", "int stride[4];", "float f[4];", "int i[4];"):
        assert field in text, field
    # the document mask's doc_ids is pointer slot 0 of both sets; the cap is float slot 0
    doc = f"FLASHGEN_{DOC_SET.upper()}_DOC_IDS(aux) ((aux).ptr[0])"
    assert f"#define {doc}" in text
    assert f"#define FLASHGEN_{BOTH_SET.upper()}_DOC_IDS(aux) ((aux).ptr[0])" in text
    assert f"#define FLASHGEN_{BOTH_SET.upper()}_SOFTCAP(aux) ((aux).f[0])" in text
    assert "doc_ids: int32 1-D device array, in aux.ptr[0]" in text
    assert "the mask_mod reads doc_ids[kv_idx], doc_ids[q_idx]" in text
    assert "(doc_ids[q_idx] == doc_ids[kv_idx])" in text  # the expression, readable
    assert "(softcap * tanh((score / softcap)))" in text
    for s, aux_set in ((DOC, DOC_SET), (BOTH, BOTH_SET)):
        sym = symbol(s)
        assert (f"cudaError_t {sym}_fwd(const flashgen_fwd_params* p, const flashgen_hook_aux* "
                "aux, cudaStream_t stream);") in text  # fmt: skip
        assert (f"cudaError_t {sym}_check(const flashgen_fwd_params* p, const flashgen_hook_aux* "
                "aux, const char** why);") in text  # fmt: skip
        assert f"cudaError_t flashgen_{aux_set}_fwd(const flashgen_fwd_params* p," in text
    assert "#define FLASHGEN_NUM_HOOK_VARIANTS 2" in text


def test_the_launcher_passes_the_aux_block_in_the_kernels_slot_order() -> None:
    launcher = bundle_files([DOC])[LAUNCHER]
    (decl,) = kernel_declarations(launcher, DOC.name)
    assert words_of(decl)[-4:] == ["int", "hook_i2,", "int", "hook_i3);"]
    text = prose(launcher)
    # slot 1 holds doc_ids' range summary and slot 3 a block map in the runtime's launches
    # (features.hook summary_slots, map_slot): a bundle passes NULL there, so its verdicts are
    # made in the kernel without summaries, whatever aux holds
    assert ("aux->ptr[0], nullptr, aux->ptr[2], nullptr, aux->stride[0], aux->stride[1], "
            "aux->stride[2], aux->stride[3], aux->f[0], aux->f[1], aux->f[2], aux->f[3], "
            "aux->i[0], aux->i[1], aux->i[2], aux->i[3]);") in text  # fmt: skip
    assert (
        "aux doc_ids (aux->ptr[0], int32 1-D device array) is NULL: the mask_mod reads it" in text
    )


def words_of(text: str) -> list[str]:
    return text.split()


def test_the_readme_documents_each_hook_set() -> None:
    readme = bundle_files(HOOKED)["README.md"]
    assert f"### `flashgen_{DOC_SET}_fwd`" in readme
    assert "`(doc_ids[q_idx] == doc_ids[kv_idx])`" in readme
    assert f"`FLASHGEN_{DOC_SET.upper()}_DOC_IDS(aux)`" in readme


def test_a_bundle_without_hooked_variants_says_nothing_of_hooks() -> None:
    # unhooked bundles keep their bytes: nothing of the hooked machinery is rendered there
    files = bundle_files(PAIR)
    for name in (HEADER, LAUNCHER, "example.cu", "README.md"):
        assert "hook" not in files[name].lower(), name


# ---- the refusals -------------------------------------------------------------------------------
def test_a_hooked_backward_variant_is_refused_with_the_rule_and_the_fix() -> None:
    bwd = KernelSpec(family="mma", d=64, dtype="bf16", direction="bwd", features=(DOC_TOKEN,))
    with pytest.raises(BundleError) as err:
        bundle_context([bwd])
    assert str(err.value).startswith(f"{bwd.name}: bwd variants with a user hook ({DOC_TOKEN})")
    assert "bundle the hooked forward" in str(err.value)


def test_a_hook_never_registered_is_refused_with_the_fix() -> None:
    spec = KernelSpec(family="mma", d=64, dtype="bf16", features=("maskmod0123456789ab",))
    with pytest.raises(BundleError) as err:
        bundle_context([spec])
    assert "pass the hooks with --score-mod / --mask-mod FILE:NAME" in str(err.value)


def test_hooks_go_into_every_picked_variant_and_fp32_is_refused() -> None:
    picked = select_variants(ds=[64, 128], causal=True, hooks=[DOC_TOKEN])
    assert [s.family for s in picked] == ["mma", "mma"]
    assert all(DOC_TOKEN in s.features for s in picked)
    with pytest.raises(BundleError) as err:
        select_variants(ds=[64], dtypes=["fp32"], causal=True, hooks=[DOC_TOKEN])
    msg = str(err.value)
    assert msg.startswith(f"hooks {DOC_TOKEN}: flash_fwd_simt_")
    assert "add --family mma, or drop --dtype fp32" in msg
    with pytest.raises(BundleError, match="carries .* not the hooks given"):
        select_variants(names=[BOTH.name], hooks=[DOC_TOKEN])


def test_the_example_runs_no_problem_when_the_generic_aux_tables_are_too_small() -> None:
    # a table indexed past every length of the example's problems
    far = trace_mask_mod(lambda b, h, q_idx, kv_idx, t: t[q_idx + 1000] > 0, Aux("t", "int32", 1))
    spec = DOC.replace(features=(token_of(far),))
    (ctx,) = bundle_context([spec])["hook_variants"]
    assert ctx["ex_runnable"] is False
    assert bundle_context([DOC])["hook_variants"][0]["ex_runnable"] is True


# ---- end to end on the CPU stand-ins -------------------------------------------------------------
@dataclass(frozen=True)
class HookBuild:
    root: Path

    def run(self, **env: str) -> subprocess.CompletedProcess[str]:
        return run_program(self.root / "example_on_cpu", **env)


@pytest.fixture(scope="module")
def hooked(tmp_path_factory: pytest.TempPathFactory) -> HookBuild:
    """The HOOKED bundle's launcher (nvcc) and example (g++ -Wall -Wextra -Werror) linked with
    the CPU stand-ins."""
    root = tmp_path_factory.mktemp("hooked")
    build_example_on_stand_ins(root, HOOKED)
    return HookBuild(root)


@pytest.mark.compile_all  # g++/nvcc builds of the launcher and example: CI's compile check
def test_the_example_runs_the_hooked_variants_against_the_same_hooks(hooked: HookBuild) -> None:
    proc = hooked.run()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1].startswith("PASS: 4 of 4 problems and 2 of 2 variants' parameter checks")
    # the document mask dropped keys (random documents), and every refusal held
    dropped = [ln for ln in lines if "mask_mod dropped" in ln]
    assert len(dropped) == 4 and all(
        not ln.strip().startswith("mask_mod dropped 0 ") for ln in dropped
    )
    for spec, n in ((DOC, 5), (BOTH, 5)):
        assert (
            f"  {spec.name}: {n} of {n} invalid parameter sets refused before launch  ok" in lines
        )


@pytest.mark.compile_all  # g++/nvcc builds of the launcher and example: CI's compile check
def test_the_example_fails_when_the_kernel_ignores_its_hooks(hooked: HookBuild) -> None:
    proc = hooked.run(MOCK_HOOK="ignore")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("FAIL: 0 of 4 problems")


@pytest.mark.compile_all  # g++/nvcc builds of the launcher and example: CI's compile check
def test_the_example_fails_when_an_output_is_wrong(hooked: HookBuild) -> None:
    proc = hooked.run(MOCK_BUG="perturb")
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[-1].startswith("FAIL: 0 of 4 problems")


@pytest.mark.compile_all  # g++/nvcc builds of the launcher and example: CI's compile check
def test_a_c99_caller_fills_the_aux_by_name(hooked: HookBuild) -> None:
    src = hooked.root / "aux_by_name.c"
    macro = f"FLASHGEN_{DOC_SET.upper()}_DOC_IDS"
    src.write_text(
        f'#include <stdio.h>\n#include "{HEADER}"\n'
        "int main(void) {\n"
        "  static int ids[64];\n  static float t[5][256] __attribute__((aligned(16)));\n"
        "  flashgen_hook_aux aux;\n  memset(&aux, 0, sizeof aux);\n"
        f"  {macro}(aux) = ids;\n"
        "  flashgen_fwd_params p;\n"
        "  flashgen_fwd_params_contiguous(&p, t[0], t[1], t[2], t[3], t[4], 1, 1, 8, 8, 32);\n"
        "  const char* why = NULL;\n"
        f"  const int null_aux = (int){symbol(DOC)}_check(&p, NULL, &why);\n"
        '  printf("%d|%s\\n", null_aux, why);\n'
        f"  const int ok = (int){symbol(DOC)}_check(&p, &aux, &why);\n"
        "  if (ok != 0) return 2;\n"
        "  return aux.ptr[0] == (const void*)ids ? 0 : 1;\n}\n"
    )
    flags = ["-std=c99", "-Wall", "-Wextra", "-Werror", f"-I{hooked.root}", *cuda_includes()]
    compile_all([[tool("gcc"), *flags, "-c", str(src), "-o", "aux_by_name.o"]], hooked.root)
    compile_all(
        [[tool("g++"), "aux_by_name.o", "launch.o", "stand_in.o", "-o", "aux_by_name"]],
        hooked.root,
    )
    out = run_program(hooked.root / "aux_by_name")
    assert out.returncode == 0, out.stdout + out.stderr
    code, why = out.stdout.strip().split("|")
    assert int(code) == INVALID and why.startswith("aux is NULL")


# ---- the real kernels through nvcc and CMake ----------------------------------------------------
@pytest.mark.compile_all  # nvcc's front end over the hooked kernels
def test_launcher_declarations_match_the_hooked_kernels(tmp_path: Path) -> None:
    write_bundle(bundle_files(HOOKED), tmp_path)
    assert_declarations_match(tmp_path, HOOKED, "hook_i3")


@pytest.mark.compile_all  # the real kernels through nvcc (minutes): the compile-everything check
def test_cmake_builds_a_document_mask_bundle_and_its_example(tmp_path: Path) -> None:
    nvcc, cmake = require_nvcc(), tool("cmake")
    write_bundle(bundle_files([DOC]), tmp_path)
    build = tmp_path / "build"
    for cmd in (
        [cmake, "-S", str(tmp_path), "-B", str(build), f"-DCMAKE_CUDA_COMPILER={nvcc}",
         "-DFLASHGEN_CUDA_ARCHITECTURES=90-real"],
        [cmake, "--build", str(build), "-j", "4"],
    ):  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert (build / "example").is_file()
