"""The wgmma backward at head dims that are not a multiple of 64 (CPU): its rule, the padded math
(d_pad = d rounded up to 64, as the forward's), its scratch, its routing and what bundles say.
The GPU proof is tests/gpu/test_backward.py's WGMMA_PROBES and feature probes at d 40-96,
test_torch_backward's d 72/96 rows and test_varlen's d 72/96 gradient cases."""

from __future__ import annotations

import pytest

from flashgen.bundle.emit import BundleError, bundle_files
from flashgen.generator import backward as bwd_shape
from flashgen.generator.families.wgmma import bwd as wgmma_bwd
from flashgen.generator.render import render
from flashgen.generator.select import backward_family
from flashgen.generator.spec import KernelSpec


def _bwd(d: int, **kw: object) -> KernelSpec:
    return KernelSpec(family="wgmma", d=d, direction="bwd", dtype="bf16", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("d", [8, 40, 72, 80, 96, 104, 120, 128])
def test_multiples_of_8_up_to_128_run_at_d_pad(d: int) -> None:
    spec = _bwd(d)
    assert wgmma_bwd.takes_head_dim(d) and wgmma_bwd.d_pad(spec) == -(-d // 64) * 64
    padded = _bwd(wgmma_bwd.d_pad(spec), br=spec.br)  # (d 64 alone defaults to br 128)
    # the same registers and shared memory as the padded head dim
    assert wgmma_bwd.smem_bytes(spec) == wgmma_bwd.smem_bytes(padded)
    assert wgmma_bwd.register_estimate(spec) == wgmma_bwd.register_estimate(padded)
    src = render(spec).source
    assert f"constexpr int DP = {wgmma_bwd.d_pad(spec)};" in src
    assert "constexpr int QK_STEPS = (D + 15) / 16;" in src  # S^T, dP^T over real columns


@pytest.mark.parametrize("d", [4, 100, 136, 256])
def test_other_head_dims_are_refused_and_routed_to_mma(d: int) -> None:
    assert not wgmma_bwd.takes_head_dim(d)
    # family mma's (flashgen.torch refuses d > 128 before it asks: BWD_MAX_D)
    assert backward_family("sm_90a", d, d, "bf16") == "mma"


def test_sm90_routes_d96_and_d72_to_wgmma() -> None:
    assert backward_family("sm_90a", 96, 96, "bf16") == "wgmma"
    assert backward_family("sm_90a", 72, 72, "fp16") == "wgmma"
    assert backward_family("sm_80", 96, 96, "bf16") == "mma"


def test_the_accumulator_is_d_pad_wide() -> None:
    d_buf, accum = bwd_shape.scratch_shapes(_bwd(96), 2, 3, 100, 96)
    assert d_buf == (2, 3, 2, 128) and accum == (2, 3, 128, 128)
    assert bwd_shape.scratch_shapes(_bwd(128), 2, 3, 100, 128)[1] == (2, 3, 128, 128)
    mma = KernelSpec(family="mma", d=96, direction="bwd")
    assert bwd_shape.scratch_shapes(mma, 2, 3, 100, 96)[1] == (2, 3, 100, 96)


def test_bundles_refuse_a_padded_wgmma_backward() -> None:
    with pytest.raises(BundleError, match=r"d=96 \(not a multiple of 64\) are not bundled yet"):
        bundle_files([_bwd(96)])
