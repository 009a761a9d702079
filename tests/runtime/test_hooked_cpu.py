"""`flashgen.torch.attention(..., score_mod=, mask_mod=, aux=)` without a GPU: the hooks' op
arguments (aux values in the kernel's slot order, one clear error per bad value), the refusals,
and the registered ops under fake tensors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from flashgen import hooked  # noqa: E402
from flashgen.generator import hooks as hk  # noqa: E402
from flashgen.generator.features.hook import MAX_POINTERS, token_of  # noqa: E402
from flashgen.generator.hooks import library  # noqa: E402
from flashgen.generator.hooks.summary import CHUNK, summarize  # noqa: E402
from flashgen.hooked import _hook_args, hook_op_args, range_summary  # noqa: E402
from flashgen.runtime import summary_kernel  # noqa: E402

Q = torch.zeros(1, 2, 16, 64, dtype=torch.bfloat16)


def _mixed() -> hk.Hook:
    def f(score, b, h, q_idx, kv_idx, bias, cap, shift):
        return cap * hk.tanh(score / cap) + bias[h, kv_idx] + hk.to_float(shift)

    return hk.trace_score_mod(
        f, hk.Aux("bias", "float32", 2), hk.Aux("cap", "float32", 0), hk.Aux("shift", "int32", 0)
    )


def test_aux_values_travel_in_the_kernel_slot_order():
    docs = torch.zeros(16, dtype=torch.int32)
    bias = torch.zeros(2, 16, dtype=torch.float32)
    tokens, tensors, floats, ints = hook_op_args(
        _mixed(), library.document_hook(), {"doc_ids": docs, "bias": bias, "cap": 30,
                                             "shift": 2}, Q,
    )  # fmt: skip
    assert tokens == f"{token_of(_mixed())},{token_of(library.document_hook())}"
    assert tensors[0] is bias and tensors[1] is docs  # score_mod's aux first
    assert floats == [30.0] and ints == [2]


def test_a_plain_function_is_traced():
    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx

    tokens, tensors, floats, ints = hook_op_args(None, causal, None, Q)
    assert tokens.startswith("maskmod") and not (tensors or floats or ints)


@pytest.mark.parametrize(
    "aux, message",
    [
        ({}, "missing softcap"),
        ({"softcap": 30.0, "cap": 1.0}, "unknown cap"),
        ({"softcap": "30"}, "a float32 scalar; pass a Python number"),
        ({"softcap": True}, "a float32 scalar"),
    ],
)
def test_bad_scalar_aux_values_are_named(aux: dict[str, object], message: str):
    with pytest.raises(ValueError, match=message):
        hook_op_args(library.softcap_hook(), None, aux, Q)


@pytest.mark.parametrize(
    "value, message",
    [
        (torch.zeros(16, dtype=torch.int64), "torch.int64 with 1 dimensions; the hook declares"),
        (torch.zeros(2, 8, dtype=torch.int32), "with 2 dimensions; the hook declares int32 with 1"),
        (torch.zeros(32, dtype=torch.int32)[::2], "last axis must be contiguous"),
        ([0] * 16, "a list; pass a torch tensor"),
    ],
)
def test_bad_aux_tensors_are_named(value: object, message: str):
    with pytest.raises(ValueError, match=message):
        hook_op_args(None, library.document_hook(), {"doc_ids": value}, Q)


def test_an_int_aux_refuses_a_fraction_and_kinds_are_checked():
    with pytest.raises(ValueError, match="an int32 scalar; pass an int"):
        hook_op_args(None, library.prefix_lm_hook(), {"prefix": 3.5}, Q)
    with pytest.raises(ValueError, match="is a mask_mod; pass it as mask_mod="):
        hook_op_args(library.document_hook(), None, {"doc_ids": torch.zeros(16)}, Q)
    with pytest.raises(ValueError, match="must be a traced hook"):
        hook_op_args(3, None, None, Q)


def test_the_front_door_refuses_cpu_tensors_and_a_spec_with_hooks():
    import flashgen.torch as fgt
    from flashgen.generator.spec import KernelSpec

    with pytest.raises(ValueError, match="q on cpu: hooked attention runs on a CUDA device"):
        fgt.attention(Q, Q, Q, score_mod=library.softcap_hook(), aux={"softcap": 30.0})
    spec = KernelSpec(family="mma", d=64)
    with pytest.raises(ValueError, match="a hooked call picks its own variant"):
        fgt.attention(Q, Q, Q, spec=spec, mask_mod=library.causal_hook())


def test_the_hooked_ops_trace_with_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    import flashgen.torch as fgt  # registers the ops
    from flashgen.runtime import feature_values

    token = token_of(library.document_hook())
    with FakeTensorMode():
        q = torch.empty(2, 4, 100, 64, dtype=torch.bfloat16, device="cuda")
        v = torch.empty(2, 4, 90, 32, dtype=torch.bfloat16, device="cuda")
        ids = torch.empty(100, dtype=torch.int32, device="cuda")
        features = fgt._op_args(feature_values.from_keywords({}, "test"))
        o, lse = torch.ops.flashgen.hooked_attention(
            q, v, v, True, None, token, [ids], [], [], *features, False
        )
        dq, dk, dv = torch.ops.flashgen.hooked_attention_backward(
            q, v, v, o, lse, o, True, None, False, token, [ids], [], []
        )
    assert tuple(o.shape) == (2, 4, 100, 32) and tuple(lse.shape) == (2, 4, 100)
    assert dq.shape == q.shape and dk.shape == v.shape


def test_the_hooks_op_arguments_trace_under_torch_compile_fullgraph():
    # torch.compile traces the front door's Python: the hooks' tokens and the aux plan must
    # be traceable (no hashing at trace time), only the aux tensors become graph inputs
    hook = library.document_hook()
    token = token_of(hook)

    def f(q: object, ids: object) -> object:
        tokens, tensors, floats, ints = hook_op_args(None, hook, {"doc_ids": ids}, q)
        assert tokens == token and floats == [] and ints == [] and len(tensors) == 1
        return tensors[0] + 1

    ids = torch.arange(200, dtype=torch.int32) // 7
    out = torch.compile(f, fullgraph=True, backend="eager")(Q, ids)
    assert torch.equal(out, ids + 1)  # the table alone: the op summarizes it (no host sync)


@pytest.mark.parametrize("with_aux", ["table+summary", "table", ""])
def test_the_backward_gives_one_gradient_entry_per_input(with_aux: str):
    # the registered autograd formula returns a structure torch accepts (a list of Nones for
    # the aux tensor list): checked through autograd with stand-in CPU kernels for the ops
    import flashgen.torch as fgt  # registers the ops
    from flashgen.runtime import feature_values

    def fwd(q, k, v, *rest):  # type: ignore[no-untyped-def]
        return q * 2.0, torch.zeros(q.shape[:-1], dtype=torch.float32)

    def bwd(q, k, v, o, lse, do, *rest):  # type: ignore[no-untyped-def]
        return do * 2.0, torch.zeros_like(k), torch.zeros_like(v)

    lib = torch.library.Library("flashgen", "IMPL")
    try:
        lib.impl("hooked_attention", fwd, "CPU")
        lib.impl("hooked_attention_backward", bwd, "CPU")
        hook = library.document_hook() if with_aux else library.causal_hook()
        aux = [torch.zeros(16, dtype=torch.int32)] if with_aux else []
        if with_aux == "table+summary":  # as the front door passes them
            aux.append(range_summary(aux[0]))
        q = torch.randn(1, 2, 16, 64).requires_grad_()
        k = torch.randn(1, 2, 16, 64).requires_grad_()
        # every argument, as flashgen.hooked passes them: the features' defaults, deterministic
        features = fgt._op_args(feature_values.from_keywords({}, "test"))
        o, _ = torch.ops.flashgen.hooked_attention(
            q, k, k, True, None, token_of(hook), aux, [], [], *features, False
        )
        (dq,) = torch.autograd.grad(o.sum(), (q,))
        assert torch.equal(dq, torch.full_like(q, 2.0))
    finally:
        lib._destroy()


@pytest.mark.parametrize("with_aux", [True, False])
def test_an_eager_training_call_runs_the_hooked_ops_autograd_formula(monkeypatch, with_aux):
    """With gradients asked on plain CUDA tensors, hooked calls run `_EagerHookedAttention`
    (the op's setup_context and backward as an autograd.Function; stand-in kernels on CPU
    tensors here): the aux tables and features reach both kernels."""
    seen: dict[str, tuple[object, ...]] = {}

    def run(q, k, v, causal, scale, hooks, tensors, floats, ints, *features):  # type: ignore[no-untyped-def]
        seen["fwd"] = (causal, hooks, list(tensors), floats, ints, *features)
        return q * 2.0, torch.zeros(q.shape[:-1], dtype=torch.float32)

    def run_backward(q, k, v, o, lse, do, causal, scale, det, hooks, tensors, floats, ints,
                     *features):  # type: ignore[no-untyped-def]  # fmt: skip
        seen["bwd"] = (causal, hooks, list(tensors), floats, ints, *features)
        return do * 2.0, do * 3.0, do * 4.0

    monkeypatch.setattr(hooked, "_run", run)
    monkeypatch.setattr(hooked, "_BWD_OP", run_backward)
    import flashgen.torch as fgt
    from flashgen.runtime import feature_values

    q, k, v = (torch.randn(1, 2, 16, 64, dtype=torch.bfloat16).requires_grad_() for _ in "qkv")
    docs = torch.zeros(16, dtype=torch.int32)
    mask, aux = (library.document_hook(), {"doc_ids": docs}) if with_aux else (
        library.causal_hook(), None)  # fmt: skip
    # as hooked_attention calls it once `eager_autograd` says yes (CUDA tensors only)
    hooks, tensors, floats, ints = hook_op_args(None, mask, aux, q)
    features = fgt._op_args(feature_values.from_keywords({"window": (8, 0)}, "test"))
    o, lse = hooked._EagerHookedAttention.apply(
        q, k, v, False, None, hooks, floats, ints, False, len(tensors), *tensors, *features
    )
    assert o.requires_grad and not lse.requires_grad
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
    assert torch.equal(dq, torch.full_like(q, 2.0)) and torch.equal(dk, torch.full_like(k, 3.0))
    assert seen["fwd"][1] == token_of(mask) and seen["fwd"][5:7] == (8, 0)
    assert seen["bwd"][:2] == seen["fwd"][:2] and seen["bwd"][3:] == seen["fwd"][3:]
    assert [t is docs for t in seen["bwd"][2]] == ([True] if with_aux else [])


def test_a_token_made_without_registering_still_finds_its_live_hook():
    # inside torch.compile the front door's token_of runs at trace time, and its write to the
    # registry is not replayed: rendering must find the hook by its digest all the same
    from flashgen.generator.features import hook as feature_hook

    def fresh(b, h, q_idx, kv_idx):  # type: ignore[no-untyped-def]
        return q_idx - kv_idx < 77

    hook = hk.trace_mask_mod(fresh)
    token = f"maskmod{hook.digest}"
    feature_hook._REGISTRY.pop(token, None)
    assert feature_hook.hook_of(token) is hook
    with pytest.raises(feature_hook.HookNotRegistered, match="no hook with digest 0123456789ab"):
        feature_hook.hook_of("scoremod0123456789ab")


class _Problem:
    """What `_forward_spec` reads of a call (runtime.validate.Problem's fields)."""

    def __init__(self, d: int) -> None:
        self.d, self.value_dim, self.dtype = d, d, "bf16"

    def alignment(self, pointers: bool = False) -> int:
        return 8


@pytest.mark.parametrize(
    "arch, d, hook, family",
    [
        ("sm_90", 128, library.softcap_hook(), "wgmma"),  # Hopper: the unhooked call's family
        ("sm_90", 64, library.document_hook(), "wgmma"),
        ("sm_80", 128, library.softcap_hook(), "mma"),  # Ampere: mma's tile, as unhooked
        ("sm_90", 72, library.softcap_hook(), "wgmma"),  # generated on demand, as unhooked
    ],
)
def test_the_hooked_forward_runs_the_unhooked_calls_family(monkeypatch, arch, d, hook, family):
    import flashgen.hooked as hooked

    monkeypatch.setattr(hooked, "_arch", lambda dev: arch)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: "no such GPU")
    spec = hooked._forward_spec(_Problem(d), True, 0, (token_of(hook),))
    assert spec.family == family and spec.features == (token_of(hook),)
    assert spec.direction == "fwd" and spec.d == d


def test_a_tile_that_refuses_hooks_takes_another_tile_of_its_family(monkeypatch):
    import flashgen.hooked as hooked
    from flashgen.generator.spec import KernelSpec
    from flashgen.runtime import hook_spec

    wide = KernelSpec(family="wgmma", d=128, dtype="bf16", causal=True, br=192, bc=64)
    monkeypatch.setattr(hooked, "_arch", lambda dev: "sm_90")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: "no such GPU")
    real = hook_spec.select
    monkeypatch.setattr(
        hook_spec, "select", lambda *a, **kw: wide if "candidates" not in kw else real(*a, **kw)
    )
    token = token_of(library.softcap_hook())
    spec = hooked._forward_spec(_Problem(128), True, 0, (token,))
    # wgmma's br=192 takes no hook (H200's tuned d64 tile): a br=128 wgmma tile does
    assert spec.family == "wgmma" and spec.br == 128 and spec.features == (token,)
    # and where no tile of the family takes the call, family mma's does
    real_shipped = hook_spec.shipped
    monkeypatch.setattr(
        hook_spec, "shipped", lambda fam=None: [] if fam == "wgmma" else real_shipped(fam)
    )
    spec = hooked._forward_spec(_Problem(128), True, 0, (token,))
    assert spec.family == "mma" and spec.features == (token,)


@pytest.mark.parametrize(("spills", "br"), [(0, 192), (56, 128)])
def test_a_mask_hook_takes_the_wide_tile_unless_ptxas_reports_spills(monkeypatch, spills, br):
    import flashgen.hooked as hooked
    from flashgen.generator.spec import KernelSpec
    from flashgen.runtime import hook_spec

    wide = KernelSpec(family="wgmma", d=64, dtype="bf16", causal=False, br=192, bc=128)
    monkeypatch.setattr(hooked, "_arch", lambda dev: "sm_90")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: "no such GPU")
    real = hook_spec.select
    monkeypatch.setattr(
        hook_spec, "select", lambda *a, **kw: wide if "candidates" not in kw else real(*a, **kw)
    )
    asked: list[str] = []

    def spill_bytes(spec: KernelSpec, arch: str) -> int:
        asked.append(spec.name)
        return spills

    monkeypatch.setattr(hook_spec.gpu, "spill_bytes", spill_bytes)
    token = token_of(library.causal_hook())
    spec = hooked._forward_spec(_Problem(64), False, 0, (token,))
    assert spec.family == "wgmma" and spec.br == br and spec.features == (token,)
    assert asked == [wide.replace(features=(token,)).name]  # the wide tile's report only
    # a mask reading a table at ranges (document ids) keeps the narrower tile, unasked
    asked.clear()
    doc = token_of(library.document_hook())
    spec = hooked._forward_spec(_Problem(64), False, 0, (doc,))
    assert spec.family == "wgmma" and spec.br == 128 and not asked


# ---- range summaries of the tables a mask reads at ranges of indices ----------------------------
@given(
    st.integers(1, 40 * CHUNK), st.sampled_from(["sorted", "unsorted", "extremes"]),
    st.integers(0, 2**32 - 1),
)  # fmt: skip
def test_the_torch_ops_summary_is_the_host_summary(n: int, kind: str, seed: int):
    rng = np.random.default_rng(seed)
    if kind == "sorted":
        t = np.sort(rng.integers(0, 30, n)).astype(np.int32)
    elif kind == "unsorted":
        t = rng.integers(-(2**31), 2**31 - 1, n).astype(np.int32)
    else:  # int32's ends: ~x keeps them apart (no overflow)
        t = rng.choice(np.asarray([-(2**31), 2**31 - 1, 0], np.int32), n)
    got = range_summary(torch.from_numpy(t))
    assert got.dtype == torch.int32 and got.is_contiguous()
    assert np.array_equal(got.numpy(), summarize(t).table)


def test_the_op_summarizes_the_tables_a_mask_reads_at_ranges(monkeypatch):
    """The front door passes the tables alone; the op appends their summaries (here the torch
    ops' fallback: no GPU arch to build the kernel for), unless it was given them or a table
    cannot be summarized."""
    monkeypatch.setattr(hooked, "_summary_arch", lambda dev: None)
    docs = torch.arange(300, dtype=torch.int32) // 50
    hook = library.document_hook()
    hooks, tensors, _, _ = hook_op_args(None, hook, {"doc_ids": docs}, Q)
    assert tensors == [docs]
    got = hooked._with_summaries(hooks, tensors, Q)
    assert got[0] is docs and len(got) == 2
    assert np.array_equal(got[1].numpy(), summarize(docs.numpy()).table)
    assert hooked._with_summaries(hooks, got, Q) is got  # given: kept
    strided = torch.arange(600, dtype=torch.int32)[::2]
    assert hooked._with_summaries(hooks, [strided], Q) == [strided]  # the verdicts do without
    # a mask without such a read, and a score_mod's tables, take none
    hooks, tensors, _, _ = hook_op_args(library.alibi_hook(), library.causal_hook(),
                                        {"alibi_slopes": torch.ones(2)}, Q)  # fmt: skip
    assert len(tensors) == 1 and hooked._with_summaries(hooks, tensors, Q) is tensors
    with pytest.raises(ValueError, match="aux doc_ids: an empty table; .* pass one entry"):
        hook_op_args(None, library.document_hook(), {"doc_ids": docs[:0]}, Q)


def test_a_table_too_long_for_the_summary_kernel_takes_the_torch_ops(monkeypatch):
    launched: list[int] = []
    monkeypatch.setattr(hooked, "_summary_arch", lambda dev: "sm_90")
    monkeypatch.setattr(hooked.summary_kernel, "launch", lambda t, n, *a: launched.append(n))
    monkeypatch.setattr(hooked, "raw_stream", lambda dev: 0)
    hooks = token_of(library.document_hook())
    short = torch.zeros(summary_kernel.MAX_ELEMENTS, dtype=torch.int32)
    hooked._with_summaries(hooks, [short], Q)
    assert launched == [summary_kernel.MAX_ELEMENTS]
    long = torch.zeros(summary_kernel.MAX_ELEMENTS + 1, dtype=torch.int32)
    got = hooked._with_summaries(hooks, [long], Q)
    assert launched == [summary_kernel.MAX_ELEMENTS]
    assert np.array_equal(got[1].numpy(), summarize(long.numpy()).table)


def test_the_op_takes_the_summaries_or_none():
    hook = library.document_hook()
    docs = torch.arange(300, dtype=torch.int32) // 50
    _, tensors, floats, ints = hook_op_args(None, hook, {"doc_ids": docs}, Q)
    tensors = [*tensors, range_summary(docs)]
    args = _hook_args((hook,), tensors, floats, ints).kernel_args()
    # slot 0 the table; slot 1 its summary, its length in the stride slot
    assert args[0] == docs.data_ptr() and args[1] == tensors[1].data_ptr()
    assert args[MAX_POINTERS : MAX_POINTERS + 2] == (0, 300)
    bare = _hook_args((hook,), tensors[:1], floats, ints).kernel_args()
    assert bare[1] == 0 and bare[MAX_POINTERS + 1] == 0  # NULL: the verdicts do without
    with pytest.raises(ValueError, match="either no range summaries or one per table"):
        _hook_args((hook,), [*tensors, tensors[1]], floats, ints)
    wrong = range_summary(docs[:100])
    with pytest.raises(
        ValueError, match=r"a table of 300 entries takes a contiguous int32 \(3, 2, 5\)"
    ):
        _hook_args((hook,), [docs, wrong], floats, ints)


@pytest.mark.parametrize(
    "arch, d, deterministic, family",
    [
        ("sm_90", 128, False, "wgmma"),  # Hopper: the unhooked call's backward family
        ("sm_90", 64, False, "wgmma"),
        ("sm_90", 128, True, "mma"),  # wgmma's backward has no deterministic mode
        ("sm_90", 96, False, "wgmma"),  # d 96 too (run at 128)
        ("sm_80", 128, False, "mma"),
    ],
)
def test_the_hooked_backward_runs_the_unhooked_calls_family(
    monkeypatch, arch, d, deterministic, family
):
    import flashgen.hooked as hooked

    monkeypatch.setattr(hooked, "_arch", lambda dev: arch)
    monkeypatch.delenv("FLASHGEN_WGMMA_BWD", raising=False)
    token = token_of(library.document_hook())
    x = torch.zeros(1, 4, 256, d, dtype=torch.bfloat16)
    spec = hooked._backward_spec(_Problem(d), True, 0, deterministic, (token,), (x, x, x))
    assert spec.family == family and spec.direction == "bwd" and token in spec.features
    assert ("deterministic" in spec.features) == deterministic
    monkeypatch.setenv("FLASHGEN_WGMMA_BWD", "0")  # the TMA family left out: mma's
    assert hooked._backward_spec(_Problem(d), True, 0, False, (token,), (x,)).family == "mma"


def test_a_table_shorter_than_the_call_is_refused_before_any_launch():
    # where the op runs (a signature's first call): the tables' shapes against the call's sizes
    from flashgen.hooked import _check_indices, _hooks

    k = torch.zeros(1, 2, 24, 64, dtype=torch.bfloat16)  # Tk 24 > the 16 document ids
    docs = torch.zeros(16, dtype=torch.int32)
    doc = library.document_hook()
    tokens, tensors, floats, ints = hook_op_args(None, doc, {"doc_ids": docs}, Q)
    _check_indices(_hooks(tokens), tensors, floats, ints, Q, Q)  # Tq = Tk = 16: inside
    with pytest.raises(ValueError, match=r"aux doc_ids: .* at indices 0\.\.23 .* shape \(16,\)"):
        _check_indices(_hooks(tokens), tensors, floats, ints, Q, k)
    bias = torch.zeros(1, 16, dtype=torch.float32)  # one head's row; the call has two heads
    tokens, tensors, floats, ints = hook_op_args(
        _mixed(), None, {"bias": bias, "cap": 30, "shift": 2}, Q
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"aux bias: .* axis 0 of it at indices 0\.\.1"):
        _check_indices(_hooks(tokens), tensors, floats, ints, Q, Q)


def test_the_forward_builds_a_block_map_where_it_pays(monkeypatch):
    # family wgmma's kernel reads the map; a table-reading mask with its summaries built takes
    # one; a table-free mask, a call without summaries or family mma's kernel do without
    from flashgen.generator.spec import KernelSpec

    monkeypatch.setattr(hooked, "_summary_arch", lambda dev: "sm_90")
    doc = library.document_hook()
    docs = torch.arange(300, dtype=torch.int32) // 50
    tokens = token_of(doc)
    q, k = torch.zeros(2, 3, 300, 64), torch.zeros(2, 3, 500, 64)
    wgmma = KernelSpec(family="wgmma", d=64, dtype="bf16", causal=False, features=(tokens,))
    plan = hooked._map_plan(wgmma, tokens, [docs, range_summary(docs)], q, k, 0)
    assert plan is not None and (plan.tq, plan.tk, plan.slot) == (300, 500, 3)
    assert (plan.layout.br, plan.layout.bc, plan.layout.rows) == (wgmma.br, wgmma.bc, 3)
    assert plan.build  # the op builds it when the caller passed none
    assert not hooked._map_plan(wgmma, tokens, [docs], q, k, 0).build  # no summaries
    mma = KernelSpec(family="mma", d=64, dtype="bf16", causal=False, features=(tokens,))
    assert hooked._map_plan(mma, tokens, [docs, range_summary(docs)], q, k, 0) is None
    causal = token_of(library.causal_hook())
    plain = KernelSpec(family="wgmma", d=64, dtype="bf16", causal=False, features=(causal,))
    free = hooked._map_plan(plain, causal, [], q, k, 0)
    assert free is not None and not free.build  # read when given, not built per call


def test_a_callers_block_maps_travel_after_the_summaries_with_their_tiles():
    doc = library.document_hook()
    tokens = token_of(doc)
    docs = torch.arange(300, dtype=torch.int32) // 50
    summary = range_summary(docs)
    fwd, bwd = torch.zeros(6, dtype=torch.int32), torch.zeros(9, dtype=torch.int32)
    tiles = [128, 128, 64, 128]
    tensors, ints, given = hooked._given_maps(tokens, [docs, summary, fwd, bwd], tiles)
    assert tensors == [docs, summary] and ints == [] and given is not None
    assert given.forward is fwd and given.backward is bwd and given.tiles == (128, 128, 64, 128)
    assert hooked._given_maps(tokens, [docs], []) == ([docs], [], None)  # no map
    with pytest.raises(ValueError, match="a block map travels as two tensors after the 1 aux"):
        hooked._given_maps(tokens, [docs, fwd, bwd], [128, 128, 64, 128])  # no summary
    from flashgen.generator.spec import KernelSpec

    monkey_arch = hooked._summary_arch
    try:
        hooked._summary_arch = lambda dev: "sm_90"  # type: ignore[assignment]
        spec = KernelSpec(family="wgmma", d=64, dtype="bf16", causal=False, features=(tokens,))
        q, k = torch.zeros(1, 2, 300, 64), torch.zeros(1, 2, 300, 64)
        plan = hooked._map_plan(spec, tokens, [docs, summary], q, k, 0)
        right = torch.zeros(plan.layout.size, dtype=torch.int32)
        ok = hooked._GivenMaps(right, bwd, (spec.br, spec.bc, 64, 128))
        assert ok.check(plan, spec, q) is right
        for bad in (
            hooked._GivenMaps(right, bwd, (192, spec.bc, 64, 128)),  # another tile
            hooked._GivenMaps(right[1:], bwd, (spec.br, spec.bc, 64, 128)),  # another size
            hooked._GivenMaps(right.to(torch.int64), bwd, (spec.br, spec.bc, 64, 128)),
        ):
            with pytest.raises(ValueError, match="block_map: its forward map was built for"):
                bad.check(plan, spec, q)
    finally:
        hooked._summary_arch = monkey_arch  # type: ignore[assignment]


def test_a_block_map_is_for_the_call_it_was_built_for():
    doc = library.document_hook()
    docs = torch.arange(300, dtype=torch.int32) // 50
    q = torch.zeros(1, 2, 300, 64, dtype=torch.bfloat16)
    hooks, tensors, floats, ints = hook_op_args(None, doc, {"doc_ids": docs}, Q)
    fwd, bwd = torch.zeros(4, dtype=torch.int32), torch.zeros(6, dtype=torch.int32)
    bm = hooked.BlockMap(
        hooks=hooks, aux=(docs,), versions=(docs._version,), summaries=(range_summary(docs),),
        forward=fwd, backward=bwd, tiles=(128, 128, 64, 128), sizes=(1, 2, 300, 300, 64, 64),
        dtype=torch.bfloat16, causal=False,
    )  # fmt: skip
    got_tensors, got_ints = bm.op_args(hooks, tensors, ints, q, q, q, False)
    assert got_tensors[0] is docs and got_tensors[-2:] == [fwd, bwd]
    assert got_ints == [128, 128, 64, 128]
    with pytest.raises(ValueError, match=r"built for \(B, H, Tq, Tk, d, dv\) = \(1, 2, 300, 300"):
        bm.op_args(hooks, tensors, ints, q, q, q, True)
    with pytest.raises(ValueError, match="built for other hooks"):
        bm.op_args(token_of(library.causal_hook()), tensors, ints, q, q, q, False)
    with pytest.raises(ValueError, match="built from other aux tensors, or they were modified"):
        bm.op_args(hooks, [docs.clone()], ints, q, q, q, False)
    docs.add_(0)  # an in-place change: the verdicts may no longer hold
    with pytest.raises(ValueError, match="built from other aux tensors, or they were modified"):
        bm.op_args(hooks, tensors, ints, q, q, q, False)
