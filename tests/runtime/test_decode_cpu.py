"""The decode direction without a GPU: its specs and rules, the variant and split choices, the
argument table, compiling (ptxas: no spills), and the torch front door's errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flashgen.generator import abi
from flashgen.generator.compile import compile_kernel
from flashgen.generator.families.mma.decode import (
    DECODE_MERGE_MAX,
    DECODE_REG_BUDGET,
    merge_group_size,
    register_estimate,
)
from flashgen.generator.render import render
from flashgen.generator.spec import KernelSpec, SpecError
from flashgen.runtime.decode import (
    COMBINE_ENV,
    COMBINE_THREADS,
    DECODE_MAX_SPLITS,
    POINTER_ARGS,
    choose_splits,
    combine_enabled,
    decode_spec,
    routes_to_decode,
    row_tiles,
    scratch_sizes,
)


def spec(**kw: object) -> KernelSpec:
    base: dict[str, object] = {"family": "mma", "direction": "decode", "d": 128, "dtype": "bf16"}
    base.update(kw)
    return KernelSpec(**base)  # type: ignore[arg-type]


def test_a_decode_spec_has_a_name_that_reads_back():
    s = spec(causal=True, features=("window", "alibi"))
    assert s.name == "flash_decode_mma_d128_br16_bc16_bf16_causal_window_alibi_w4_s2"
    assert KernelSpec.from_name(s.name) == s
    assert "--direction decode" in s.build_command


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"family": "wgmma"}, "family wgmma has no decode kernel; use --family mma"),
        ({"family": "simt", "dtype": "fp32"}, "no decode kernel"),
        ({"features": ("gqapack",)}, "always packs a GQA group"),
        ({"features": ("deterministic",)}, "drop deterministic"),
        ({"br": 24}, "br=24: the decode kernel's packed rows per block are 16, 32, 48 or 64"),
        ({"bc": 128}, "bc=128: keys per warp tile must be 16, 32, 48 or 64"),
        ({"stages": 1}, "stages=1: each warp's K/V ring holds 2, 3 or 4 tiles"),
        ({"dtype": "fp32"}, "needs a tensor-core dtype"),
        ({"d": 256, "br": 32, "bc": 16}, "registers per thread"),
        ({"d": 256, "bc": 32, "stages": 4}, "smem="),
    ],
)
def test_a_bad_decode_spec_is_refused_with_the_rule_and_a_fix(kw: dict[str, object], match: str):
    with pytest.raises(SpecError, match=re.escape(match)):
        spec(**kw)


@pytest.mark.parametrize("d, rows", [(64, 4), (128, 1), (128, 16), (128, 32), (256, 8), (72, 4)])
def test_the_chosen_variant_is_valid_and_small(d: int, rows: int):
    s = decode_spec(d, d, "bf16", False, rows)
    assert s.direction == "decode" and s.bc == 16 and s.stages == 2
    assert s.br == (16 if rows <= 16 else 32)
    assert register_estimate(s.d, s.dv, s.br, s.bc) <= DECODE_REG_BUDGET
    assert row_tiles(s, 1, rows) == -(-rows // s.br)


def test_splits_fill_one_wave_and_never_cut_a_short_cache_too_fine():
    s = decode_spec(128, 128, "bf16", False, 4)  # bc 16, 4 warps: >= 16 tiles (256 keys) a split
    assert choose_splits(s, blocks=64, tk=8192, slots=660) == 10
    assert choose_splits(s, blocks=8, tk=65536, slots=660) == 82
    assert choose_splits(s, blocks=8, tk=10**6, slots=10**6) == DECODE_MAX_SPLITS
    assert choose_splits(s, blocks=8, tk=300, slots=660) == 2  # 19 tiles: 2 splits of >= 16
    assert choose_splits(s, blocks=5000, tk=8192, slots=660) == 1
    assert choose_splits(s, blocks=8, tk=8192, slots=660, requested=7) == 7
    assert choose_splits(s, blocks=8, tk=32, slots=660, requested=7) == 2  # 2 tiles only


def test_scratch_is_only_allocated_for_several_splits():
    s = decode_spec(128, 128, "bf16", False, 4)
    assert scratch_sizes(s, 2, 8, 1, 1) == (0, 0, 16)
    assert scratch_sizes(s, 2, 8, 1, 4) == (16 * 4 * 16 * 128, 16 * 4 * 16, 16 * 2)
    # 128 splits merge in 11 groups of 12: a groups counter and 11 group counters a row tile
    assert scratch_sizes(s, 2, 8, 1, 128)[2] == 16 * 12


def test_many_splits_merge_in_two_levels_of_at_most_the_merge_max():
    assert merge_group_size(1) == 1 and merge_group_size(16) == 16  # one level
    assert merge_group_size(17) == 5 and merge_group_size(128) == 12
    for n in range(1, DECODE_MERGE_MAX**2 + 1):
        g = merge_group_size(n)
        assert g <= DECODE_MERGE_MAX and -(-n // g) <= DECODE_MERGE_MAX
    with pytest.raises(ValueError, match="at most 256"):
        merge_group_size(257)


def test_the_argument_table_names_every_pointer_the_launcher_passes():
    assert abi.pointers(abi.DECODE) == POINTER_ARGS
    src = render(decode_spec(128, 128, "bf16", True, 4)).source
    for p in abi.DECODE:
        assert re.search(rf"\b{p.name}\b", src), p.name


def test_the_merge_kernel_sits_in_the_variants_source_with_its_argument_table(monkeypatch):
    s = decode_spec(128, 128, "bf16", True, 4)
    src = render(s).source
    assert f"__launch_bounds__(COMBINE_THREADS) {s.name}_combine(" in src
    assert f"constexpr int COMBINE_THREADS = {COMBINE_THREADS};" in src  # the host's block
    for p in abi.DECODE_COMBINE:
        assert p.declaration("elem_t") in src, p.name
    # where it runs: sm_90 and newer unless switched off (the in-kernel merge everywhere else)
    assert combine_enabled("sm_90") and not combine_enabled("sm_80")
    monkeypatch.setenv(COMBINE_ENV, "0")
    assert not combine_enabled("sm_90")


@pytest.mark.compile_all  # twelve nvcc runs: the compile-everything check's, not the default's
@pytest.mark.parametrize(
    "d, dv, rows, causal, features",
    [
        (128, 128, 4, False, ()),
        (128, 128, 32, True, ()),
        (64, 64, 8, True, ("window", "softcap", "alibi")),
        (256, 256, 8, False, ()),
        (192, 128, 16, True, ("window",)),
        (72, 72, 4, False, ("softcap",)),
    ],
)
def test_decode_variants_compile_without_spills(nvcc_required: Path, d, dv, rows, causal, features):
    s = decode_spec(d, dv, "fp16", causal, rows, features)
    for arch in ("sm_80", "sm_90"):
        k = compile_kernel(s, arch)
        assert k.report.spill_bytes == 0, (s.name, arch, k.report)


def test_the_torch_front_door_refuses_cpu_tensors_with_one_clear_error():
    torch = pytest.importorskip("torch")
    from flashgen.kvcache import attention_with_kvcache

    q = torch.zeros(1, 1, 8, 64, dtype=torch.bfloat16)
    k = torch.zeros(1, 32, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"q on cpu: must be on a CUDA device"):
        attention_with_kvcache(q, k, k)
    with pytest.raises(ValueError, match=r"num_splits=-1: must be an int >= 0"):
        attention_with_kvcache(q, k, k, num_splits=-1)
    with pytest.raises(ValueError, match=r"causal='yes': must be True or False"):
        attention_with_kvcache(q, k, k, causal="yes")
    with pytest.raises(TypeError, match="unexpected keyword argument 'windw'"):
        attention_with_kvcache(q, k, k, windw=(1, 1))


def test_forward_entry_points_refuse_a_decode_spec_and_bundles_take_it():
    from flashgen.bundle.emit import bundle_context
    from flashgen.runtime.validate import check_spec_type
    from flashgen.verify.checks import check_problem

    s = spec()
    with pytest.raises(ValueError, match="direction='decode' variant; the forward runs"):
        check_spec_type(s)
    with pytest.raises(ValueError, match="a decode variant; `check` runs forward and backward"):
        check_problem(s, b=1, h=1, tq=1, tk=1, seed=0, scale=None)
    assert bundle_context([s])["decode_variants"][0]["kernel"] == s.name  # its own launcher


def test_the_decode_op_is_registered_and_traces_under_torch_compile():
    torch = pytest.importorskip("torch")
    from flashgen.kvcache import SCHEMA, attention_with_kvcache

    op = torch.ops.flashgen.attention_with_kvcache.default
    assert str(op._schema) == "flashgen::" + SCHEMA
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    for key in ("CUDA", "CPU", "Meta"):
        assert has_kernel("flashgen::attention_with_kvcache", key), key

    def meta(*shape: int, dtype: object = None) -> object:
        return torch.empty(*shape, device="meta", dtype=dtype or torch.bfloat16)

    q, k, v = meta(3, 2, 8, 64), meta(40, 16, 2, 64), meta(40, 16, 2, 32)
    lens, table = meta(3, dtype=torch.int32), meta(3, 5, dtype=torch.int32)
    o, lse = attention_with_kvcache(q, k, v, lens, block_table=table, return_lse=True, softcap=5.0)
    assert o.shape == (3, 2, 8, 32) and o.dtype == q.dtype
    assert lse.shape == (3, 8, 2) and lse.dtype == torch.float32

    torch._dynamo.reset()
    graphs = []

    def backend(gm: object, example_inputs: object) -> object:
        graphs.append(gm)
        return gm.forward  # type: ignore[attr-defined]

    def step(q: object, k: object, v: object, lens: object, table: object) -> object:
        return attention_with_kvcache(q, k, v, lens, block_table=table, causal=True, window=(4, 0))

    torch.compile(step, fullgraph=True, backend=backend)(q, k, v, lens, table)
    (node,) = [n for n in graphs[0].graph.nodes if n.target is op]
    assert node.args[6:10] == (True, None, 0, None) and node.args[10:12] == (4, 0)


def test_dense_calls_with_few_query_rows_and_many_keys_route_to_the_decode_kernel():
    assert routes_to_decode(1, 4096) and routes_to_decode(16, 256)
    assert not routes_to_decode(17, 4096)  # enough query rows for the forward's tiles
    assert not routes_to_decode(1, 255)  # too few keys to split
    assert not routes_to_decode(16, 63 * 4)


def test_a_remembered_decode_call_decodes_no_feature_value(monkeypatch):
    """The signature key is built from the raw feature op arguments, so a call whose signature
    was validated before goes straight to allocation and launch (host time per decode step)."""
    torch = pytest.importorskip("torch")
    from flashgen import kvcache
    from flashgen.runtime import op_args
    from flashgen.torch_support import feature_args_key

    q = torch.zeros(2, 1, 8, 64, dtype=torch.bfloat16)
    k = torch.zeros(2, 64, 2, 64, dtype=torch.bfloat16)
    lens = torch.full((2,), 64, dtype=torch.int32)
    launched = []
    entry = kvcache._Entry(lambda ptrs, stream: launched.append(ptrs), (2, 1, 8, 64), (2, 8, 1),
                           (0, 0, 2), torch.device("cpu"), torch.bfloat16)  # fmt: skip
    feats = op_args.op_args(kvcache.feature_values.from_keywords({"softcap": 5.0}, "t"))
    tensors = ((*kvcache._array_key(x), x.data_ptr() & 15) for x in (q, k, k))
    key = (*tensors, kvcache._array_key(lens), None, True, None, 0, None, feature_args_key(feats))
    monkeypatch.setattr(kvcache, "_entries", {key: entry})
    monkeypatch.setattr(kvcache, "raw_stream", lambda dev: 0)
    monkeypatch.setattr(kvcache, "_counter_buffer", lambda dev, stream, n: torch.zeros(n))

    def no_decoding(args):
        raise AssertionError("a remembered call decoded its feature values")

    monkeypatch.setattr(op_args, "values_of", no_decoding)
    kvcache._run(q, k, k, lens, None, None, True, None, 0, None, *feats)
    assert len(launched) == 1 and launched[0][:3] == (q.data_ptr(), k.data_ptr(), k.data_ptr())


def test_the_merge_counters_are_one_buffer_per_stream_grown_and_fresh_under_capture(monkeypatch):
    """flashgen.kvcache's merge counters: eager calls on one (device, stream) share a buffer of
    at least 1024 words (made once; a call needing more gets a larger one), other streams get
    their own, and a call under CUDA-graph capture gets fresh zeros -- a buffer first made in a
    capture would hold zeros only once the graph ran, and a replay on another stream would share
    it with eager calls."""
    torch = pytest.importorskip("torch")
    from flashgen import kvcache

    made: list[tuple[int, ...]] = []

    def zeros(n: int, dtype: object, device: str) -> object:
        assert dtype is torch.int32 and device == "cuda:0"
        made.append((n,))
        return torch.empty(n, dtype=torch.int32)

    capturing = [False]
    monkeypatch.setattr(kvcache, "_counters", {})
    monkeypatch.setattr(kvcache.torch, "zeros", zeros)
    monkeypatch.setattr(kvcache.torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    a = kvcache._counter_buffer(0, 0x10, 40)
    assert kvcache._counter_buffer(0, 0x10, 1024) is a and made == [(1024,)]
    b = kvcache._counter_buffer(0, 0x20, 8)
    assert b is not a and len(made) == 2
    capturing[0] = True
    g1, g2 = kvcache._counter_buffer(0, 0x10, 40), kvcache._counter_buffer(0, 0x10, 40)
    assert g1 is not g2 and a is not g1 and a is not g2 and made[2:] == [(40,), (40,)]
    capturing[0] = False
    big = kvcache._counter_buffer(0, 0x10, 5000)
    assert big is not a and made[-1] == (5000,) and kvcache._counter_buffer(0, 0x10, 9) is big
