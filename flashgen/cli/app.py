"""The `flashgen` command line: thin click commands that parse, call generator/, and print.

The commands register on the group of `flashgen.cli.group`, which imports this module the
first time one of them is looked up (so `flashgen --help` stays light).

Every failure a user can cause (a broken spec, a bad option, no nvcc, an nvcc error, no GPU)
ends as ONE line `error: ...` on stderr and exit code 2 -- never a traceback. `check` and
`fuzz` exit 1 when a kernel gives a wrong answer.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click
import jinja2

from flashgen.bundle.emit import (
    BundleError,
    bundle_files,
    select_variants,
    stale_kernels,
    write_bundle,
)
from flashgen.cli.group import USAGE_EXIT, main, one_line
from flashgen.cli.hook_files import OPTION, HookFileError, hook_tokens_of
from flashgen.generator.arch import ARCHS, STATIC_SMEM_LIMIT, ArchError, arch_info, check_target
from flashgen.generator.cache import (
    CubinCache,
    atomic_write,
    clear_fallback_cache,
    fallback_cache_dir,
    holds_bytes,
)
from flashgen.generator.compile import (
    CompiledKernel,
    CompileError,
    clear_work_root,
    compile_kernel,
    target_arch,
)
from flashgen.generator.dtypes import DTYPES
from flashgen.generator.families import FAMILIES, WgmmaFamily, family_of
from flashgen.generator.features.hook import hook_tokens
from flashgen.generator.nvcc import (
    NvccNotFound,
    NvccSettingError,
    bundle_toolkit_note,
    nvcc_timeout,
)
from flashgen.generator.render import render
from flashgen.generator.select import default_fields, family_defaults
from flashgen.generator.space import pruned, shipped
from flashgen.generator.spec import DEFAULT_FAMILY, DIRECTIONS, FEATURES, KernelSpec, SpecError
from flashgen.perf.occupancy import occupancy, register_split
from flashgen.perf.sass import INSTALL_HINT as SASS_HINT
from flashgen.perf.sass import (
    InstructionMix,
    SassUnavailable,
    disassemble,
    format_mix,
    instruction_mix,
)
from flashgen.perf.traffic import format_traffic, traffic_report
from flashgen.runtime.validate import MAX_GRID_YZ

if TYPE_CHECKING:  # checks pulls in Hypothesis and the runtime: imported by the commands
    from flashgen.verify.checks import VariantResult

F = TypeVar("F", bound=Callable[..., Any])

FAIL_EXIT = 1  # a kernel gave a wrong answer
ARCH_ENV = "FLASHGEN_ARCH"  # the arch when --arch is not given (generator.compile reads it)


# Tile and dtype defaults when the user names only `--d`: the shipped, well-balanced choice of
# each family (simt: one 32-row tile per 4 warps; mma: FlashAttention-2's 128x64 tiles).
NVCC_HINT = (
    'to compile, install the CUDA toolkit or nvcc from PyPI: pip install -e ".[nvcc]" '
    '(in a checkout) or pip install "flashgen[nvcc]"'
)


# ---- errors: one line, exit code 2 -----------------------------------------------------------
class CliError(click.ClickException):
    """A user-facing failure: printed as one `error: ...` line, exit code 2."""

    exit_code = USAGE_EXIT


# Exceptions the generator raises for things the user can fix; anything else is a bug and
# keeps its traceback.
# inspect's traffic model walks the query tiles one by one: keep it to about a second
MAX_MODEL_LENGTH = 1 << 24

KNOWN_ERRORS: tuple[type[BaseException], ...] = (
    SpecError,
    BundleError,
    NvccNotFound,
    NvccSettingError,
    CompileError,
    ArchError,
    jinja2.TemplateError,
)

# What an OSError means to someone who asked flashgen to read or write a path.
_OS_REASONS: dict[int, str] = {
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EISDIR: "it is a folder, not a file",
    errno.EEXIST: "something else already exists there",
    errno.ENOENT: "no such file or folder",
    errno.EACCES: "permission denied",
    errno.EPERM: "not permitted",
    errno.EROFS: "the file system is read-only",
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is used up",
    errno.ENAMETOOLONG: "the name is too long",
    errno.ELOOP: "too many symlinks in the path",
}


def describe_os_error(exc: OSError) -> str:
    """An OSError as `<path>: <what is wrong>; <fix>`, without Python's `[Errno N]` wording."""
    path = exc.filename if exc.filename is not None else None
    if path is None or exc.errno is None:  # flashgen's own OSErrors carry a full sentence
        return one_line(str(exc)) or "an operating-system error"
    reason = _OS_REASONS.get(exc.errno) or (exc.strerror or "failed").lower()
    if exc.filename2 is not None:
        path = f"{path} -> {exc.filename2}"
    return f"{path}: {reason}; choose another path or fix its permissions"


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn the generator's user-facing exceptions into `CliError` (one line, exit 2)."""
    try:
        yield
    except (CliError, BrokenPipeError):  # a closed pipe (`show | head`) is click's to handle
        raise
    except jinja2.TemplateNotFound as exc:
        raise CliError(f"template {exc.name} not found: this family cannot render yet") from exc
    except KNOWN_ERRORS as exc:
        raise CliError(one_line(str(exc)) or type(exc).__name__) from exc
    except OSError as exc:
        raise CliError(describe_os_error(exc)) from exc


def friendly(fn: F) -> F:
    """Decorator: run a command body under `user_errors()`."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with user_errors():
            return fn(*args, **kwargs)

    return cast(F, wrapper)


# ---- the spec options every kernel command shares ---------------------------------------------
def spec_options(fn: F) -> F:
    """Add --family/--d/--br/--bc/--dtype/--causal/--warps/--stages/--name to a command."""
    options = [
        click.option(
            "--name",
            "name",
            metavar="KERNEL",
            help="A kernel name (from `flashgen list`) instead of the options below.",
        ),
        click.option(
            "--family",
            type=click.Choice(list(FAMILIES)),
            help="Kernel family (default: simt).",
        ),
        click.option("--d", "d", type=int, help="Head dimension, e.g. 64."),
        click.option(
            "--dv",
            "dv",
            type=int,
            help="Value head dim (of v and o) when it differs from d, e.g. --d 192 --dv 128.",
        ),
        click.option(
            "--br",
            type=int,
            help="Query rows per block (default: the family's shipped tile for this d).",
        ),
        click.option(
            "--bc", type=int, help="Keys per K/V tile (default: the family's shipped tile)."
        ),
        click.option(
            "--dtype",
            type=click.Choice(list(DTYPES)),
            help="Storage dtype of Q, K, V, O (default: simt fp32, mma bf16).",
        ),
        click.option(
            "--causal/--no-causal",
            default=None,
            help="Bottom-right aligned causal mask (default: off).",
        ),
        click.option(
            "--warps",
            type=click.IntRange(min=1),
            help="Warps per block (default: the family's).",
        ),
        click.option(
            "--stages",
            type=click.IntRange(min=1),
            help="K/V pipeline stages (families with a pipeline; default: the family's).",
        ),
        click.option(
            "--features",
            metavar="LIST",
            help="Compile-time features, comma-separated: "
            + ", ".join(FEATURES)
            + " (their values are call arguments).",
        ),
        click.option(
            "--direction",
            type=click.Choice(list(DIRECTIONS)),
            help="fwd (default); bwd: the backward pass (dQ, dK, dV; family mma, or wgmma "
            "on sm_90a, d a multiple of 8 up to 128); decode: the K/V-cache decode kernel "
            "(family mma; build, show and inspect).",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def spec_from_options(
    name: str | None,
    family: str | None,
    d: int | None,
    br: int | None,
    bc: int | None,
    dtype: str | None,
    causal: bool | None,
    warps: int | None,
    stages: int | None,
    features: str | None = None,
    dv: int | None = None,
    direction: str | None = None,
    hooks: tuple[str, ...] = (),
) -> KernelSpec:
    """Build the KernelSpec the options describe, with `hooks` (registered hook tokens) among
    its features; SpecError / CliError when they do not."""
    feats = (*parse_features(features), *hooks)
    given = {
        "--family": family,
        "--d": d,
        "--br": br,
        "--bc": bc,
        "--dtype": dtype,
        "--causal/--no-causal": causal,
        "--warps": warps,
        "--stages": stages,
        "--features": features,
        "--dv": dv,
        "--direction": direction,
    }
    if name is not None:
        clash = [opt for opt, value in given.items() if value is not None]
        if clash:
            raise CliError(
                f"--name {name} already fixes every field; drop {', '.join(clash)} or drop --name"
            )
        return KernelSpec.from_name(name)
    if d is None:
        raise CliError(
            "--d is required (the head dimension, e.g. --d 64), or name a kernel with --name"
        )
    fam = family or DEFAULT_FAMILY
    if direction in ("bwd", "decode"):  # nothing of these ships per tile: the spec's defaults
        return KernelSpec(
            family=fam, d=d, direction=direction, causal=bool(causal), features=feats, dv=dv or 0,
            dtype=dtype or family_defaults(fam, d).get("dtype", "bf16"), br=br or 0,
            bc=bc or 0, warps=warps or 0, stages=stages or 0,
        )  # fmt: skip
    try:
        fields = default_fields(fam, d, br, bc, dtype, bool(causal), warps, stages)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return KernelSpec(family=fam, d=d, causal=bool(causal), features=feats, dv=dv or 0, **fields)


def parse_features(text: str | None) -> tuple[str, ...]:
    """`window,softcap` -> ("window", "softcap"); the spec checks each token."""
    if text is None:
        return ()
    return tuple(t.strip() for t in text.split(",") if t.strip())


def hook_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--score-mod / --mask-mod FILE:NAME: a user hook compiled into the variant
    (cli/hook_files.py; docs/hooks.md)."""
    for kind, option in reversed(OPTION.items()):
        fn = click.option(
            option,
            kind,
            metavar="FILE:NAME",
            help=f"A {kind} hook: NAME in Python file FILE, a traced hook "
            f"(hk.trace_{kind}(fn, hk.Aux(...))) or a function without aux (docs/hooks.md).",
        )(fn)
    return fn


def with_hooks(spec: KernelSpec, score_mod: str | None, mask_mod: str | None) -> KernelSpec:
    """`spec` with the hooks the options name (registered in this process). A spec named by
    --name that already carries hook tokens must name the same hooks."""
    try:
        tokens = hook_tokens_of(score_mod, mask_mod)
    except HookFileError as exc:
        raise CliError(str(exc)) from None
    named = hook_tokens(spec.features)
    if named:
        if set(tokens) != set(named):
            raise CliError(
                f"{spec.name} carries {', '.join(named)}; pass the hooks with those digests "
                f"(--score-mod/--mask-mod FILE:NAME; given: {', '.join(tokens) or 'none'})"
            )
        return spec
    return spec.replace(features=(*spec.features, *tokens)) if tokens else spec


def _spec(kw: dict[str, Any], hooks: tuple[str, ...] = ()) -> KernelSpec:
    keys = (
        "name", "family", "d", "br", "bc", "dtype", "causal", "warps", "stages", "features", "dv",
        "direction",
    )  # fmt: skip
    fields: dict[str, Any] = {k: kw.pop(k) for k in keys}  # spec_from_options' parameters
    return spec_from_options(**fields, hooks=hooks)


def _hooked_spec(kw: dict[str, Any], score_mod: str | None, mask_mod: str | None) -> KernelSpec:
    """The spec of build/show's options and hooks. Built with the hooks among its features,
    so that the tile it defaults to is one that takes hooks (the wgmma backward's d 64 default
    does not); a --name spec gets them added (`with_hooks`)."""
    if kw.get("name") is not None:
        return with_hooks(_spec(kw), score_mod, mask_mod)
    try:
        tokens = hook_tokens_of(score_mod, mask_mod)
    except HookFileError as exc:
        raise CliError(str(exc)) from None
    return _spec(kw, hooks=tokens)


# ---- the target arch: --arch, else FLASHGEN_ARCH, else the GPU's --------------------------------
def env_arch(*, has_arch_option: bool = False) -> str | None:
    """FLASHGEN_ARCH when set; CliError naming it when flashgen does not know that arch."""
    env = os.environ.get(ARCH_ENV)
    if env and env not in ARCHS:
        raise CliError(
            f"{ARCH_ENV}={env}: not a supported arch; set it to one of {', '.join(ARCHS)}, "
            "or unset it" + (" (or pass --arch)" if has_arch_option else "")
        )
    return env or None


def checked_target(spec: KernelSpec, arch: str | None) -> str:
    """The arch `spec` is compiled for (what compile_kernel would pick), after checking that
    it runs there: CliError naming FLASHGEN_ARCH when that variable chose the arch."""
    env = env_arch(has_arch_option=True) if arch is None else None
    target = target_arch(spec, arch)
    try:
        check_target(spec.name, spec.family, spec.archs, spec.smem_bytes, target)
    except ArchError as exc:
        if env is None:
            raise
        why = re.sub(r"^arch=\S+: ", "", one_line(str(exc)))
        raise CliError(
            f"{ARCH_ENV}={env} (the arch when --arch is not given): {why}; or set "
            f"{ARCH_ENV} to another arch, or unset it"
        ) from None
    return target


# ---- small printing helpers ---------------------------------------------------------------------
def _fmt_bytes(n: int) -> str:
    return f"{n:,} B"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """Aligned plain-text table lines (numbers right-aligned): greppable, no wrapping."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, r, strict=True)]
    numeric = [
        bool(rows)
        and all(isinstance(r[i], int | float) and not isinstance(r[i], bool) for r in rows)
        for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return [line(list(headers)), line(["-" * w for w in widths]), *(line(r) for r in cells)]


def _stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def _stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


def _describe_compile(ck: CompiledKernel) -> str:
    r = ck.report
    how = "cache hit" if ck.cached else f"nvcc {ck.nvcc_seconds:.1f} s"
    if ck.waited_seconds >= 0.1:  # another process was building it: not compile time
        how += f", after waiting {ck.waited_seconds:.1f} s for another build of it"
    return (
        f"compiled for {ck.arch} ({how}): {r.registers} registers, smem "
        f"{_fmt_bytes(r.static_smem)} static + {_fmt_bytes(ck.spec.smem_bytes)} dynamic, "
        f"stack {_fmt_bytes(r.stack_frame)}, spills {_fmt_bytes(r.spill_bytes)}"
    )


# ---- the commands -------------------------------------------------------------------------------
@main.command(
    epilog="""\b
Examples:
  flashgen build --d 64 --bc 32
  flashgen build --family mma --d 128 --dtype bf16 --causal --arch sm_80 --out kernels/
  flashgen build --name flash_fwd_simt_d64_br32_bc32_fp32_noncausal --no-compile
  flashgen build --family mma --d 128 --causal --bundle attn/   (CMake bundle with a C ABI)
"""
)
@spec_options
@hook_options
@click.option(
    "--arch",
    type=click.Choice(list(ARCHS)),
    help="Target GPU arch (default: FLASHGEN_ARCH, else the local GPU's, else sm_90).",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("generated"),
    show_default=True,
    help="Directory for <name>.cu (nothing is written anywhere else).",
)
@click.option(
    "--bundle",
    "bundle_dir",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="Instead of OUT/<name>.cu, write a self-contained CMake bundle with a C ABI to DIR "
    "(several variants: `flashgen bundle`).",
)
@click.option(
    "--compile/--no-compile", "do_compile", default=True, help="Compile with nvcc (default: on)."
)
@friendly
def build(
    arch: str | None,
    out: Path,
    bundle_dir: Path | None,
    do_compile: bool,
    score_mod: str | None,
    mask_mod: str | None,
    **kw: Any,
) -> None:
    """Write OUT/<name>.cu for a spec and compile it with nvcc.

    The file is rewritten only when its content changes. Without nvcc the source is still
    written and the command succeeds with a note. With --bundle DIR, the kernel, a host
    launcher with a C ABI, its header, a CMakeLists.txt, an example and a README go to DIR.
    A build the target arch refuses (an unknown arch, wgmma off sm_90a, too much shared
    memory) writes nothing.
    """
    spec = _hooked_spec(kw, score_mod, mask_mod)
    if bundle_dir is not None:
        source = click.get_current_context().get_parameter_source("out")
        if source != click.core.ParameterSource.DEFAULT:
            raise CliError("--out and --bundle both name where to write; drop one of them")
    rendered = render(spec)
    # every refusal before anything is written: the arch (when it matters) and nvcc's settings
    target = checked_target(spec, arch) if do_compile or arch is not None else None
    if do_compile:
        nvcc_timeout()
    if bundle_dir is not None:
        _write_bundle([spec], bundle_dir)
    else:
        path = out / rendered.filename
        data = rendered.source.encode()
        unchanged = holds_bytes(path, data)  # a regular file only, read bounded
        if not unchanged:
            atomic_write(path, data)
        click.echo(f"{'unchanged' if unchanged else 'wrote'} {path} ({_fmt_bytes(len(data))})")
    # after the write: a write that fails (a bad --out) leaves its error the only line
    if spec not in set(shipped(spec.family, direction=spec.direction)):
        click.echo(
            f"note: {spec.name} is not a shipped variant: the property suite has never run it "
            "(`flashgen check` tests it on a GPU; `flashgen list` shows the shipped ones)",
            err=True,
        )
    if not do_compile:
        return
    try:
        ck = compile_kernel(rendered, target)
    except NvccNotFound as exc:
        click.echo(f"note: not compiled: {one_line(str(exc))}", err=True)
        click.echo(f"note: {NVCC_HINT}, then run the same command again", err=True)
        return
    click.echo(_describe_compile(ck))


def _write_bundle(specs: list[KernelSpec], out: Path) -> None:
    """Render and write a bundle, one line per file, then how to build it."""
    files = bundle_files(specs)
    for path, changed in write_bundle(files, out):
        size = _fmt_bytes(len(files[path.relative_to(out).as_posix()].encode()))
        click.echo(f"{'wrote' if changed else 'unchanged'} {path} ({size})")
    for stale in stale_kernels(files, out):
        click.echo(f"note: {stale} is not part of this bundle (not built; delete it)", err=True)
    toolkit = bundle_toolkit_note()
    if toolkit:
        click.echo(f"note: {toolkit}", err=True)
    n = len(files) - len(specs)
    click.echo(
        f"bundle {out}: {len(specs)} variant{'s' if len(specs) > 1 else ''} + {n} files; "
        f"build: cmake -S {out} -B {out}/build && cmake --build {out}/build && "
        f"{out}/build/example"
    )


@main.command(
    "bundle",
    epilog="""\b
Examples:
  flashgen bundle attn/ --d 64 --d 128                   bf16, causal and not: 4 variants
  flashgen bundle attn/ --family mma --d 128 --dtype fp16 --dtype bf16 --causal
  flashgen bundle attn/ --d 64 --dtype fp32              (fp32 is served by family simt)
  flashgen bundle attn/ --d 128 --gpu nvidia-h200        the variants tuned for an H200
  flashgen bundle attn/ --name flash_fwd_simt_d64_br32_bc32_fp32_noncausal
  flashgen bundle attn/ --d 128 --features window --features window,softcap
  flashgen bundle attn/ --d 128 --d 256 --arch sm_86     tiles that fit an RTX 30xx
  flashgen bundle attn/ --d 128 --causal --mask-mod docs.py:doc_mask   (hooked: C aux struct)
  cmake -S attn -B attn/build && cmake --build attn/build && attn/build/example
""",
)
@click.argument("out", type=click.Path(file_okay=False, path_type=Path), metavar="DIR")
@click.option(
    "--name", "names", multiple=True, metavar="KERNEL", help="A kernel to include (repeatable)."
)
@click.option(
    "--family",
    "families",
    type=click.Choice(list(FAMILIES)),
    multiple=True,
    help="Families to pick from (repeatable; default: all, mma preferred for fp16/bf16).",
)
@click.option("--d", "ds", type=int, multiple=True, help="A head dimension (repeatable).")
@click.option(
    "--dtype",
    "dtypes",
    type=click.Choice(list(DTYPES)),
    multiple=True,
    help="A storage dtype (repeatable; default: bf16).",
)
@click.option(
    "--causal/--no-causal",
    default=None,
    help="Only causal / only non-causal variants (default: both).",
)
@click.option(
    "--gpu",
    "gpu_name",
    default=None,
    metavar="GPU",
    help="Prefer the variants `flashgen tune` measured fastest on this GPU (e.g. nvidia-h200).",
)
@click.option(
    "--features",
    "feature_sets",
    multiple=True,
    metavar="LIST",
    help="Also bundle each variant compiled with these features, comma-separated (repeatable: "
    "one set per option; e.g. --features window --features window,softcap).",
)
@click.option(
    "--arch",
    type=click.Choice(list(ARCHS)),
    default=None,
    help="Choose the variants for this GPU arch (e.g. sm_86: tiles that fit its 99 KiB of "
    "shared memory per block), from the families that run on it (default: a portable bundle, "
    "chosen as for sm_80).",
)
@hook_options
@friendly
def bundle(
    out: Path,
    names: tuple[str, ...],
    families: tuple[str, ...],
    ds: tuple[int, ...],
    dtypes: tuple[str, ...],
    causal: bool | None,
    gpu_name: str | None,
    feature_sets: tuple[str, ...],
    arch: str | None,
    score_mod: str | None,
    mask_mod: str | None,
) -> None:
    """Write a self-contained CMake bundle to DIR: kernels, C-ABI launchers, header, example.

    One variant per (d, dtype, causal) from --d x --dtype x causal (both unless --causal or
    --no-causal), chosen like flashgen.attention chooses, or the kernels named with --name.
    The bundle's flashgen_fwd() dispatches on (d, dtype, causal) and returns
    cudaErrorNotSupported for any other key. With --score-mod / --mask-mod every variant
    compiles the hooks in and takes their aux values in a flashgen_hook_aux struct (its own
    entry points). See DIR/README.md.
    """
    try:
        hooks = hook_tokens_of(score_mod, mask_mod)
    except HookFileError as exc:
        raise CliError(str(exc)) from None
    specs = select_variants(
        names=names, families=families, ds=ds, dtypes=dtypes, causal=causal, gpu_name=gpu_name,
        features=[parse_features(f) for f in feature_sets], arch=arch, hooks=hooks,
    )  # fmt: skip
    _write_bundle(specs, out)


@main.command(
    epilog="""\b
Examples:
  flashgen show --d 64 --bc 32
  flashgen show --family mma --d 128 --causal | less
"""
)
@spec_options
@hook_options
@friendly
def show(score_mod: str | None, mask_mod: str | None, **kw: Any) -> None:
    """Print a kernel's generated CUDA source (highlighted on a terminal, plain when piped)."""
    source = render(_hooked_spec(kw, score_mod, mask_mod)).source
    if _stdout_is_terminal():
        from rich.console import Console
        from rich.syntax import Syntax

        # soft_wrap: long lines go to the terminal as they are, neither cropped nor re-wrapped
        Console(force_terminal=True).print(
            Syntax(source, "cuda", theme="monokai", background_color="default"), soft_wrap=True
        )
    else:
        click.echo(source, nl=False)


@main.command(
    "list",
    epilog="""\b
Examples:
  flashgen list
  flashgen list --family mma --all
  flashgen list --direction bwd
""",
)
@click.option("--family", type=click.Choice(list(FAMILIES)), default=None, help="One family only.")
@click.option(
    "--direction",
    type=click.Choice(["fwd", "bwd"]),  # no decode variant ships (each is built on first use)
    default="fwd",
    show_default=True,
    help="The forward variants, or the backward ones (dQ, dK, dV).",
)
@click.option(
    "--all", "show_all", is_flag=True, help="Also the pruned points, with reasons (forward only)."
)
@friendly
def list_(family: str | None, direction: str, show_all: bool) -> None:
    """Print the shipped variants as a table (forward, or backward with --direction bwd);
    --all adds every pruned point and its reasons."""
    if show_all and direction != "fwd":
        raise CliError(
            "--all lists the pruned points of the forward's axes; the backward has none: drop "
            "--all or --direction bwd"
        )
    specs = shipped(family, direction=direction)
    headers = ["name", "d", "br", "bc", "dtype", "causal", "warps", "stages", "threads", "smem"]
    rows = [
        [
            s.name,
            s.d,
            s.br,
            s.bc,
            s.dtype,
            "yes" if s.causal else "no",
            s.warps,
            s.stages,
            s.threads,
            s.smem_bytes,
        ]
        for s in specs
    ]
    for line in format_table(headers, rows):
        click.echo(line)
    families = [family] if family else list(FAMILIES)
    n_pruned = 0
    if show_all:
        for fam in families:
            points = pruned(fam)
            n_pruned += len(points)
            click.echo(f"\npruned {fam} ({len(points)}):")
            for p in points:
                click.echo(f"  {p.label}: {'; '.join(p.reasons)}")
    per_family = ", ".join(f"{f} {len(shipped(f, direction=direction))}" for f in families)
    which = "backward " if direction == "bwd" else ""
    count = f"\n{len(specs)} shipped {which}variants ({per_family})"
    if show_all:
        count += f", {n_pruned} pruned"
    click.echo(count)


@main.command(
    epilog="""\b
Examples:
  flashgen inspect --d 64 --bc 32
  flashgen inspect --family mma --d 128 --arch sm_80 --json
  flashgen inspect --family mma --d 64 --causal --tq 4096 --tk 4096
SASS needs cuobjdump + nvdisasm: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
"""
)
@spec_options
@click.option(
    "--arch",
    type=click.Choice(list(ARCHS)),
    help="Target GPU arch (default: FLASHGEN_ARCH, else the local GPU's, else sm_90).",
)
@click.option(
    "--b", "b", type=click.IntRange(min=1, max=MAX_GRID_YZ), default=1, show_default=True,
    help="Batch of the traffic model's problem.",
)  # fmt: skip
@click.option(
    "--h", "h", type=click.IntRange(min=1, max=MAX_GRID_YZ), default=16, show_default=True,
    help="Heads of the traffic model's problem.",
)  # fmt: skip
@click.option(
    "--tq", type=click.IntRange(min=1, max=MAX_MODEL_LENGTH), default=8192, show_default=True,
    help="Query length of the traffic model's problem (the model walks it tile by tile).",
)  # fmt: skip
@click.option(
    "--tk", type=click.IntRange(min=1, max=MAX_MODEL_LENGTH), default=8192, show_default=True,
    help="Key/value length of the traffic model's problem.",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@friendly
def inspect(arch: str | None, b: int, h: int, tq: int, tk: int, as_json: bool, **kw: Any) -> None:
    """Compile a kernel and explain it: registers, shared memory, spills, occupancy, the SASS
    instruction mix (when cuobjdump is available) and the HBM traffic model against the
    seed's loop order."""
    spec = _spec(kw)
    ck = compile_kernel(spec, checked_target(spec, arch))
    report = inspect_report(ck, b=b, h=h, tq=tq, tk=tk)
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True))
        return
    for line in format_inspect(report):
        click.echo(line)


def sass_section(ck: CompiledKernel) -> dict[str, Any]:
    """The SASS part of the report: the instruction mix, or why it is missing and the fix."""
    try:
        mix = instruction_mix(disassemble(ck.cubin))
    except (SassUnavailable, ValueError) as exc:
        return {"available": False, "reason": one_line(str(exc)), "hint": SASS_HINT}
    return {"available": True, **mix.to_dict()}


def register_split_section(ck: CompiledKernel) -> dict[str, Any] | None:
    """The setmaxnreg split of a warp-specialized kernel (family wgmma), else None."""
    fam = family_of(ck.spec.family)
    if not isinstance(fam, WgmmaFamily):
        return None
    producer, consumer = fam.register_split(ck.spec)
    split = register_split(
        producer=producer,
        consumer=consumer,
        consumers=fam.consumers(ck.spec),
        launch_registers=ck.report.registers,
    )
    return split.to_dict()


def inspect_report(
    ck: CompiledKernel, *, b: int = 1, h: int = 16, tq: int = 8192, tk: int = 8192
) -> dict[str, Any]:
    """Everything `inspect` prints, as plain data (the --json output)."""
    r = ck.report
    info = arch_info(ck.arch)
    dynamic = ck.spec.smem_bytes
    total = r.static_smem + dynamic
    occ = occupancy(info, threads=ck.spec.threads, registers=r.registers, smem_bytes=total)
    return {
        "name": ck.spec.name,
        "spec": asdict(ck.spec),
        "arch": ck.arch,
        "cache_hit": ck.cached,
        "threads": ck.spec.threads,
        "registers": r.registers,
        "stack_frame": r.stack_frame,
        "spill_stores": r.spill_stores,
        "spill_loads": r.spill_loads,
        "smem": {
            "static": r.static_smem,
            "dynamic": dynamic,
            "total": total,
            "limit_per_block": info.smem_per_block,
            "needs_opt_in": dynamic > STATIC_SMEM_LIMIT,
        },
        "occupancy": occ.to_dict(),
        "register_split": register_split_section(ck),
        "sass": sass_section(ck),
        # the traffic model walks the forward's loop order: a backward has none yet
        "traffic": traffic_report(ck.spec, b=b, h=h, tq=tq, tk=tk)
        if ck.spec.direction == "fwd"
        else None,
    }


def format_inspect(rep: dict[str, Any]) -> list[str]:
    """The human-readable lines of `inspect`."""
    smem, occ = rep["smem"], rep["occupancy"]
    by = occ["blocks_by"]
    opt_in = (
        "; over 48 KiB, so the launch opts in to the larger limit" if smem["needs_opt_in"] else ""
    )
    spills = rep["spill_stores"] + rep["spill_loads"]
    n = occ["blocks_per_sm"]
    blocks = f"{n} block" if n == 1 else f"{n} blocks"
    lines = [
        f"{rep['name']}  ({rep['arch']}, {'cache hit' if rep['cache_hit'] else 'compiled'})",
        f"  threads        {rep['threads']} ({occ['warps_per_block']} warps) per block",
        f"  registers      {rep['registers']} per thread"
        + (" (ptxas; every thread at launch)" if rep.get("register_split") else ""),
        *_format_split(rep.get("register_split")),
        f"  shared memory  {_fmt_bytes(smem['static'])} static + {_fmt_bytes(smem['dynamic'])} "
        f"dynamic = {_fmt_bytes(smem['total'])} of {_fmt_bytes(smem['limit_per_block'])} "
        f"per block ({smem['total'] / smem['limit_per_block']:.0%}){opt_in}",
        f"  stack frame    {_fmt_bytes(rep['stack_frame'])}",
        f"  spills         {_fmt_bytes(spills)} (stores {_fmt_bytes(rep['spill_stores'])}, "
        f"loads {_fmt_bytes(rep['spill_loads'])})",
        f"  occupancy      {blocks} = {occ['warps_per_sm']} of "
        f"{occ['max_warps_per_sm']} warps per SM ({occ['fraction']:.0%}), "
        f"limited by {' and '.join(occ['limited_by'])}",
        f"    blocks/SM by registers {by['registers']}, shared memory {by['smem']}, "
        f"threads {by['threads']}, block limit {by['block_limit']}",
    ]
    sass = rep["sass"]
    if sass["available"]:
        lines += format_mix(_mix_from_dict(sass))
    else:
        lines.append(f"  SASS           not available: {sass['reason']}")
        if sass["hint"] not in sass["reason"]:  # the reason may already say what to install
            lines.append(f"    for the instruction mix: {sass['hint']}")
    if rep["traffic"] is None:
        return [*lines, "  traffic model  forward variants only (this is a backward variant: the "
                        "numbers above are its main kernel's, dK/dV per key tile)"]  # fmt: skip
    return lines + format_traffic(rep["traffic"])


def _format_split(split: dict[str, Any] | None) -> list[str]:
    """The setmaxnreg line of a warp-specialized kernel (none for the other families)."""
    if not split:
        return []
    n, wg = split["consumers"], split["warpgroup_threads"]
    groups = "1 consumer warpgroup" if n == 1 else f"{n} consumer warpgroups"
    verdict = (
        f"{split['split_total']:,} of the {split['launch_total']:,} the launch holds"
        if split["fits"]
        else f"{split['split_total']:,} > the {split['launch_total']:,} the launch holds: "
        "setmaxnreg.inc would wait forever; lower the consumer count"
    )
    return [
        f"    setmaxnreg   producer warpgroup {split['producer']}, {groups} "
        f"{split['consumer']} each (registers per thread)",
        f"      {wg}*({split['producer']} + {n}*{split['consumer']}) = {verdict}",
    ]


def _mix_from_dict(d: dict[str, Any]) -> InstructionMix:
    return InstructionMix(
        functions=tuple(d["functions"]),
        archs=tuple(d["archs"]),
        total=d["total"],
        groups=dict(d["groups"]),
        by_opcode=dict(d["by_opcode"]),
    )


@main.group(
    epilog="""\b
Examples:
  flashgen cache info
  FLASHGEN_CACHE_DIR=/tmp/fg flashgen cache clear
"""
)
def cache() -> None:
    """The compiled-cubin cache (FLASHGEN_CACHE_DIR, default ~/.cache/flashgen)."""


@cache.command(
    "info",
    epilog="""\b
Example:
  flashgen cache info
""",
)
@friendly
def cache_info() -> None:
    """Print the cache directory, its entries and their size."""
    store = CubinCache()  # reads only: creates no folder
    note = "" if store.root.is_dir() else "  (not created yet)"
    click.echo(f"dir      {store.root}{note}")
    click.echo(f"entries  {len(store.entries())}")
    click.echo(f"bytes    {store.size():,}")


@cache.command(
    "clear",
    epilog="""\b
Example:
  flashgen cache clear
""",
)
@friendly
def cache_clear() -> None:
    """Remove every cached cubin, the cache's lock files and folders, and nvcc's work folder."""
    store = CubinCache()
    click.echo(f"removed {store.clear()} entries from {store.root}")
    fallback = fallback_cache_dir()
    if fallback.is_dir():  # the folder used while the configured one was unusable
        click.echo(f"removed {clear_fallback_cache()} entries from {fallback}")
    clear_work_root()


@main.command(
    epilog="""\b
Examples:
  flashgen check --d 64 --bc 32
  flashgen check --family mma --d 128 --causal --tq 1000 --tk 77 --seed 3
"""
)
@spec_options
@click.option("--b", "b", type=click.IntRange(min=1), default=2, show_default=True, help="Batch.")
@click.option("--h", "h", type=click.IntRange(min=1), default=4, show_default=True, help="Heads.")
@click.option(
    "--tq", type=click.IntRange(min=1), default=257, show_default=True, help="Query length."
)
@click.option(
    "--tk", type=click.IntRange(min=1), default=300, show_default=True, help="Key/value length."
)
@click.option("--seed", type=int, default=0, show_default=True, help="Random inputs' seed.")
@click.option("--scale", type=float, default=None, help="Softmax scale (default: 1/sqrt(d)).")
@friendly
def check(b: int, h: int, tq: int, tk: int, seed: int, scale: float | None, **kw: Any) -> None:
    """Run one variant on one random problem on the GPU and compare it with the oracle.

    Prints the error of O and LSE against their bounds (fp16/bf16: max abs error vs twice the
    rounded reference's; fp32: relative error), then PASS, or FAIL with exit code 1.
    """
    spec = _spec(kw)
    env_arch()  # the kernel is compiled for FLASHGEN_ARCH when it is set
    from flashgen.verify import checks  # PyCUDA and the oracle load only when a GPU is used

    try:
        res = checks.check_variant(spec, b=b, h=h, tq=tq, tk=tk, seed=seed, scale=scale)
    except (checks.GpuUnavailable, ValueError) as exc:  # no GPU; a bad problem, seed or scale
        raise CliError(one_line(str(exc))) from exc
    click.echo(
        f"{res.spec.name}  b={res.b} h={res.h} tq={res.tq} tk={res.tk} "
        f"scale={res.scale:.6g} seed={res.seed}"
    )
    for label, err, bound in (("O", res.o_err, res.o_bound), ("LSE", res.lse_err, res.lse_bound)):
        verdict = "ok" if err <= bound else "TOO LARGE"
        click.echo(f"  {label:<4} error {err:.3e}   bound {bound:.3e}   {verdict}")
    click.echo(f"  NaN  {'FOUND' if res.has_nan else 'none'}")
    click.echo("PASS" if res.passed else "FAIL")
    if not res.passed:
        sys.exit(FAIL_EXIT)


@main.command(
    epilog="""\b
Examples:
  flashgen fuzz --family simt --examples 20
  flashgen fuzz --profile thorough
""",
)
@click.option(
    "--family",
    type=click.Choice(list(FAMILIES)),
    default=None,
    help="One family only (default: all).",
)
@click.option(
    "--examples",
    type=click.IntRange(min=1),
    default=None,
    help="Random problems per variant (default: the profile's count).",
)
@click.option(
    "--profile",
    type=click.Choice(["dev", "ci", "thorough"]),
    default="dev",
    show_default=True,
    envvar="FLASHGEN_HYPOTHESIS_PROFILE",
    help="Hypothesis profile (ci is derandomized); env FLASHGEN_HYPOTHESIS_PROFILE.",
)
@friendly
def fuzz(family: str | None, examples: int | None, profile: str) -> None:
    """Run the property suite on the GPU: every shipped variant against the oracle.

    Ends with one row per variant (examples run, worst error / bound, pass or fail); exit
    code 1 when any variant fails.
    """
    env_arch()  # the kernels are compiled for FLASHGEN_ARCH when it is set
    from flashgen.verify import checks  # PyCUDA and Hypothesis load only when a GPU is used
    from flashgen.verify.strategies import gpu_examples

    if examples is None:
        try:  # FLASHGEN_GPU_EXAMPLES, when set, is the count: a bad one is named, not a traceback
            gpu_examples(profile)
        except ValueError as exc:
            raise CliError(one_line(str(exc))) from None

    try:
        with _progress(len(shipped(family))) as progress:
            results = checks.run_fuzz(family, examples, profile, progress=progress)
    except checks.GpuUnavailable as exc:
        raise CliError(one_line(str(exc))) from exc
    rows = [
        [r.spec.name, r.examples, f"{r.worst_ratio:.3f}", "pass" if r.passed else "FAIL"]
        for r in results
    ]
    for line in format_table(["variant", "examples", "worst err/bound", "result"], rows):
        click.echo(line)
    failed = [r for r in results if not r.passed]
    for r in failed:
        click.echo(f"FAIL {r.spec.name}: {one_line(r.failure or 'no detail')}")
    click.echo(
        f"\n{len(results)} variants, {len(results) - len(failed)} passed, "
        f"{len(failed)} failed (profile {profile})"
    )
    if failed:
        sys.exit(FAIL_EXIT)


@contextmanager
def _progress(total: int) -> Iterator[Callable[[VariantResult], None]]:
    """A per-variant progress callback: a rich bar on a terminal, else one line per variant
    on stderr (CI logs keep them; stdout stays the final table)."""
    done = 0
    if not _stderr_is_terminal():

        def plain(r: VariantResult) -> None:
            nonlocal done
            done += 1
            verdict = "pass" if r.passed else "FAIL"
            click.echo(
                f"[{done}/{total}] {verdict} {r.spec.name} ({r.examples} examples, "
                f"worst err/bound {r.worst_ratio:.3f})",
                err=True,
            )

        yield plain
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    ) as bar:
        task = bar.add_task("compiling every variant, then checking", total=total)
        failures = 0

        def update(r: VariantResult) -> None:
            nonlocal done, failures
            done += 1
            failures += not r.passed
            note = f" [red]{failures} failed[/red]" if failures else ""
            bar.update(task, completed=done, description=f"{r.spec.name}{note}")

        yield update
