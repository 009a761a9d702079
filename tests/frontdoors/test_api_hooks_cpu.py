"""`flashgen.attention(..., score_mod=, mask_mod=, aux=)`: the NumPy / GPUArray front door's
hooks, validated before the GPU is needed, then (on a fake A100) the hooked variant selected
once per signature and each call's aux arrays (and the document table's range summary) passed
as that call's pointers."""

from __future__ import annotations

import numpy as np
import pytest

import flashgen
from flashgen.generator.features.hook import MAX_POINTERS, token_of
from flashgen.generator.hooks import library
from flashgen.generator.hooks.summary import summarize
from flashgen.generator.spec import KernelSpec
from flashgen.runtime.gpu import GpuUnavailable

DOC = library.document_hook()


def qkv(t=96, d=64, dtype=np.float16):
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal((2, 3, t, d)).astype(dtype) for _ in range(3))


def ids(t=96, docs=3):
    return np.repeat(np.arange(docs, dtype=np.int32), -(-t // docs))[:t]


def test_valid_hooked_numpy_inputs_reach_gpu_unavailable(no_pycuda):
    with pytest.raises(GpuUnavailable):
        flashgen.attention(*qkv(), mask_mod=DOC, aux={"doc_ids": ids()})
    with pytest.raises(GpuUnavailable):  # a function without aux is traced
        flashgen.attention(*qkv(), mask_mod=lambda b, h, q_idx, kv_idx: kv_idx <= q_idx)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"mask_mod": DOC}, r"aux=\[\]: the hooks read \['doc_ids'\]; missing doc_ids"),
        ({"aux": {"doc_ids": ids()}}, r"the hooks read no aux values; unknown doc_ids"),
        (
            {"mask_mod": DOC, "aux": {"doc_ids": ids().astype(np.int64)}},
            r"aux doc_ids: int64 with 1 dimensions; the hook declares int32 with 1",
        ),
        ({"mask_mod": DOC, "aux": {"doc_ids": [0, 1]}}, r"aux doc_ids: a list; with NumPy q"),
        (
            {"mask_mod": DOC, "aux": {"doc_ids": np.zeros(0, np.int32)}},
            r"aux doc_ids: an empty table",
        ),
        (
            {"score_mod": library.softcap_hook(), "aux": {"softcap": "20"}},
            r"aux softcap='20': a float32 scalar; pass a Python number",
        ),
        ({"mask_mod": 3}, r"mask_mod=3: must be a traced hook"),
        ({"score_mod": DOC, "aux": {"doc_ids": ids()}}, r"the hook given is a mask_mod"),
        (
            {"mask_mod": DOC, "aux": {"doc_ids": ids()},
             "spec": KernelSpec(family="mma", d=64, dtype="fp16")},
            r"spec and score_mod/mask_mod: a hooked call picks its own variant",
        ),
    ],
)  # fmt: skip
def test_bad_hooks_and_aux_values_are_named_before_the_gpu(no_pycuda, kw, message):
    with pytest.raises(ValueError, match=message):
        flashgen.attention(*qkv(), **kw)


# ---- on a fake A100 (family mma: no tensor maps to encode) -----------------------------------
@pytest.fixture
def fake_gpu(monkeypatch):
    from _fakecuda import install_libcuda, install_pycuda

    from flashgen import api

    calls = install_pycuda(monkeypatch, cc=(8, 0))
    cuda = install_libcuda(monkeypatch)
    monkeypatch.setattr(api, "_entries", {})
    chosen: list[KernelSpec] = []
    real = api.hook_spec.forward_spec

    def counting(*args, **kw):
        chosen.append(real(*args, **kw))
        return chosen[-1]

    monkeypatch.setattr(api.hook_spec, "forward_spec", counting)
    return calls, cuda, chosen


def test_the_numpy_path_passes_each_calls_table_and_summary(fake_gpu):
    calls, cuda, chosen = fake_gpu
    table = ids()
    flashgen.attention(*qkv(), mask_mod=DOC, aux={"doc_ids": table})
    flashgen.attention(*qkv(), mask_mod=DOC, aux={"doc_ids": table})
    assert len(chosen) == 1 and token_of(DOC) in chosen[0].features
    assert chosen[0].family == "mma" and len(cuda.launches) == 2
    first, second = (launch.hook_block for launch in cuda.launches)
    # hook_ptr0: the table's device copy, hook_ptr1: its summary, hook_stride1: its length
    assert first[0] and first[1] and first[MAX_POINTERS + 1] == table.size
    assert second[0] not in (0, first[0]) and second[1] not in (0, first[1])  # fresh copies
    uploads = [c for c in calls.log if c[0] == "htod"]
    want = summarize(table).table.nbytes
    assert [c[2] for c in uploads].count(want) == 2  # the summary, built on the host, per call


def test_the_gpuarray_path_passes_the_tables_in_place_without_summaries(fake_gpu):
    from _fakecuda import FakeGPUArray

    calls, cuda, chosen = fake_gpu
    shapes = ((2, 3, 96, 64),) * 3
    q, k, v = (FakeGPUArray(s, np.float16, gpudata=0x1000_0000 + i * 0x100_0000)
               for i, s in enumerate(shapes))  # fmt: skip
    for base in (0x3000_0000, 0x3100_0000):
        table = FakeGPUArray((96,), np.int32, gpudata=base)
        flashgen.attention(q, k, v, mask_mod=DOC, aux={"doc_ids": table})
    assert len(chosen) == 1
    blocks = [launch.hook_block[:2] for launch in cuda.launches]
    assert blocks == [(0x3000_0000, 0), (0x3100_0000, 0)]  # in place; no summary slot
    with pytest.raises(ValueError, match=r"aux doc_ids: a ndarray; with GPUArray q, k, v"):
        flashgen.attention(q, k, v, mask_mod=DOC, aux={"doc_ids": ids()})
    odd = FakeGPUArray((96,), np.int32, gpudata=0x3000_0000, strides=(8,))
    with pytest.raises(ValueError, match=r"aux doc_ids: its last axis must be contiguous"):
        flashgen.attention(q, k, v, mask_mod=DOC, aux={"doc_ids": odd})


def test_a_table_shorter_than_the_call_is_refused_before_the_gpu(no_pycuda):
    with pytest.raises(ValueError, match=r"aux doc_ids: .* at indices 0\.\.95 .* shape \(90,\)"):
        flashgen.attention(*qkv(), mask_mod=DOC, aux={"doc_ids": ids(90)})
