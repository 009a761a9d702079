"""CLI fuzz (issue 6): random options and strings never crash `flashgen` or write astray.

Hypothesis drives `build`, `show`, `list`, `inspect` and `check` through click's CliRunner in
an empty temporary directory, with every option the command has (read from the click command,
so new options are fuzzed too) given a random value: integers from -2**80 to 2**80, random
text for choices and names, odd floats for the scale, paths inside the sandbox, flags, all in
random order, sometimes with a stray argument or an unknown option. The only outcomes allowed:

- exit 0 with output on stdout (stderr only `note:` lines), or
- exit 2 with exactly one line on stderr, starting `error: `;

never a traceback or another exit code (`check` exits 1 only on a wrong kernel, and here it
never reaches a kernel), and no file or directory appears or changes anywhere in the sandbox
except under the paths the command was given (or their defaults, e.g. `generated/`) and the
cubin cache. nvcc is made unavailable (FLASHGEN_NVCC points nowhere) and `check` meets "no
GPU" once its problem is validated, so the fuzz is fast and the same on every machine; a second
test compiles one kernel for real from a warm cache, and a third runs a few nasty inputs
through `python -m flashgen` in a subprocess, as a user would.
"""

from __future__ import annotations

import inspect as pyinspect
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashgen.cli import app as cli
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec
from flashgen.verify import checks

REPO = Path(__file__).resolve().parents[2]
COMMANDS = ("build", "show", "list", "inspect", "check")
NO_NVCC = "/nonexistent/flashgen-fuzz/nvcc"
# Cap the examples per command (each is an in-process CLI run of a few milliseconds): the
# `ci` profile's 50 take about a second per command.
MAX_EXAMPLES = min(settings.default.max_examples, 60)

# argv cannot carry NUL (execve strings end at it), so no fuzzed string holds one.
TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=24,
)
INTS = st.one_of(
    st.sampled_from([0, 1, -1, 8, 16, 32, 48, 64, 96, 128, 256, 65535, 65536, 2**31 - 1, 2**31]),
    st.integers(min_value=1, max_value=300),
    st.integers(min_value=-(2**80), max_value=2**80),
).map(str)
FLOATS = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "1e999", "-0.0", "0", "1e-320", "0.125", "3e38"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
NAMES = st.sampled_from(sorted(s.name for s in shipped()))
MUTATED_NAMES = st.one_of(
    NAMES,
    NAMES.map(lambda n: n + "_"),
    NAMES.map(lambda n: n.upper()),
    NAMES.map(lambda n: n.replace("_d", "_d-", 1)),
    NAMES.map(lambda n: n.replace("bc", "bc9999999999999999999", 1)),
    st.just("flash_fwd_mma_d64_br128_bc64_bf16_noncausal_w4_s99999999999999999999"),
    TEXT,
)
# Path components: never "", ".", ".." or a separator, so every path stays in the sandbox;
# "afile" (a regular file) and "adir" exist, and long names hit ENAMETOOLONG.
COMPONENT = st.one_of(
    st.sampled_from(["out", "afile", "adir", "-x", "a b", "é中", "x" * 300]),
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00/\\"),
        min_size=1,
        max_size=12,
    ).filter(lambda c: c not in (".", "..")),
)
PATHS = st.lists(COMPONENT, min_size=1, max_size=3).map(lambda parts: "/".join(parts))


# Values that make a valid spec likely, so that some invocations get past the spec and reach
# the later checks (problem sizes, scale, seed, paths).
PLAUSIBLE = {
    "d": ["16", "32", "64", "128"],
    "br": ["16", "32", "64", "128"],
    "bc": ["16", "32", "64", "128"],
    "warps": ["4", "8"],
    "stages": ["1", "2"],
}


def _option_tokens(opt: click.Option, plausible: bool) -> st.SearchStrategy[list[str]]:
    """Tokens for one option: a flag spelling, or the option and a value of roughly its type."""
    if opt.is_flag:
        return st.sampled_from([[o] for o in (*opt.opts, *opt.secondary_opts)])
    name = opt.opts[0]
    kind = opt.type
    value: st.SearchStrategy[str]
    if plausible and opt.name in PLAUSIBLE:
        value = st.sampled_from(PLAUSIBLE[opt.name])
    elif isinstance(kind, click.Choice):
        choices = st.sampled_from([str(c) for c in kind.choices])
        value = choices if plausible else st.one_of(choices, TEXT)
    elif isinstance(kind, click.types.IntParamType):  # IntRange included
        value = st.one_of(INTS, INTS, TEXT)
    elif isinstance(kind, click.types.FloatParamType):
        value = st.one_of(FLOATS, TEXT)
    elif isinstance(kind, click.Path):
        value = PATHS
    elif opt.name in ("name", "names"):
        value = NAMES if plausible else MUTATED_NAMES
    else:
        value = TEXT
    return value.map(lambda v: [name, v])


@st.composite
def invocations(draw: st.DrawFn, command: str) -> list[str]:
    """argv for one command: a random subset of its options, in random order, some junk.

    Half the time the spec options take plausible values (and fewer options are given), so
    that valid specs are common and the later checks get fuzzed too.
    """
    plausible = draw(st.booleans())
    options = [p for p in cli.main.commands[command].params if isinstance(p, click.Option)]
    if plausible and draw(st.booleans()):  # --name fixes every spec field: usually leave it out
        options = [o for o in options if o.name != "name"]
    chosen = draw(
        st.lists(
            st.sampled_from(options), unique_by=lambda o: o.name, max_size=4 if plausible else 8
        )
    )
    d_option = [o for o in options if o.name == "d"]
    if plausible and d_option and not any(o.name in ("d", "name") for o in chosen):
        chosen.append(d_option[0])  # a spec needs --d (or --name)
    groups = [draw(_option_tokens(o, plausible)) for o in chosen]
    if draw(st.integers(0, 9)) == 0:  # a stray positional argument or an unknown option
        groups.append([draw(st.one_of(TEXT, st.just("--no-such-option")))])
    if draw(st.integers(0, 29)) == 0:
        groups.append(["--help"])
    groups = draw(st.permutations(groups))
    return [command, *(token for group in groups for token in group)]


def _run(argv: list[str], env: dict[str, str | None]) -> Result:
    # click < 8.2 mixes stderr into stdout unless told not to
    kw: dict[str, Any] = (
        {"mix_stderr": False}
        if "mix_stderr" in pyinspect.signature(CliRunner.__init__).parameters
        else {}
    )
    return CliRunner(**kw).invoke(cli.main, argv, env=env, catch_exceptions=False)


def assert_allowed_outcome(argv: list[str], code: int, stdout: str, stderr: str) -> None:
    """Exit 0 with output (stderr: notes only), or exit 2 with one `error: ` line."""
    where = f"flashgen {' '.join(map(repr, argv))}"
    assert "Traceback" not in stdout + stderr, f"{where}: traceback\n{stderr}"
    if code == 0:
        assert stdout.strip(), f"{where}: exit 0 without output"
        for line in stderr.splitlines():
            assert line.startswith("note: "), f"{where}: exit 0 but stderr says {line!r}"
        return
    assert code == 2, f"{where}: exit {code}\nstdout: {stdout[-500:]}\nstderr: {stderr[-500:]}"
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), f"{where}: stderr {lines!r}"


def _tree(root: Path) -> dict[str, tuple[bool, int, int]]:
    """Every path under root: (is a directory, size, mtime in ns)."""
    out = {}
    for p in root.rglob("*"):
        st_ = p.lstat()
        out[p.relative_to(root).as_posix()] = (p.is_dir(), st_.st_size, st_.st_mtime_ns)
    return out


def _allowed_roots(command: str, argv: list[str]) -> list[str]:
    """The paths a command may write under: its path options' values, else their defaults."""
    roots = []
    for opt in cli.main.commands[command].params:
        if not (isinstance(opt, click.Option) and isinstance(opt.type, click.Path)):
            continue
        given_values = [argv[i + 1] for i, tok in enumerate(argv[:-1]) if tok in opt.opts]
        default = opt.default
        if isinstance(default, tuple):  # an option given at most once keeps its default in a tuple
            default = default[0] if default else None
        if given_values:
            roots.append(given_values[-1])  # a repeated one is refused; anyway the last
        elif default is not None:
            roots.append(str(default))
    return [Path(os.path.normpath(r)).as_posix() for r in roots]


def assert_writes_stay_inside(
    before: dict[str, tuple[bool, int, int]],
    after: dict[str, tuple[bool, int, int]],
    roots: list[str],
    argv: list[str],
) -> None:
    """New or changed paths lie under an allowed root (or are directories leading to one)."""
    for path, meta in after.items():
        if before.get(path) == meta:
            continue
        inside = any(path == r or path.startswith(r + "/") for r in roots)
        leading = meta[0] and any(r.startswith(path + "/") for r in roots)
        assert inside or leading, f"flashgen {argv!r} wrote {path!r} outside {roots!r}"
    gone = sorted(set(before) - set(after))
    assert not gone, f"flashgen {argv!r} removed {gone!r}"


@contextmanager
def sandbox() -> Iterator[Path]:
    """A fresh temporary working directory holding a file `afile` and a directory `adir`."""
    old = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="flashgen-fuzz-") as tmp:
        root = Path(tmp)
        (root / "afile").write_text("not a directory\n")
        (root / "adir").mkdir()
        os.chdir(root)
        try:
            yield root
        finally:
            os.chdir(old)


@pytest.fixture(scope="module")
def no_gpu() -> Iterator[list[tuple[Any, ...]]]:
    """`check` meets "no GPU" right after validation, on every machine; records the problems.

    The real first GPU use comes later (in gpu_execute); failing at input generation instead
    keeps the fuzz from allocating the inputs of the problems it draws.
    """
    seen: list[tuple[Any, ...]] = []

    def make_inputs(spec: KernelSpec, case: checks.Case) -> Any:
        seen.append((spec, case))
        raise checks.GpuUnavailable("no CUDA device (fuzz test)")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checks, "make_inputs", make_inputs)
        yield seen


@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
@pytest.mark.parametrize("command", COMMANDS)
def test_random_invocations_exit_0_or_2_with_one_line_and_write_only_under_out(
    command: str, data: st.DataObject, no_gpu: list[tuple[Any, ...]]
) -> None:
    argv = data.draw(invocations(command), label="argv")
    with sandbox() as root:
        env: dict[str, str | None] = {
            "FLASHGEN_NVCC": NO_NVCC,
            "FLASHGEN_CACHE_DIR": str(root / "cache"),
            "FLASHGEN_HYPOTHESIS_PROFILE": None,
        }
        before = _tree(root)
        result = _run(argv, env)
        assert_allowed_outcome(argv, result.exit_code, result.stdout, result.stderr)
        roots = [*_allowed_roots(argv[0], argv), "cache"]
        assert_writes_stay_inside(before, _tree(root), roots, argv)
    for _spec, case in no_gpu:  # problems reach input generation only once validated
        elements = case.b * case.h * (case.tq + 2 * case.tk) * _spec.d
        assert 1 <= elements <= checks.MAX_CHECK_ELEMENTS and case.seed >= 0
    no_gpu.clear()


# Known nasty inputs, run in-process so a failure shows the exact case.
PINNED = [
    ["check", "--d", "64", "--tq", "2000000000"],
    ["check", "--d", "64", "--b", "65536"],
    ["check", "--d", "64", "--scale", "nan"],
    ["check", "--d", "64", "--scale", "-1"],
    ["check", "--d", "64", "--seed", "-1"],
    ["check", "--d", "64"],
    ["show", "--d", "99999999999999999999999999"],
    ["show", "--name", "flash_fwd_mma_d64_br128_bc64_bf16_noncausal_w4_s99999999999999999999"],
    ["build", "--d", "64", "--no-compile", "--out", "afile"],
    ["build", "--d", "64", "--no-compile", "--out", "afile/x"],
    ["build", "--d", "64", "--out", "x" * 300],
    ["build", "--d", "64", "--no-compile", "--out", "a b/é中/-x"],
    ["inspect", "--d", "64", "--json"],
    ["list", "--family", "é中"],
    ["list", "--all", "extra"],
]


@pytest.mark.parametrize("argv", PINNED, ids=" ".join)
def test_pinned_nasty_inputs(argv: list[str], no_gpu: list[tuple[Any, ...]]) -> None:
    with sandbox() as root:
        env = {"FLASHGEN_NVCC": NO_NVCC, "FLASHGEN_CACHE_DIR": str(root / "cache")}
        before = _tree(root)
        result = _run(argv, env)  # type: ignore[arg-type]
        assert_allowed_outcome(argv, result.exit_code, result.stdout, result.stderr)
        roots = [*_allowed_roots(argv[0], argv), "cache"]
        assert_writes_stay_inside(before, _tree(root), roots, argv)
    no_gpu.clear()


# ---- a few real compiles, from a warm cache ------------------------------------------------------
WARM = KernelSpec(family="simt", d=64, br=32, bc=32, dtype="fp32")  # what `--d 64` builds


@pytest.fixture(scope="module")
def warm_cache(nvcc_required: Path) -> KernelSpec:
    """The default cubin cache with `WARM` compiled for the default arch (one nvcc run)."""
    from flashgen.generator.compile import compile_kernel

    compile_kernel(WARM)
    return WARM


SPELLINGS = (["--d", "64"], ["--name", WARM.name], ["--family", "simt", "--d", "64", "--no-causal"])
EXTRAS = {"build": (["--out", "k/o"], ["--compile"]), "inspect": (["--json"], ["--tq", "77"])}


@settings(max_examples=min(MAX_EXAMPLES, 8), deadline=None)
@given(data=st.data())
def test_compiling_from_a_warm_cache_succeeds_and_writes_only_under_out(
    data: st.DataObject, warm_cache: KernelSpec
) -> None:
    command = data.draw(st.sampled_from(sorted(EXTRAS)))
    groups = [data.draw(st.sampled_from(SPELLINGS))]
    groups += data.draw(st.lists(st.sampled_from(EXTRAS[command]), unique_by=tuple))
    argv = [command, *(t for g in data.draw(st.permutations(groups)) for t in g)]
    env = {"FLASHGEN_HYPOTHESIS_PROFILE": None}  # the real nvcc and the default (warm) cache
    with sandbox() as root:
        before = _tree(root)
        result = _run(argv, env)
        assert result.exit_code == 0, (argv, result.stdout, result.stderr)
        assert_allowed_outcome(argv, result.exit_code, result.stdout, result.stderr)
        assert "cache hit" in result.stdout or '"cache_hit": true' in result.stdout
        assert_writes_stay_inside(before, _tree(root), _allowed_roots(command, argv), argv)


# ---- the same through `python -m flashgen`, as a user runs it ------------------------------------
SUBPROCESS_CASES: list[list[str | bytes]] = [
    ["check", "--d", "64", "--tq", "2000000000"],
    ["check", "--d", "64", "--scale", "inf"],
    ["check", "--d", "64", "--seed", "-5"],
    ["show", "--d", "-99999999999999999999"],
    ["show", b"--d\xff", "64"],  # argv bytes that are not UTF-8
    ["build", "--d", "64", "--no-compile", "--out", "afile/x"],
    ["inspect", "--d", "64", "--arch", "sm_99"],
    ["list", "--family", "é中"],
]


def test_python_m_flashgen_nasty_inputs_are_one_line_errors(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("not a directory\n")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        FLASHGEN_NVCC=NO_NVCC,
        FLASHGEN_CACHE_DIR=str(tmp_path / "cache"),
    )
    before = _tree(tmp_path)
    procs = [
        (
            case,
            subprocess.Popen(
                [sys.executable, "-m", "flashgen", *case],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            ),
        )
        for case in SUBPROCESS_CASES
    ]  # started together: the interpreter start-ups overlap
    for case, proc in procs:
        out, err = proc.communicate(timeout=120)
        argv = [os.fsdecode(a) for a in case]
        assert_allowed_outcome(argv, proc.returncode, out.decode(), err.decode(errors="replace"))
        assert proc.returncode == 2, (argv, err)
    assert _tree(tmp_path) == before  # every case failed before writing anything
