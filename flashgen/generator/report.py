"""Parse ptxas' `-v` resource report into numbers."""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass
from pathlib import Path


def _parser_version() -> str:
    try:
        return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
    except OSError:  # no source next to the module (a frozen install): fall back to the version
        from flashgen._version import __version__

        return f"v{__version__}"


# Part of every cache key: a cache entry stores the parsed report, so entries written by another
# parser (another `parse_ptxas` or `ResourceReport`) must not be served. A digest of this
# module's source, so it changes with any edit without anyone remembering to bump it.
PARSER_VERSION = _parser_version()


@dataclass(frozen=True)
class ResourceReport:
    """What ptxas reports for one kernel on one arch."""

    arch: str
    registers: int
    static_smem: int
    stack_frame: int
    spill_stores: int
    spill_loads: int

    @property
    def spill_bytes(self) -> int:
        """Spill stores plus spill loads (0 for every shipped variant)."""
        return self.spill_stores + self.spill_loads

    def to_dict(self) -> dict[str, int | str]:
        """Plain dict for JSON."""
        return asdict(self)


_FRAME = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(text: str, kernel: str, arch: str) -> ResourceReport:
    """Extract the report of `kernel` from ptxas `-v` output; ValueError when it is absent."""
    lines = text.splitlines()
    start = None
    for i, line in enumerate(lines):
        if f"Compiling entry function '{kernel}'" in line:
            start = i
    if start is None:
        raise ValueError(f"ptxas output has no report for kernel {kernel!r}:\n{text}")
    regs = smem = frame = st = ld = 0
    for line in lines[start + 1 :]:
        if "Compiling entry function" in line:
            break
        if m := _FRAME.search(line):
            frame, st, ld = (int(x) for x in m.groups())
        if m := _USED.search(line):
            regs = int(m.group(1))
            if s := _SMEM.search(line):
                smem = int(s.group(1))
    return ResourceReport(arch, regs, smem, frame, st, ld)
