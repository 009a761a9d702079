"""Render a KernelSpec to CUDA source: pure (no GPU, no I/O beyond reading templates)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import jinja2

from flashgen._version import __version__
from flashgen.generator import abi
from flashgen.generator.backward import VARLEN_PAD_ALIGN
from flashgen.generator.features.hook import template_context as hook_context
from flashgen.generator.numerics import LOG2E
from flashgen.generator.spec import KernelSpec

TEMPLATE_PACKAGE = "flashgen"
TEMPLATE_DIR = "templates"


@dataclass(frozen=True)
class RenderedKernel:
    """A rendered kernel: its spec, its symbol and its source text."""

    spec: KernelSpec
    source: str

    @property
    def name(self) -> str:
        """The kernel's `extern "C"` symbol (also the file stem)."""
        return self.spec.name

    @property
    def filename(self) -> str:
        """The file name `flashgen build` writes."""
        return f"{self.spec.name}.cu"


@cache
def environment() -> jinja2.Environment:
    """The one strict Jinja environment: an undefined variable is an error, not an empty string."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader(TEMPLATE_PACKAGE, TEMPLATE_DIR),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def template_name(spec: KernelSpec) -> str:
    """The template that renders `spec`: its family's forward, backward or decode template."""
    if spec.direction == "bwd":
        return spec.fam.bwd_template
    if spec.direction == "decode":
        return spec.fam.decode_template
    return spec.fam.template


def context(spec: KernelSpec) -> dict[str, Any]:
    """Every value a template may use, derived here in Python (templates do no arithmetic)."""
    info = spec.dtype_info
    ctx: dict[str, Any] = {
        "name": spec.name,
        "family": spec.family,
        "template": template_name(spec),
        "version": __version__,
        "spec_json": spec.to_json(),
        "build_command": spec.build_command,
        "d": spec.d,
        "d_pad": spec.fam.d_pad(spec),
        "dv": spec.dv,
        "dv_pad": spec.fam.dv_pad(spec),
        "features": spec.features,
        "log2e": f"{LOG2E!r}f",
        "br": spec.br,
        "bc": spec.bc,
        "causal": spec.causal,
        "warps": spec.warps,
        "stages": spec.stages,
        "threads": spec.threads,
        "min_blocks": spec.fam.min_blocks(spec),
        "smem_bytes": spec.smem_bytes,
        "dtype": spec.dtype,
        "ctype": info.ctype,
        "header": info.header,
        "to_float": info.to_float,
        "from_float": info.from_float,
        "elem_bytes": info.itemsize,
        "is_bf16": spec.dtype == "bf16",
        "varlen": "varlen" in spec.features,  # packed sequences (abi.VARLEN)
        "varlen_pad_align": VARLEN_PAD_ALIGN,  # the varlen backward's scratch alignment (rows)
    }
    ctx["abi_params"] = abi_params(spec)
    ctx.update(hook_context(spec.features))  # hook_source, hook_score, hook_mask
    if spec.direction == "fwd":  # which work item each block takes: templates/_scheduler.cuh.j2
        ctx["scheduler_macro"] = spec.fam.scheduler(spec).macro
    ctx.update(spec.fam.context(spec))
    return ctx


def abi_params(spec: KernelSpec) -> list[dict[str, str]]:
    """The kernel's parameters as the template prints them (declaration and note), from the
    ABI table of its direction after its family's leading by-value arguments."""
    fam = spec.fam
    if spec.direction == "bwd":
        params = (*fam.bwd_prefix, *abi.backward(spec.features))
    elif spec.direction == "decode":
        params = abi.DECODE
    else:
        params = (*fam.fwd_prefix_of(spec), *abi.forward(spec.features))
    return [{"decl": p.declaration("elem_t"), "note": p.note} for p in params]


def render(spec: KernelSpec) -> RenderedKernel:
    """Render `spec` with its family's template; the same spec always gives the same bytes."""
    template = environment().get_template(template_name(spec))
    return RenderedKernel(spec=spec, source=template.render(**context(spec)))
