"""SASS instruction mix: what a compiled kernel really executes, read from `cuobjdump -sass`.

`instruction_mix(text)` is pure (it parses cuobjdump's text); `find_cuobjdump()` and
`disassemble(cubin)` find and run the tool. cuobjdump ships with the CUDA toolkit or as the
PyPI wheels `nvidia-cuda-cuobjdump` + `nvidia-cuda-nvdisasm` (cuobjdump calls nvdisasm for
sm_90 and newer, so both must be installed).

The counts are static: each instruction in the binary counts once, so a loop body counts once
however many times it runs. They answer "which units does this kernel use", not "how often".
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

INSTALL_HINT = "pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm"
TIMEOUT_S = 120

# The instruction classes the report names, in print order, each with what it is for.
GROUPS: dict[str, str] = {
    "HMMA": "tensor-core matrix multiply-accumulate (mma.sync)",
    "HGMMA": "Hopper warpgroup tensor-core MMA (wgmma)",
    "FFMA": "fp32 fused multiply-add on CUDA cores",
    "FMUL": "fp32 multiply",
    "FADD": "fp32 add",
    "FMNMX": "fp32 min/max (softmax row max)",
    "MUFU.EX2": "exp2 on the special-function unit",
    "MUFU": "other special functions (rcp, log2, ...)",
    "LDSM": "ldmatrix: shared memory -> tensor-core fragments",
    "LDGSTS": "cp.async: global -> shared, bypassing registers",
    "LDG": "global load",
    "STG": "global store",
    "LDS": "shared-memory load",
    "STS": "shared-memory store",
    "BAR": "block barrier (__syncthreads)",
    "SHFL": "warp shuffle",
}
TENSOR_CORE = ("HMMA", "HGMMA")

# `/*0a30*/   @!P0 HMMA.16816.F32.BF16 R12, R4, R8, RZ ;` -> predicate and opcode.
_INSTR = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:(@!?U?P[A-Z0-9]+)\s+)?([A-Z][A-Z0-9_.]*)")
_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
_TARGET = re.compile(r"^\s*code for (sm_\w+)")


class SassUnavailable(RuntimeError):
    """No usable cuobjdump (or nvdisasm); the message says why and how to get it."""


@dataclass(frozen=True)
class InstructionMix:
    """Static SASS instruction counts of one disassembly."""

    functions: tuple[str, ...]
    archs: tuple[str, ...]
    total: int  # instructions that can execute (never-executed `@!PT` padding excluded)
    groups: dict[str, int]  # GROUPS key -> count (every key present)
    by_opcode: dict[str, int] = field(default_factory=dict)  # base opcode -> count

    @property
    def tensor_core(self) -> bool:
        """True when the kernel issues tensor-core MMA instructions."""
        return any(self.groups[g] for g in TENSOR_CORE)

    @property
    def verdict(self) -> str:
        """One plain sentence: does the math run on tensor cores?"""
        if self.tensor_core:
            used = ", ".join(f"{self.groups[g]} {g}" for g in TENSOR_CORE if self.groups[g])
            return f"tensor-core math: yes ({used})"
        return f"tensor-core math: no: CUDA-core FFMA ({self.groups['FFMA']} FFMA)"

    def to_dict(self) -> dict[str, object]:
        """Plain dict for JSON."""
        return {
            "functions": list(self.functions),
            "archs": list(self.archs),
            "total": self.total,
            "groups": dict(self.groups),
            "by_opcode": dict(self.by_opcode),
            "tensor_core": self.tensor_core,
            "verdict": self.verdict,
        }


def group_of(opcode: str) -> str | None:
    """The GROUPS key a full opcode (`MUFU.EX2`, `LDG.E.128`, `BAR.SYNC`) counts under."""
    base = opcode.split(".", 1)[0]
    if base == "MUFU":
        return "MUFU.EX2" if opcode.startswith("MUFU.EX2") else "MUFU"
    return base if base in GROUPS else None


def instruction_mix(text: str) -> InstructionMix:
    """Count the instructions of `cuobjdump -sass` output; ValueError when it holds none."""
    functions: list[str] = []
    archs: list[str] = []
    groups = dict.fromkeys(GROUPS, 0)
    by_opcode: Counter[str] = Counter()
    total = 0
    for line in text.splitlines():
        if m := _FUNCTION.match(line):
            functions.append(m.group(1))
            continue
        if m := _TARGET.match(line):
            if m.group(1) not in archs:
                archs.append(m.group(1))
            continue
        m = _INSTR.match(line)
        if m is None:
            continue
        predicate, opcode = m.groups()
        if predicate == "@!PT":  # predicated on never-true: alignment padding, never executed
            continue
        total += 1
        by_opcode[opcode.split(".", 1)[0]] += 1
        group = group_of(opcode)
        if group is not None:
            groups[group] += 1
    if total == 0:
        raise ValueError(
            "no SASS instructions in cuobjdump's output; pass the text of `cuobjdump -sass "
            "<cubin>` for a cubin that holds code"
        )
    return InstructionMix(
        functions=tuple(functions),
        archs=tuple(archs),
        total=total,
        groups=groups,
        by_opcode=dict(sorted(by_opcode.items(), key=lambda kv: (-kv[1], kv[0]))),
    )


def _tool_candidates(tool: str) -> list[Path]:
    candidates: list[Path] = []
    on_path = shutil.which(tool)
    if on_path:
        candidates.append(Path(on_path))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "bin" / tool)
    candidates.append(Path("/usr/local/cuda/bin") / tool)
    # the PyPI wheels: 13.x installs into nvidia/cu13/bin, 12.x into nvidia/cuda_<tool>/bin
    for entry in sys.path:
        base = Path(entry) / "nvidia"
        candidates += [base / "cu13" / "bin" / tool, base / f"cuda_{tool}" / "bin" / tool]
    return candidates


def _find(tool: str, env_var: str) -> Path:
    explicit = os.environ.get(env_var)
    if explicit:
        if Path(explicit).is_file():
            return Path(explicit)
        raise SassUnavailable(f"{env_var}={explicit}: no such file; point it at a {tool} binary")
    for c in _tool_candidates(tool):
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise SassUnavailable(
        f"{tool} not found (looked at {env_var}, PATH, CUDA_HOME, CUDA_PATH, /usr/local/cuda "
        f"and the nvidia-cuda-{tool} wheel); install the CUDA toolkit or run `{INSTALL_HINT}`"
    )


def find_cuobjdump() -> Path:
    """cuobjdump from FLASHGEN_CUOBJDUMP, PATH, CUDA_HOME/CUDA_PATH, /usr/local/cuda or the
    wheel; raise SassUnavailable with the install command otherwise."""
    return _find("cuobjdump", "FLASHGEN_CUOBJDUMP")


def disassemble(cubin: bytes) -> str:
    """`cuobjdump -sass` of a cubin; SassUnavailable when the tool is missing or fails."""
    tool = find_cuobjdump()
    # cuobjdump runs nvdisasm from PATH: put the one next to it (or any found) in front
    dirs = [str(tool.parent)]
    if not (tool.parent / "nvdisasm").is_file():
        # without one, cuobjdump may still manage (older archs); its own error says otherwise
        with contextlib.suppress(SassUnavailable):
            dirs.append(str(_find("nvdisasm", "FLASHGEN_NVDISASM").parent))
    env = dict(os.environ, PATH=os.pathsep.join([*dirs, os.environ.get("PATH", "")]))
    with tempfile.TemporaryDirectory(prefix="flashgen-sass-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        try:
            proc = subprocess.run(
                [str(tool), "-sass", str(path)],
                capture_output=True,
                text=True,
                env=env,
                check=False,
                timeout=TIMEOUT_S,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SassUnavailable(f"{tool} could not run: {exc}") from exc
    if proc.returncode != 0:
        err = " ".join(proc.stderr.split())[:300] or f"exit {proc.returncode}"
        hint = "; it needs nvdisasm next to it or on PATH" if "nvdisasm" in err else ""
        raise SassUnavailable(f"{tool} -sass failed: {err}{hint}; try `{INSTALL_HINT}`")
    return proc.stdout


def format_mix(mix: InstructionMix) -> list[str]:
    """The human-readable lines of an instruction mix (inspect's SASS section)."""
    lines = [
        f"  SASS           {mix.total} instructions in the binary ({', '.join(mix.archs)}; "
        "static counts: a loop body counts once)",
        f"    {mix.verdict}",
    ]
    width = max(len(g) for g in GROUPS)
    for group, what in GROUPS.items():
        lines.append(f"    {group:<{width}} {mix.groups[group]:>5}  {what}")
    return lines
