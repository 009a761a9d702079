"""The property suite for packed variable-length batches (`flash_attn_varlen_func`, sm_90).

Hypothesis draws ragged batches: 1 to 6 sequences whose query and key lengths are drawn apart
(zero-length, 1, primes, tile multiples and their neighbours, anything up to 600, Tq != Tk
both ways) or equal (self-attention), heads with GQA groups, d 64 or 128, fp16 or bf16, causal
or not, a window (including empty and past the sequence), a softcap, ALiBi slopes, logits up
to +-60 and a random or default scale. Every sequence is judged on its own by the float64
oracle with docs/design.md's rule (`check_outputs`), rows with no key must be exactly 0 with
LSE -inf, and no output may hold NaN.

Examples: FLASHGEN_GPU_EXAMPLES, else the Hypothesis profile's count (strategies.py), times 4.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashgen.verify.oracle import check_outputs
from flashgen.verify.strategies import (
    LOGIT_MAX,
    SPECIAL_LENGTHS,
    gpu_examples,
    settings_for,
)

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch has no CUDA device", allow_module_level=True)
if torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("the varlen kernels are family wgmma's (sm_90)", allow_module_level=True)
from flashgen.torch import flash_attn_varlen_func  # noqa: E402

pytestmark = pytest.mark.gpu
TYPES = {"fp16": (torch.float16, np.float16), "bf16": (torch.bfloat16, ml_dtypes.bfloat16)}
TILE_EDGES = sorted({m * 128 + o for m in (1, 2, 3, 4) for o in (-1, 0, 1)} | {63, 64, 65})


def seq_lengths() -> st.SearchStrategy[int]:
    """A sequence's length: 0, a special length, a tile edge, or anything up to 600."""
    return st.one_of(
        st.just(0),
        st.sampled_from([n for n in SPECIAL_LENGTHS if n <= 600]),
        st.sampled_from(TILE_EDGES),
        st.integers(min_value=0, max_value=600),
    )


@st.composite
def batches(draw: Any) -> dict[str, Any]:
    n = draw(st.integers(min_value=1, max_value=6))
    lens_q = draw(st.lists(seq_lengths(), min_size=n, max_size=n))
    same = draw(st.booleans())
    lens_k = lens_q if same else draw(st.lists(seq_lengths(), min_size=n, max_size=n))
    h_kv = draw(st.sampled_from([1, 2, 4]))
    group = draw(st.sampled_from([1, 2, 4]))
    window = draw(
        st.one_of(
            st.none(),
            st.tuples(
                st.integers(min_value=-1, max_value=700), st.integers(min_value=-1, max_value=700)
            ),
        )
    )
    return {
        "lens_q": lens_q,
        "lens_k": lens_k,
        "h_kv": h_kv,
        "h": h_kv * group,
        "d": draw(st.sampled_from([64, 128])),
        "dtype": draw(st.sampled_from(["bf16", "fp16"])),
        "causal": draw(st.booleans()),
        "window": None if window in (None, (-1, -1)) else window,
        "softcap": draw(st.one_of(st.just(0.0), st.floats(min_value=1.0, max_value=50.0))),
        "alibi": draw(st.booleans()),
        "logit_max": draw(st.one_of(st.just(LOGIT_MAX), st.floats(min_value=0.5, max_value=60))),
        "scale": draw(st.one_of(st.none(), st.floats(min_value=0.01, max_value=2.0))),
        "seed": draw(st.integers(min_value=0, max_value=2**31 - 1)),
    }


def _cu(lens: list[int]) -> Any:
    return torch.tensor([0, *np.cumsum(lens).tolist()], dtype=torch.int32, device="cuda")


def _run_and_judge(c: dict[str, Any]) -> None:
    t, npt = TYPES[c["dtype"]]
    g = torch.Generator(device="cuda").manual_seed(c["seed"])
    tq, tk, d = max(sum(c["lens_q"]), 1), max(sum(c["lens_k"]), 1), c["d"]
    scale = c["scale"] or d**-0.5
    # logits scale * q.k with q, k ~ N(0, m^2): standard deviation scale * sqrt(d) * m^2, set
    # to logit_max / 4 so that the largest |logit| of a problem is about logit_max
    mag = (c["logit_max"] / (4 * scale * d**0.5)) ** 0.5
    q = (torch.randn(tq, c["h"], d, device="cuda", generator=g) * mag).to(t)
    k = (torch.randn(tk, c["h_kv"], d, device="cuda", generator=g) * mag).to(t)
    v = torch.randn(tk, c["h_kv"], d, device="cuda", generator=g).to(t)
    slopes = (
        torch.rand(c["h"], device="cuda", generator=g, dtype=torch.float32)
        if c["alibi"] else None
    )  # fmt: skip
    o, lse = flash_attn_varlen_func(
        q, k, v, _cu(c["lens_q"]), _cu(c["lens_k"]), max(c["lens_q"]), max(c["lens_k"]),
        softmax_scale=c["scale"], causal=c["causal"], window_size=c["window"] or (-1, -1),
        softcap=c["softcap"], alibi_slopes=slopes, return_lse=True,
    )  # fmt: skip
    torch.cuda.synchronize()
    feats: dict[str, Any] = {}
    if c["window"] is not None:
        feats["window"] = c["window"]
    if c["softcap"]:
        feats["softcap"] = c["softcap"]
    if slopes is not None:
        feats["alibi_slopes"] = slopes.cpu().numpy()
    cq, ck = np.cumsum([0, *c["lens_q"]]), np.cumsum([0, *c["lens_k"]])
    for s, (nq, nk) in enumerate(zip(c["lens_q"], c["lens_k"], strict=True)):
        if nq == 0:
            continue
        rows = slice(int(cq[s]), int(cq[s]) + nq)
        assert not torch.isnan(o[rows]).any() and not torch.isnan(lse[:, rows]).any(), s
        if nk == 0:
            assert (o[rows] == 0).all() and (lse[:, rows] == float("-inf")).all(), s
            continue
        keys = slice(int(ck[s]), int(ck[s]) + nk)

        def host(x: Any) -> np.ndarray:
            return x.transpose(0, 1)[None].float().cpu().numpy().astype(npt)

        res = check_outputs(
            host(o[rows]), lse[:, rows][None].cpu().numpy(), host(q[rows]), host(k[keys]),
            host(v[keys]), causal=c["causal"], scale=scale, dtype=c["dtype"], **feats,
        )  # fmt: skip
        assert res.passed, (s, nq, nk, res)


@settings(settings_for(), max_examples=4 * gpu_examples())
@given(batches())
def test_ragged_batches_match_the_oracle_per_sequence(case: dict[str, Any]) -> None:
    _run_and_judge(case)
