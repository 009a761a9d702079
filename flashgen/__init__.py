"""flashgen: generate, compile, prove and benchmark specialized FlashAttention CUDA kernels.

The public API. `import flashgen` needs no GPU, driver, PyCUDA or torch, and imports none of
its names until one is used: `flashgen.attention`, `flashgen.attention_varlen` and
`flashgen.attention_with_kvcache` (which launch kernels through PyCUDA) and the generator's
names are imported on first access. PyTorch users import `flashgen.torch` (the custom op
`torch.ops.flashgen.attention`, on torch's current stream).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flashgen._version import __version__

if TYPE_CHECKING:
    from flashgen.api import attention
    from flashgen.api_kvcache import attention_with_kvcache
    from flashgen.api_varlen import attention_varlen
    from flashgen.generator.compile import CompiledKernel, CompileError, compile_kernel
    from flashgen.generator.render import RenderedKernel, render
    from flashgen.generator.space import pruned, shipped
    from flashgen.generator.spec import KernelSpec, SpecError
    from flashgen.runtime.launch import GpuUnavailable

__all__ = [
    "CompileError",
    "CompiledKernel",
    "GpuUnavailable",
    "KernelSpec",
    "RenderedKernel",
    "SpecError",
    "__version__",
    "attention",
    "attention_varlen",
    "attention_with_kvcache",
    "compile_kernel",
    "pruned",
    "render",
    "shipped",
]

# Names served by `__getattr__`, each imported on first use: the generator pulls in NumPy,
# ml_dtypes and Jinja2 (about a second), `attention` the runtime (PyCUDA). So `import flashgen`
# (and `flashgen --help`) costs only what it uses.
_LAZY = {
    "attention": ".api",
    "attention_with_kvcache": ".api_kvcache",
    "attention_varlen": ".api_varlen",
    "CompiledKernel": ".generator.compile",
    "CompileError": ".generator.compile",
    "compile_kernel": ".generator.compile",
    "RenderedKernel": ".generator.render",
    "render": ".generator.render",
    "pruned": ".generator.space",
    "shipped": ".generator.space",
    "KernelSpec": ".generator.spec",
    "SpecError": ".generator.spec",
    "GpuUnavailable": ".runtime.launch",
}


def __getattr__(name: str) -> Any:
    """Import a public name (the generator's, the runtime's) on first access."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names (tab completion shows the lazy ones too)."""
    return sorted(__all__)
