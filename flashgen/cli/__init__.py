"""The command line (`flashgen`, `python -m flashgen`): click commands that parse, call the
layers below and print. `app` holds the group and the kernel commands (build, list, show,
inspect, check, bundle, cache, ...); `perf` the timing commands (bench, tune), registered on the
same group when this package is imported."""

from flashgen.cli import perf as _perf  # noqa: F401  (registers bench and tune on `main`)
from flashgen.cli.app import main

__all__ = ["main"]
