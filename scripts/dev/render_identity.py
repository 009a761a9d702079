"""Render every shipped variant (and the backward's feature probes) and print one line each:
the kernel name, a sha256 of its source and of its ABI (declarations and struct codes).

Run it in two trees and diff the outputs: a change that must leave unhooked kernels alone
(their source and C ABI) shows as no difference at all.

    PYTHONPATH=/path/to/base python scripts/dev/render_identity.py > base.txt
    PYTHONPATH=/path/to/new  python scripts/dev/render_identity.py > new.txt
    diff base.txt new.txt && echo identical

CPU only (rendering needs no nvcc). The probes beyond the shipped space are the backward
feature sets the GPU tests compile (tests/gpu/test_backward.py), at d 40/64/128, both dtypes,
causal and not, fast and deterministic; the decode kernels; wgmma forwards with every
feature set (varlen too) at br 64/128 and stages 2/3; and wgmma backwards with every feature
set (varlen too) at bc 64/128 and stages 2/3.
"""

from __future__ import annotations

import hashlib
import itertools
import sys

from flashgen.generator import render as rd
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec, SpecError

BWD_FEATURE_SETS = [
    (), ("window",), ("softcap",), ("alibi",), ("window", "softcap"),
    ("window", "softcap", "alibi"), ("deterministic",), ("window", "deterministic"),
    ("softcap", "deterministic"), ("alibi", "deterministic"),
]  # fmt: skip


def probes() -> list[KernelSpec]:
    """The mma backward's feature probes (those the spec accepts)."""
    out = []
    for feats, d, dtype, causal in itertools.product(
        BWD_FEATURE_SETS, (40, 64, 128), ("fp16", "bf16"), (False, True)
    ):
        try:
            out.append(
                KernelSpec(
                    family="mma", direction="bwd", d=d, dtype=dtype, causal=causal,
                    features=feats,
                )  # fmt: skip
            )
        except SpecError:
            continue
    return out


def decode_variants() -> list[KernelSpec]:
    """Family mma's decode kernels: d 64/128/256, both dtypes, causal and not, each feature."""
    out = []
    for d, dtype, causal, feats in itertools.product(
        (64, 128, 256), ("fp16", "bf16"), (False, True),
        ((), ("window",), ("softcap",), ("alibi",), ("window", "softcap")),
    ):  # fmt: skip
        try:
            out.append(
                KernelSpec(
                    family="mma", direction="decode", d=d, dtype=dtype, causal=causal,
                    features=feats,
                )  # fmt: skip
            )
        except SpecError:
            continue
    return out


def wgmma_probes() -> list[KernelSpec]:
    """wgmma forwards beyond the shipped space: varlen, every feature set, br 64, stages 3."""
    out = []
    feature_sets = [
        (), ("window",), ("softcap",), ("alibi",), ("window", "softcap"),
        ("window", "softcap", "alibi"), ("varlen",), ("varlen", "window", "softcap"),
    ]  # fmt: skip
    for d, br, dtype, causal, feats, stages in itertools.product(
        (64, 96, 128), (64, 128), ("fp16", "bf16"), (False, True), feature_sets, (2, 3)
    ):
        try:
            out.append(
                KernelSpec(
                    family="wgmma", d=d, br=br, dtype=dtype, causal=causal, features=feats,
                    stages=stages,
                )  # fmt: skip
            )
        except SpecError:
            continue
    return out


def wgmma_bwd_probes() -> list[KernelSpec]:
    """wgmma backwards beyond the shipped space: every feature set (varlen too), bc 64 and
    128, stages 2 and 3 (the hooked backward's code is Jinja-guarded around all of them)."""
    out = []
    feature_sets = [
        (), ("window",), ("softcap",), ("alibi",), ("window", "softcap"),
        ("window", "softcap", "alibi"), ("varlen",), ("varlen", "window", "softcap"),
        ("varlen", "alibi"),
    ]  # fmt: skip
    for d, bc, dtype, causal, feats, stages in itertools.product(
        (64, 128), (64, 128), ("fp16", "bf16"), (False, True), feature_sets, (2, 3)
    ):
        try:
            out.append(
                KernelSpec(
                    family="wgmma", direction="bwd", d=d, br=64, bc=bc, dtype=dtype,
                    causal=causal, features=feats, stages=stages, warps=0,
                )  # fmt: skip
            )
        except SpecError:
            continue
    return out


def line(spec: KernelSpec) -> str:
    src = rd.render(spec).source
    abi = repr(rd.abi_params(spec))
    h = hashlib.sha256(src.encode()).hexdigest()[:16]
    a = hashlib.sha256(abi.encode()).hexdigest()[:16]
    return f"{spec.name} src={h} abi={a}"


def main() -> int:
    specs = shipped() + shipped(direction="bwd") + probes() + decode_variants() + wgmma_probes()
    specs += wgmma_bwd_probes()
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            continue
        seen.add(spec.name)
        print(line(spec))
    print(f"# {len(seen)} variants", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
