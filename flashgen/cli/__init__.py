"""The command line (`flashgen`, `python -m flashgen`): click commands that parse, call the
layers below and print. `group` holds the `flashgen` group, light enough that `flashgen --help`
imports nothing heavy; `app` the kernel commands (build, list, show, inspect, check, bundle,
cache, ...) and `perf` the timing commands (bench, tune), each module imported the first time
one of its commands is looked up."""

from flashgen.cli.group import main

__all__ = ["main"]
