"""flashgen: generate, compile, prove and benchmark specialized FlashAttention CUDA kernels.

The public API. `import flashgen` needs no GPU, driver, PyCUDA or torch: `flashgen.attention`
(which launches kernels through PyCUDA) is imported on first use. PyTorch users import
`flashgen.torch` (the custom op `torch.ops.flashgen.attention`, on torch's current stream).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flashgen._version import __version__
from flashgen.generator.compile import CompiledKernel, CompileError, compile_kernel
from flashgen.generator.render import RenderedKernel, render
from flashgen.generator.space import pruned, shipped
from flashgen.generator.spec import KernelSpec, SpecError
from flashgen.runtime.launch import GpuUnavailable

if TYPE_CHECKING:
    from flashgen.api import attention

__all__ = [
    "CompileError",
    "CompiledKernel",
    "GpuUnavailable",
    "KernelSpec",
    "RenderedKernel",
    "SpecError",
    "__version__",
    "attention",
    "compile_kernel",
    "pruned",
    "render",
    "shipped",
]

# Names served by `__getattr__`: importing them pulls in the runtime (PyCUDA), so only on use.
_LAZY = {"attention": ".api"}


def __getattr__(name: str) -> Any:
    """Import the runtime-backed parts of the API on first access."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names (tab completion shows the lazy ones too)."""
    return sorted(__all__)
