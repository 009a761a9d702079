"""The launcher binds a hooked variant's aux block (on a fake driver: no GPU)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from flashgen.generator import abi
from flashgen.generator.features import hook as fh
from flashgen.generator.hooks import library
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import launch, validate

MMA = KernelSpec(family="mma", d=64, dtype="fp16", causal=True)


@pytest.fixture
def fake_gpu(monkeypatch):
    from _fakecuda import install_libcuda, install_pycuda

    install_pycuda(monkeypatch, cc=(8, 0))
    return install_libcuda(monkeypatch)


def _plan(spec: KernelSpec) -> launch.LaunchPlan:
    return launch.LaunchPlan(spec, "sm_80", 0, 1, 2, 3, (spec.threads, 1, 1), 0)


_QKV = [np.zeros((1, 4, 8, 64), np.float16) for _ in range(4)]
PROBLEM = validate.check_layout(*_QKV[:3], o=_QKV[3], lse=np.zeros((1, 4, 8), np.float32))


def test_a_hooked_variant_takes_the_aux_block_after_the_features(fake_gpu):
    alibi, doc = library.alibi_hook(), library.document_hook()
    spec = MMA.replace(features=(fh.token_of(alibi), fh.token_of(doc)))
    hooks = fh.HookArgs((alibi, doc), {"alibi_slopes": 0x7000, "doc_ids": 0x8000})
    bound = _plan(spec).bind(PROBLEM, 1.0, hooks=hooks)
    assert len(bound.params) == len(abi.forward(spec.features)) == len(abi.FWD) + 16
    tail = [int(bound.params[i]) for i in range(len(abi.FWD), len(abi.FWD) + 2)]
    assert [ctypes.c_void_p.from_address(a).value for a in tail] == [0x7000, 0x8000]
    assert _block(bound) == hooks.kernel_args()


def test_hook_values_must_match_the_variants_hooks(fake_gpu):
    alibi = library.alibi_hook()
    spec = MMA.replace(features=(fh.token_of(alibi),))
    with pytest.raises(ValueError, match="missing alibi_slopes"):
        _plan(spec).bind(PROBLEM, 1.0)
    other = fh.HookArgs((library.softcap_hook(),), {"softcap": 1.0})
    with pytest.raises(ValueError, match="the hook values are for"):
        _plan(spec).bind(PROBLEM, 1.0, hooks=other)
    with pytest.raises(ValueError, match="the variant has no hook"):
        _plan(MMA).bind(PROBLEM, 1.0, hooks=other)
    causal = library.causal_hook()  # no aux: no values needed
    plain = _plan(MMA.replace(features=(fh.token_of(causal),))).bind(PROBLEM, 1.0)
    assert _block(plain) == (0,) * 8 + (0.0,) * 4 + (0,) * 4


def _block(bound: launch.Bound) -> tuple[int | float, ...]:
    """The bound aux block (a NULL pointer reads back as None from ctypes: 0 here)."""
    return tuple(0 if a is None else a for a in bound.scalar_args()[-16:])
