"""What the bundle tests share: the variants they bundle, the compilers, the C/C++ sources under
sources/ (read with `fill`), and robust readers of generated text (CMake commands, prose,
Markdown tables, C initialiser rows).

Sources with per-bundle values carry @NAME@ placeholders; `fill` replaces each and refuses to
leave one unfilled. Nothing here asserts on whitespace of the generated files: their C is
compiled and run, their CMake parsed into commands, their documentation read as words.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from _nvcc import REQUIRE_ENV, nvcc_is_required, require_nvcc

from flashgen.generator import abi
from flashgen.generator.backward import pre_rows
from flashgen.generator.dtypes import DTYPES
from flashgen.generator.features.hook import call_args, hook_tokens, hooks_of, slots
from flashgen.generator.hooks import emit_hook
from flashgen.generator.spec import KernelSpec
from flashgen.runtime.decode import COMBINE_THREADS
from flashgen.runtime.tma import TMA_DTYPE

SOURCES = Path(__file__).resolve().parent / "sources"

# the smallest variant of each family: the CMake build compiles both
SIMT = KernelSpec(family="simt", d=32, br=32, bc=32, dtype="fp32")
MMA = KernelSpec(family="mma", d=32, br=64, bc=32, dtype="bf16", causal=True, warps=4, stages=1)
PAIR = [SIMT, MMA]
# the smallest shipped wgmma variant (sm_90a: TMA tensor maps ahead of the common ABI)
WGMMA = KernelSpec(family="wgmma", d=64, br=128, bc=64, dtype="fp16", causal=False, stages=2)
# a value head dim of its own (v and o rows of 64 under d = 128; the V tensor map follows)
WGMMA_DV = KernelSpec(family="wgmma", d=128, dv=64, dtype="bf16", causal=True)
# beside their plain siblings: dispatch picks by the features the params use
FEATURED = [
    SIMT.replace(features=("window", "softcap", "alibi")),
    MMA.replace(features=("window",)),
]
TRIO = [SIMT, MMA, WGMMA]
# backward variants: one with a forward partner in the stand-in bundle (MMA: d=32 bf16 causal,
# 40 KiB of shared memory), one without (d=64 bf16 non-causal, 64 KiB: the opt-in)
BWD_A = KernelSpec(family="mma", d=32, dtype="bf16", causal=True, direction="bwd")
BWD_B = KernelSpec(family="mma", d=64, dtype="bf16", causal=False, direction="bwd")
BWD = [BWD_A, BWD_B]
# a wgmma backward (sm_90a: four tensor maps, a scratch padded to whole 64-row query tiles),
# with WGMMA as its forward partner; the same d as BWD_B, so flashgen_bwd_workspace_bytes(d=64)
# is the larger of their two workspaces
BWD_W = KernelSpec(family="wgmma", d=64, dtype="fp16", causal=False, direction="bwd")
# the CMake build: a variant of each family, and the wgmma backward (sm_90a)
BUILT = [*TRIO, BWD_W]
# over 48 KiB of shared memory: exercises the launcher's opt-in
BIG = KernelSpec(family="mma", d=128, br=128, bc=64, dtype="fp16", warps=4, stages=1)
# the bundle the CPU stand-ins play: every kind of variant, both directions
STAND_IN = [*PAIR, BIG, WGMMA, *FEATURED, WGMMA_DV, *BWD, BWD_W]

# packed sequences (wgmma with varlen: the smallest tile, and one with every feature and its own
# value head dim) and decode variants (a plain one, GQA-packed rows of 16, and one with every
# feature): the stand-in bundle of tests/bundle/test_seq.py
VARLEN = KernelSpec(
    family="wgmma", d=64, br=128, bc=64, dtype="fp16", causal=True, features=("varlen",)
)
VARLEN_F = KernelSpec(
    family="wgmma", d=128, dv=64, dtype="bf16", causal=False,
    features=("window", "softcap", "alibi", "varlen"),
)  # fmt: skip
DECODE = KernelSpec(family="mma", direction="decode", d=64, br=16, bc=16, dtype="bf16")
DECODE_F = KernelSpec(
    family="mma", direction="decode", d=128, br=16, bc=16, dtype="fp16", causal=True,
    features=("window", "softcap", "alibi"),
)  # fmt: skip
SEQ = [VARLEN, VARLEN_F, DECODE, DECODE_F]

# cudaError_t values
INVALID, NOT_SUPPORTED = 1, 801  # cudaErrorInvalidValue, cudaErrorNotSupported
INVALID_DEVICE_FUNCTION, INSUFFICIENT_DRIVER = 98, 35
LAUNCH_FAILURE = 719  # cudaErrorLaunchFailure: what the stand-ins inject into a launch
# the features as sources/launch_contract.cpp numbers them
FEATURE_BITS = {"window": 1, "softcap": 2, "alibi": 4}


def symbol(spec: KernelSpec) -> str:
    """The prefix of a forward variant's C functions."""
    return "flashgen_" + spec.name.removeprefix("flash_fwd_")


def bwd_symbol(spec: KernelSpec) -> str:
    """The prefix of a backward variant's C functions."""
    return "flashgen_" + spec.name.removeprefix("flash_bwd_")


def dtype_enum(spec: KernelSpec) -> str:
    return f"FLASHGEN_{spec.dtype.upper()}"


# ---- sources and compilers ----------------------------------------------------------------------
def fill(name: str, **values: object) -> str:
    """sources/<name> with each @KEY@ replaced by str(values[KEY]); every placeholder filled."""
    text = (SOURCES / name).read_text()
    for key, value in values.items():
        assert f"@{key}@" in text, f"{name} has no @{key}@"
        text = text.replace(f"@{key}@", str(value))
    left = re.findall(r"@[A-Z_0-9]+@", text)
    assert not left, f"{name}: unfilled {left}"
    return text


def tool(name: str) -> str:
    """A program on PATH; skip without it, or fail under FLASHGEN_REQUIRE_NVCC=1."""
    path = shutil.which(name)
    if path is None:
        if nvcc_is_required():
            pytest.fail(f"{REQUIRE_ENV}=1 but {name} is not on PATH", pytrace=False)
        pytest.skip(f"needs {name} on PATH; set {REQUIRE_ENV}=1 to make this a failure")
    return path


_include_dirs: list[str] = []


def cuda_includes() -> list[str]:
    """-isystem flags of the include folders nvcc itself uses (from --dryrun), else
    /usr/local/cuda/include: for g++ and gcc compiling against cuda_runtime.h."""
    if not _include_dirs:
        proc = subprocess.run(
            [str(require_nvcc()), "--dryrun", "-c", "-x", "cu", "/dev/null", "-o", "/dev/null"],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        dirs = re.findall(r'(?:-I|-isystem" ")"?([^"\s]+)"?', proc.stdout + proc.stderr)
        dirs.append("/usr/local/cuda/include")
        found = [d for d in dict.fromkeys(dirs) if Path(d, "cuda_runtime.h").is_file()]
        if not found:
            pytest.skip("no cuda_runtime.h next to nvcc or in /usr/local/cuda/include")
        _include_dirs.extend(found)
    return [f"-isystem{d}" for d in _include_dirs]


def compile_all(
    commands: list[list[str]], cwd: Path, *, fail: bool = False
) -> list[subprocess.CompletedProcess[str]]:
    """Run independent compiler commands, as many at once as there are cores; each must succeed
    (or, with fail=True, the results are returned unchecked)."""

    def one(cmd: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            cmd, cwd=cwd, capture_output=True, text=True, check=False, timeout=600
        )

    with ThreadPoolExecutor(max_workers=max(1, min(len(commands), os.cpu_count() or 1))) as pool:
        results = list(pool.map(one, commands))
    if not fail:
        for cmd, proc in zip(commands, results, strict=True):
            tail = proc.stdout[-3000:] + proc.stderr[-3000:]
            assert proc.returncode == 0, f"{' '.join(cmd)}\n{tail}"
    return results


def run_program(exe: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run a test program with only PATH and `env` in its environment."""
    return subprocess.run(
        [str(exe)], capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", **env},
    )  # fmt: skip


def rows(output: str, kind: str) -> list[list[str]]:
    """The fields after `kind` of the program's `kind|a|b|...` lines."""
    return [ln.split("|")[1:] for ln in output.splitlines() if ln.split("|")[0] == kind]


# ---- the CPU stand-ins ---------------------------------------------------------------------------
def _hooked_stand_in(s: KernelSpec) -> str:
    """The stand-in of a hooked forward kernel (family mma): the forward's parameters then the
    aux block (HOOK_PARAMS), its hooks emitted as host C++ and called with the aux values as
    the kernel template calls them (features.hook.call_args), in `attend`'s HookFns."""
    hooks = hooks_of(s.features)
    block = slots(hooks)
    ctype = s.dtype_info.ctype
    lines = [emit_hook(h, f"{s.name}_{h.kind}", qualifiers="static inline")
             for h in hooks]  # fmt: skip
    params = ", ".join(p.declaration(ctype, restrict=False) for p in (*abi.forward(s.features),))
    lines.append(f'extern "C" void {s.name}({params}) {{')
    lines.append("  HookFns fns;")
    for h in hooks:
        fn, args = f"{s.name}_{h.kind}", call_args(h, block)
        if h.kind == "score_mod":
            lines.append(
                "  fns.score = [&](float x, int b, int h, int i, int j, int tq, int tk) "
                f"{{ return {fn}(x, b, h, i, j, tq, tk{args}); }};"
            )
        else:
            lines.append(
                "  fns.keep = [&](int b, int h, int i, int j, int tq, int tk) "
                f"{{ return {fn}(b, h, i, j, tq, tk{args}); }};"
            )
    flag = "true" if s.causal else "false"
    lines.append(
        f"  attend<{ctype}, {s.d}, {s.dv}, {s.br}, {s.threads}, {s.smem_bytes}, {flag}>("
        f'"{s.name}", (const void*)&{s.name}, q, k, v, o, lse, tq, tk, q_sb, q_sh, q_st, k_sb, '
        "k_sh, k_st, v_sb, v_sh, v_st, o_sb, o_sh, o_st, scale_log2, kv_group, window_left, "
        "window_right, softcap, alibi_slopes, (int)g_grid.y, (int)g_grid.z, false, &fns);"
    )
    lines.append("}")
    return "\n".join(lines)


def _stand_in_line(s: KernelSpec) -> str:
    """The stand-in macro call of one variant (backward: its three kernels)."""
    if hook_tokens(s.features):
        return _hooked_stand_in(s)
    flag = "true" if s.causal else "false"
    if s.direction == "bwd" and s.family == "wgmma":
        args = f"{s.d}, {s.br}, {s.bc}, {pre_rows(s)}, {s.threads}, {s.smem_bytes}, {flag}"
        return f"STAND_IN_BWD_TMA({s.name}, {s.dtype_info.ctype}, {args}, {TMA_DTYPE[s.dtype]})"
    if s.direction == "bwd":
        args = f"{s.d}, {s.bc}, {pre_rows(s)}, {s.threads}, {s.smem_bytes}, {flag}"
        return f"STAND_IN_BWD({s.name}, {s.dtype_info.ctype}, {args})"
    if s.direction == "decode":  # ... and its merge kernel's block
        args = f"{s.d}, {s.dv}, {s.br}, {s.threads}, {s.smem_bytes}, {flag}, {COMBINE_THREADS}"
        return f"STAND_IN_DECODE({s.name}, {s.dtype_info.ctype}, {args})"
    if "varlen" in s.features:
        args = f"{s.d}, {s.dv}, {s.br}, {s.bc}, {s.threads}, {s.smem_bytes}, {flag}"
        o_map = len(s.fam.fwd_prefix_of(s)) > len(s.fam.fwd_prefix)  # O_TMA_STORE: tm_o too
        macro = "STAND_IN_VARLEN_O" if o_map else "STAND_IN_VARLEN"
        return f"{macro}({s.name}, {s.dtype_info.ctype}, {args}, {TMA_DTYPE[s.dtype]})"
    if s.family == "wgmma":
        args = f"{s.d}, {s.dv}, {s.br}, {s.bc}, {s.threads}, {s.smem_bytes}, {flag}"
        o_map = len(s.fam.fwd_prefix_of(s)) > len(s.fam.fwd_prefix)  # O_TMA_STORE: tm_o too
        macro = "STAND_IN_TMA_O" if o_map else "STAND_IN_TMA"
        return f"{macro}({s.name}, {s.dtype_info.ctype}, {args}, {TMA_DTYPE[s.dtype]})"
    args = f"{s.d}, {s.dv}, {s.br}, {s.threads}, {s.smem_bytes}, {flag}"
    return f"STAND_IN({s.name}, {s.dtype_info.ctype}, {args})"


def stand_in_source(specs: list[KernelSpec]) -> str:
    """sources/stand_in.cpp for `specs`: the dtype table's host conversions (the device ones of
    cuda_fp16.h / cuda_bf16.h work on the host too) and a stand-in per kernel."""
    dtypes = [f"#include <{i.header}>" for i in DTYPES.values() if i.header]
    dtypes += [f"CONVERSION({i.ctype}, {i.to_float}, {i.from_float})" for i in DTYPES.values()]
    return fill(
        "stand_in.cpp",
        DTYPES="\n".join(dtypes),
        STAND_INS="\n".join(_stand_in_line(s) for s in specs),
    )


# ---- reading generated text ----------------------------------------------------------------------
_CMAKE_TOKEN = re.compile(r'"((?:[^"\\]|\\.)*)"|(#[^\n]*)|([()])|([^\s()#"]+)')


def cmake_commands(text: str) -> list[tuple[str, list[str]]]:
    """Each command of a CMakeLists.txt as (name, arguments): arguments split as CMake splits
    them (whitespace; "quoted" ones whole, without the quotes), comments dropped."""
    out: list[tuple[str, list[str]]] = []
    current: list[str] | None = None
    depth, last = 0, ""
    for quoted, comment, paren, word in _CMAKE_TOKEN.findall(text):
        if comment:
            continue
        if paren == "(":
            if current is None:
                current, depth = [], 1
                out.append((last, current))
            else:
                depth += 1
                current.append("(")
        elif paren == ")":
            depth -= 1
            if depth == 0:
                current = None
            elif current is not None:
                current.append(")")
        elif current is not None:
            current.append(quoted if word == "" else word)
        else:
            last = word
    return out


def cmake_args(text: str, name: str, first: str | None = None) -> list[list[str]]:
    """The argument lists of every `name(...)` command (whose first argument is `first`)."""
    return [
        args
        for cmd, args in cmake_commands(text)
        if cmd.lower() == name and (first is None or (args and args[0] == first))
    ]


def words(text: str) -> str:
    """A generated text whatever its wrapping: every run of whitespace becomes one space."""
    return " ".join(text.split())


def prose(source: str) -> str:
    """The words of a generated C file's comments and code, whatever their wrapping: comment
    markers (//, /*, */, a line's leading *) and every run of whitespace become one space."""
    return words(re.sub(r"^\s*\*(?!/)|/\*+|\*+/|//+", " ", source, flags=re.M))


def table_rows(markdown: str) -> dict[str, list[str]]:
    """Markdown table rows keyed by their first cell without backquotes: the other cells."""
    out = {}
    for line in markdown.splitlines():
        if line.strip().startswith("|") and not set(line) <= set("|-: "):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            out[cells[0].strip("`")] = cells[1:]
    return out


def initializer_rows(source: str, array: str) -> list[list[str]]:
    """The rows `{a, b, ...}` of a C array initialiser `array[] = { ... };`, each a list of
    its comma-separated values, whitespace stripped."""
    m = re.search(rf"\b{re.escape(array)}\s*\[\s*\]\s*=\s*\{{(.*?)\}}\s*;", source, re.S)
    assert m is not None, f"no initialiser of {array}[]"
    return [[v.strip() for v in row.split(",")] for row in re.findall(r"\{([^{}]*)\}", m.group(1))]


def kernel_declarations(launcher: str, name: str) -> list[str]:
    """The launcher's `extern "C" __global__ void <name>(...);` declarations (and those of
    <name>_pre and <name>_post, or of a decode variant's merge kernel <name>_combine), found
    whitespace-insensitively."""
    suffix = "(?:_pre|_post|_combine)?"
    pattern = rf'extern\s+"C"\s+__global__\s+void\s+{re.escape(name)}{suffix}\s*\(.*?\);'
    return re.findall(pattern, launcher, re.S)


def assert_declarations_match(root: Path, specs: list[KernelSpec], param: str) -> None:
    """Each kernel's definition beside the launcher's declarations of it compiles (nvcc's host
    front end), and does not once the last declaration with an int `param` has it made a long
    (a decode variant's merge kernel: its int n_splits too): the check can fail. The bundle of
    `specs` is written in `root`."""
    nvcc = str(require_nvcc())
    launcher = (root / "flashgen_launch.cu").read_text()
    commands, labels = [], []
    for s in specs:
        decls = kernel_declarations(launcher, s.name)
        want = {"bwd": 3, "decode": 2}.get(s.direction, 1)  # decode: the kernel and its merge
        assert len(decls) == want, (s.name, decls)
        last = max(i for i, d in enumerate(decls) if re.search(rf"\bint\s+{param}\b", d))
        changes = [(last, param)]
        if s.direction == "decode":
            changes.append((len(decls) - 1, "n_splits"))
        checks = [("same", "\n".join(decls))]
        for k, (at, name) in enumerate(changes):
            changed, n = re.subn(rf"\bint(\s+{name})\b", r"long\1", decls[at])
            assert n == 1, decls[at]
            checks.append((f"changed{k}", changed))
        arch = "compute_90a" if s.family == "wgmma" else "compute_90"
        for label, text in checks:
            src = root / f"sig_{label}_{s.name}.cu"
            src.write_text(fill("declarations.cu", KERNEL=s.name, DECLARATIONS=text))
            gencode = f"-gencode=arch={arch},code={arch}"
            commands.append([nvcc, "-std=c++17", f"-I{root}", "-x", "cu", "--cuda", gencode,
                             str(src), "-o", f"{src}.ii"])  # fmt: skip
            labels.append((s.name, label))
    for (name, label), proc in zip(labels, compile_all(commands, root, fail=True), strict=True):
        if label == "same":
            assert proc.returncode == 0, (name, proc.stderr)
        else:  # a different signature does not compile
            assert proc.returncode != 0 and '"C" linkage' in proc.stderr, (name, proc.stderr)


def c_program(bundle: Path, objects: list[str], out: Path) -> Path:
    """sources/header_run.c built as C99 (two units, -Wall -Wextra -Werror) against the bundle in
    `bundle`, linked with `objects` (its launcher and the stand-ins) into `out`/header_run."""
    gcc, gxx = tool("gcc"), tool("g++")
    c = [gcc, "-std=c99", "-Wall", "-Wextra", "-Werror", "-c", f"-I{bundle}", *cuda_includes()]
    src = str(SOURCES / "header_run.c")
    compile_all([[*c, src, "-o", "main.o"], [*c, "-DSECOND_UNIT", src, "-o", "second.o"]], out)
    compile_all([[gxx, "main.o", "second.o", *objects, "-o", "header_run"]], out)
    return out / "header_run"


def build_example_on_stand_ins(root: Path, specs: list[KernelSpec]) -> Path:
    """Write the bundle of `specs` into `root`, compile its launcher (nvcc) and its example
    (g++ -Wall -Wextra -Werror) and link them with the CPU stand-ins: `root/example_on_cpu`
    (launch.o and stand_in.o stay in `root` for tests that link programs of their own)."""
    from flashgen.bundle.emit import LAUNCHER, bundle_files, write_bundle

    nvcc, gxx = str(require_nvcc()), tool("g++")
    inc = cuda_includes()
    write_bundle(bundle_files(specs), root)
    (root / "example.cpp").write_text((root / "example.cu").read_text())
    (root / "stand_in.cpp").write_text(stand_in_source(specs))
    compile_all(
        [
            [nvcc, "-std=c++17", "-c", "-Xcompiler", "-O0", f"-I{root}", str(root / LAUNCHER),
             "-o", "launch.o"],
            [gxx, "-std=c++17", "-O1", "-c", *inc, "stand_in.cpp", "-o", "stand_in.o"],
            [gxx, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-c", f"-I{root}", *inc,
             "example.cpp", "-o", "example.o"],
        ],
        root,
    )  # fmt: skip
    compile_all([[gxx, "example.o", "launch.o", "stand_in.o", "-o", "example_on_cpu"]], root)
    return root / "example_on_cpu"
