"""A fake nvcc for tests that need nvcc's behaviour, not its output: fast, hanging or slow.

`fake_nvcc(folder)` writes an executable script that answers `--version` with the given
version, and otherwise (after `sleep` seconds; with a `pids` file, it first writes its pid and
that of a child it starts, so a test can see both die) writes a small "cubin" naming the
kernels of the source to the `-o` file and prints a ptxas `-v` report for each: 40 registers,
no spills. Runs on any machine: no CUDA needed.
"""

from __future__ import annotations

import sys
from pathlib import Path

VERSION = "Cuda compilation tools, release 13.0, V13.0.88 (fake)"
REGISTERS = 40

_SCRIPT = """\
#!{python}
import os, re, subprocess, sys, time
args = sys.argv[1:]
if args == ["--version"]:
    print({version!r})
    sys.exit(0)
if {pids!r}:
    child = subprocess.Popen(["sleep", "300"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open({pids!r} + ".part", "w") as f:
        f.write(f"{{os.getpid()}} {{child.pid}}")
    os.replace({pids!r} + ".part", {pids!r})
time.sleep({sleep!r})
out = args[args.index("-o") + 1]
with open(args[-1]) as f:
    names = re.findall(r"__launch_bounds__\\([^)]*\\)\\s+(\\w+)\\(", f.read())
with open(out, "wb") as f:
    f.write(b"\\x7fELF fake cubin " + " ".join(names).encode())
for n in names:
    print(f"ptxas info    : Compiling entry function '{{n}}' for 'sm_90'", file=sys.stderr)
    print("ptxas info    : Function properties for " + n, file=sys.stderr)
    print("    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads", file=sys.stderr)
    print("ptxas info    : Used {registers} registers, 0 bytes smem", file=sys.stderr)
"""


def fake_nvcc(
    folder: Path,
    *,
    name: str = "nvcc",
    version: str = VERSION,
    sleep: float = 0.0,
    pids: Path | None = None,
) -> Path:
    """Write the fake nvcc as `folder/name` and return its path (see the module docstring)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(
        _SCRIPT.format(
            python=sys.executable,
            version=version,
            sleep=sleep,
            pids=str(pids) if pids else "",
            registers=REGISTERS,
        )
    )
    path.chmod(0o755)
    return path
