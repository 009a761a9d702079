"""The `flashgen` group and the rules every command shares, kept light: `flashgen --help` and
`flashgen --version` import click and nothing of the generator (no NumPy, ml_dtypes, Jinja2).

Each command lives in a module (`app`, `perf`) that is imported the first time the command is
looked up: run, or its own `--help` shown. `COMMANDS` names that module and the summary
`flashgen --help` prints for the command, so listing the commands imports none of them
(tests/cli checks that each summary is the first paragraph of its command's help).

Every command and group here refuses a repeated option (click would keep the last value) and
names the environment variable behind a bad value that came from one.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click
from click.core import ParameterSource

from flashgen._version import __version__

USAGE_EXIT = 2  # bad input of any kind (click's own usage errors use 2 as well)
INTERRUPTED_EXIT = 130  # Ctrl-C, as shells report SIGINT (128 + 2)

# name: (the module that defines the command, the summary `flashgen --help` shows for it)
COMMANDS: dict[str, tuple[str, str]] = {
    "bench": (
        "flashgen.cli.perf",
        "Time flashgen against torch SDPA (FA2, cuDNN, efficient) on this GPU, forward and "
        "backward; write JSON.",
    ),
    "build": ("flashgen.cli.app", "Write OUT/<name>.cu for a spec and compile it with nvcc."),
    "bundle": (
        "flashgen.cli.app",
        "Write a self-contained CMake bundle to DIR: kernels, C-ABI launchers, header, example.",
    ),
    "cache": (
        "flashgen.cli.app",
        "The compiled-cubin cache (FLASHGEN_CACHE_DIR, default ~/.cache/flashgen).",
    ),
    "check": (
        "flashgen.cli.app",
        "Run one variant on one random problem on the GPU and compare it with the oracle.",
    ),
    "fuzz": (
        "flashgen.cli.app",
        "Run the property suite on the GPU: every shipped variant against the oracle.",
    ),
    "inspect": (
        "flashgen.cli.app",
        "Compile a kernel and explain it: registers, shared memory, spills, occupancy, the SASS "
        "instruction mix (when cuobjdump is available) and the HBM traffic model against the "
        "seed's loop order.",
    ),
    "list": (
        "flashgen.cli.app",
        "Print the shipped variants as a table (forward, or backward with --direction bwd); "
        "--all adds every pruned point and its reasons.",
    ),
    "show": (
        "flashgen.cli.app",
        "Print a kernel's generated CUDA source (highlighted on a terminal, plain when piped).",
    ),
    "tune": (
        "flashgen.cli.perf",
        "Time every shipped tensor-core variant (mma; wgmma on Hopper) per (d, dtype, causal) "
        "and record the fastest.",
    ),
}


def one_line(text: str) -> str:
    """Collapse a message to one line (nvcc's log, click's wrapped help) for `error: ...`."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def _error_message(exc: click.ClickException) -> str:
    msg = one_line(exc.format_message())
    if isinstance(exc, click.UsageError) and exc.ctx is not None:
        msg += f" (see: {exc.ctx.command_path} --help)"
    return msg


# ---- the rules of every command: an option once; a bad value from the environment named ------
def _names(param: click.Parameter) -> str:
    """`--causal/--no-causal`, `--d`: how the help spells an option."""
    return "/".join([*param.opts, *getattr(param, "secondary_opts", [])])


def _spellings(param: click.Parameter, args: Sequence[str]) -> list[str]:
    """Where `args` gives `param`: `--d 64`, `--no-causal`, `--out=x` (up to a `--`)."""
    names = [*param.opts, *getattr(param, "secondary_opts", [])]
    takes_value = not getattr(param, "is_flag", False) and param.nargs > 0
    out = []
    for i, token in enumerate(args):
        if token == "--":
            break
        if token in names:
            value = args[i + 1] if takes_value and i + 1 < len(args) else None
            out.append(token if value is None else f"{token} {value}")
        elif any(n.startswith("--") and token.startswith(f"{n}=") for n in names):
            out.append(token)
    return out


def refuse_repeats(command: click.Command, ctx: click.Context, args: Sequence[str]) -> None:
    """UsageError when `args` gives an option of `command` twice that is not meant to repeat
    (`multiple=True`, as `bundle --d 64 --d 128`): click would silently keep the last one."""
    _, _, order = command.make_parser(ctx).parse_args(args=list(args))
    seen = Counter(id(p) for p in order)
    for param in command.get_params(ctx):
        if not isinstance(param, click.Option) or param.multiple or param.count:
            continue
        n = seen[id(param)]
        if n > 1:
            shown = ", ".join(_spellings(param, args))
            raise click.UsageError(
                f"{_names(param)} given {n} times ({shown}); give it once", ctx=ctx
            )


def _env_source(ctx: click.Context, param: click.Parameter | None) -> str | None:
    """The environment variable that gave `param` its value in `ctx`, if one did."""
    if not isinstance(param, click.Option) or not param.name:
        return None
    if ctx.get_parameter_source(param.name) is not ParameterSource.ENVIRONMENT:
        return None
    candidates = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or ())
    if not candidates and ctx.auto_envvar_prefix is not None:
        candidates = [f"{ctx.auto_envvar_prefix}_{param.name.upper()}"]
    return next((var for var in candidates if os.environ.get(var)), None)


class StrictCommand(click.Command):
    """A command that refuses repeated options and blames an environment variable for its
    bad values (not the option the user never typed)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Parse as click does, then refuse an option given twice."""
        given = list(args)  # click's parser consumes the list it is given
        try:
            rest = super().parse_args(ctx, args)
        except click.BadParameter as exc:
            var = _env_source(ctx, exc.param)
            if var is None:
                raise
            option = exc.param.opts[0] if exc.param is not None else "the option"
            reason = one_line(exc.message).rstrip(".")  # without click's "for '--option'"
            raise click.UsageError(
                f"{var}={os.environ[var]}: {reason}; fix or unset {var} (or pass {option})",
                ctx=ctx,
            ) from None
        if not ctx.resilient_parsing:
            refuse_repeats(self, ctx, given)
        return rest


class StrictGroup(StrictCommand, click.Group):
    """A group (`flashgen cache`) whose commands and subgroups follow the same rules."""

    command_class = StrictCommand
    group_class: type[click.Group] | type[type] | None = type  # subgroups: this group's class


class FlashgenGroup(StrictGroup):
    """The `flashgen` group: every error, click's usage errors included, is one stderr line;
    a command's module is imported when that command is looked up."""

    group_class = StrictGroup

    # `commands` is every command, all modules imported: what code that walks the CLI (tests,
    # docs) expects. Click's own lookups use `_commands` through the methods below.
    @property  # type: ignore[override]
    def commands(self) -> dict[str, click.Command]:
        """Every command, each module imported."""
        for name in COMMANDS:
            self._load(name)
        return self._commands

    @commands.setter
    def commands(self, value: dict[str, click.Command]) -> None:
        self._commands = dict(value)

    def _load(self, name: str) -> None:
        if name not in self._commands and name in COMMANDS:
            importlib.import_module(COMMANDS[name][0])  # registers it on this group

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        """Register a command (its module's decorators call this on import)."""
        name = name or cmd.name
        if name is None:
            raise TypeError("Command has no name.")
        self._commands[name] = cmd

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command `cmd_name`, its module imported on first use."""
        self._load(cmd_name)
        return self._commands.get(cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command's name, none imported."""
        return sorted({*COMMANDS, *self._commands})

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The `Commands:` section from `COMMANDS` (as click words it), importing nothing."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = []
        for name in names:
            cmd = self._commands.get(name)
            if cmd is None:
                summary = click.Command(name, help=COMMANDS[name][1])  # worded as click does
                rows.append((name, summary.get_short_help_str(limit)))
            elif not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command line's command: flashgen's warnings as one line each, and SIGTERM /
        SIGHUP (`timeout`, a closed terminal) stopping nvcc like Ctrl-C does."""
        from flashgen.generator.compile import stop_nvcc_on_signals  # only when a command runs

        with one_line_warnings(), stop_nvcc_on_signals():
            return super().invoke(ctx)

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """Run the CLI; in standalone mode, print errors as `error: ...` and exit."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.ClickException as exc:
            if isinstance(exc, _NO_ARGS_IS_HELP):  # bare `flashgen`: the help text, not one line
                exc.show()
                sys.exit(exc.exit_code)
            click.echo(f"error: {_error_message(exc)}", err=True)
            sys.exit(exc.exit_code)
        except (click.Abort, KeyboardInterrupt) as exc:
            # click turns Ctrl-C into Abort (its cause); exit like an interrupted program
            if isinstance(exc, KeyboardInterrupt) or isinstance(exc.__cause__, KeyboardInterrupt):
                click.echo("interrupted", err=True)
                sys.exit(INTERRUPTED_EXIT)
            click.echo("aborted", err=True)
            sys.exit(1)
        # without standalone mode click returns the exit code of ctx.exit() / --help / --version
        sys.exit(rv if isinstance(rv, int) else 0)


# click >= 8.2 raises this for a bare group invocation; its message is the whole help text.
_NO_ARGS_IS_HELP: tuple[type[click.ClickException], ...] = tuple(
    t for t in (getattr(click.exceptions, "NoArgsIsHelpError", None),) if t is not None
)


@contextmanager
def one_line_warnings() -> Iterator[None]:
    """Show flashgen's own warnings as `warning: <message>` lines on stderr (each once)."""
    from flashgen.generator.cache import FlashgenWarning

    with warnings.catch_warnings():
        warnings.simplefilter("default", FlashgenWarning)
        original = warnings.showwarning

        def show(message: Warning | str, category: type[Warning], *args: Any, **kw: Any) -> None:
            if issubclass(category, FlashgenWarning):
                click.echo(f"warning: {one_line(str(message))}", err=True)
            else:
                original(message, category, *args, **kw)

        warnings.showwarning = show
        yield


@click.group(
    cls=FlashgenGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  flashgen build --d 64 --bc 32          write generated/<name>.cu and compile it
  flashgen show --d 64 --dtype bf16      print the generated source
  flashgen list --all                    the shipped variants, and why others are not
  flashgen inspect --family mma --d 128  registers, shared memory, occupancy, SASS, traffic
  flashgen bundle attn/ --d 64 --d 128   a CMake folder with a C ABI for C/C++/CUDA projects
""",
)
@click.version_option(__version__, "-V", "--version", prog_name="flashgen")
def main() -> None:
    """flashgen: generate, compile and check specialized FlashAttention CUDA kernels.

    A kernel is named by its spec: --family, --d, --br, --bc, --dtype, --causal (or --name).
    """
