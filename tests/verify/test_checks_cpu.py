"""The check/fuzz machinery on the CPU: problem generation, strategies, the property runner
(driven by a NumPy emulation of the kernels in place of the GPU), parallel compilation, and
the runtime's pure parts (arch choice, NaN patterns, the ABI format)."""

from __future__ import annotations

import math
import re
from random import Random

import numpy as np
import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from flashgen.generator.render import render
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import gpu as runtime
from flashgen.runtime.gpu import GpuUnavailable
from flashgen.verify import checks, strategies
from flashgen.verify.checks import Case, CheckResult, make_inputs, property_check, run_case
from flashgen.verify.oracle import max_abs_logit

SIMT32 = KernelSpec(family="simt", d=32, br=16, bc=32, dtype="fp32", causal=True)
SIMT_BF16 = KernelSpec(family="simt", d=64, br=32, bc=16, dtype="bf16", causal=False)
MMA_FP16 = KernelSpec(
    family="mma", d=64, br=64, bc=32, dtype="fp16", causal=True, warps=4, stages=2
)
LOG2E = 1.4426950408889634
# find()'s phases without shrinking, for the tests that only ask whether a strategy reaches a
# kind of case: shrinking the first case found to a minimal one is most of find()'s time
# (seconds per call) and asserts nothing more.
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)


def emulate(spec, q, k, v, scale, *, ignore_mask=False, skip_last_row=False):
    """The kernels' algorithm in NumPy float32: K/V tiles of bc keys, online softmax in base 2,
    P rounded to the storage dtype before P·V for tensor-core families, O normalised once."""
    f32 = np.float32
    b, h, tq, d = q.shape
    tk = k.shape[2]
    group = h // k.shape[1]  # grouped-query attention: query head i reads K/V head i // group
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    store = np.dtype(spec.dtype_info.numpy)
    qf, kf, vf = (x.astype(f32) for x in (q, k, v))
    m = np.full((b, h, tq, 1), -np.inf, f32)
    l = np.zeros((b, h, tq, 1), f32)  # noqa: E741
    acc = np.zeros((b, h, tq, d), f32)
    rows = np.arange(tq)[:, None]
    for kv0 in range(0, tk, spec.bc):
        kt, vt = kf[:, :, kv0 : kv0 + spec.bc], vf[:, :, kv0 : kv0 + spec.bc]
        s = np.matmul(qf, kt.transpose(0, 1, 3, 2)) * f32(scale * LOG2E)
        if spec.causal and not ignore_mask:
            keys = kv0 + np.arange(kt.shape[2])[None, :]
            s = np.where(keys <= rows + tk - tq, s, f32(-np.inf))
        m_new = np.maximum(m, s.max(-1, keepdims=True))
        m_use = np.where(np.isneginf(m_new), f32(0), m_new)
        alpha, p = np.exp2(m - m_use), np.exp2(s - m_use)
        l = l * alpha + p.sum(-1, keepdims=True)  # noqa: E741
        if spec.dtype_info.tensor_core and spec.family == "mma":
            p = p.astype(store).astype(f32)
        acc = acc * alpha + np.matmul(p, vt)
        m = m_new
    seen = l > 0
    o = np.where(seen, acc / np.where(seen, l, 1), 0).astype(store)
    lse = np.where(seen, (m + np.log2(np.where(seen, l, 1))) * f32(math.log(2)), -np.inf)
    lse = lse[..., 0].astype(f32)
    if skip_last_row:  # an unwritten row stays as the NaN poison
        o[:, :, -1], lse[:, :, -1] = np.nan, np.nan
    return o, lse


# ---- problem generation --------------------------------------------------------------------


def test_inputs_are_seeded_and_stored_in_the_spec_dtype():
    case = Case(2, 3, 17, 29, None, None, seed=5)
    a, b = make_inputs(SIMT_BF16, case), make_inputs(SIMT_BF16, case)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == np.dtype(SIMT_BF16.dtype_info.numpy)
        np.testing.assert_array_equal(x.astype(np.float32), y.astype(np.float32))
    assert a[0].shape == (2, 3, 17, 64) and a[1].shape == a[2].shape == (2, 3, 29, 64)
    other = make_inputs(SIMT_BF16, Case(2, 3, 17, 29, None, None, seed=6))
    assert not np.array_equal(a[0].astype(np.float32), other[0].astype(np.float32))


@pytest.mark.parametrize("target", [0.5, 7.0, 60.0])
@pytest.mark.parametrize("scale", [None, 0.05, 1.5])
def test_inputs_reach_the_requested_logit_magnitude(target, scale):
    q, k, _ = make_inputs(MMA_FP16, Case(1, 2, 40, 70, scale, target, seed=1))
    peak = max_abs_logit(q, k, scale if scale is not None else 1 / math.sqrt(64))
    assert peak == pytest.approx(target, rel=0.02)  # off only by the rounding to fp16


def test_degenerate_problems_never_overflow_fp16():
    for seed in range(50):
        q, k, v = make_inputs(MMA_FP16, Case(1, 1, 1, 1, 0.01, 60.0, seed))
        assert np.isfinite(q).all() and np.isfinite(k).all()


# ---- strategies ----------------------------------------------------------------------------


@given(data=st.data())
def test_drawn_cases_respect_the_size_limits(data):
    spec = data.draw(st.sampled_from([SIMT32, SIMT_BF16, MMA_FP16]))
    case = data.draw(strategies.cases(spec))
    assert 1 <= case.tq <= strategies.MAX_LEN and 1 <= case.tk <= strategies.MAX_LEN
    assert 1 <= case.b <= strategies.MAX_BATCH and 1 <= case.h <= strategies.MAX_HEADS
    scores = case.b * case.h * case.tq * case.tk
    assert scores <= strategies.SCORE_BUDGET or case.b == case.h == 1
    assert case.scale is None or case.scale > 0
    assert case.logit_max is not None and 0.5 <= case.logit_max <= 60


@pytest.mark.parametrize(
    "shape",
    [
        lambda c: c.tq > c.tk,
        lambda c: c.tq < c.tk,
        lambda c: c.tq == 1,
        lambda c: c.tk % MMA_FP16.bc not in (0,) and c.tk > MMA_FP16.bc,
        lambda c: c.logit_max == 60.0 and c.scale is not None,
    ],
)
def test_strategy_reaches_every_shape_the_suite_promises(shape):
    # find()'s own default search (2000 examples; the profile's other settings), unshrunk
    found = find(
        strategies.cases(MMA_FP16), shape, settings=settings(max_examples=2000, phases=NO_SHRINK)
    )
    assert shape(found)


def test_pinned_cases_cover_single_tokens_empty_rows_and_ragged_tiles():
    pins = strategies.pinned_cases(MMA_FP16)
    assert any(c.tq == 1 and c.tk == 1 for c in pins)
    assert any(c.tq == 1 and c.tk == 127 for c in pins)  # a prime number of keys
    assert any(c.tq > c.tk for c in pins)  # under causal: rows that see no key
    assert any(c.tq < c.tk for c in pins)
    assert any(c.tq == c.tk == 3 * MMA_FP16.br + 1 for c in pins)
    assert all(c.logit_max == 60.0 for c in pins if c.layouts == ("bhtd",) * 4)
    assert any(c.layouts[1] != c.layouts[2] != "bhtd" != c.layouts[3] and c.v_dof for c in pins)


def test_tile_lengths_are_multiples_and_neighbours_within_the_limit():
    lens = strategies.tile_lengths(MMA_FP16, max_len=200)
    assert {63, 64, 65, 127, 128, 129, 193, 31, 33} <= set(lens)
    assert max(lens) <= 200 and min(lens) >= 1


def test_gpu_example_count_comes_from_the_env_or_the_profile(monkeypatch):
    monkeypatch.delenv(strategies.EXAMPLES_ENV, raising=False)
    assert strategies.gpu_examples("ci") == strategies.GPU_EXAMPLES["ci"]
    monkeypatch.setenv(strategies.EXAMPLES_ENV, "3")
    assert strategies.gpu_examples("thorough") == 3
    monkeypatch.setenv(strategies.EXAMPLES_ENV, "many")
    with pytest.raises(ValueError, match="FLASHGEN_GPU_EXAMPLES='many': must be a whole number"):
        strategies.gpu_examples("ci")


def test_unknown_profiles_are_refused():
    with pytest.raises(
        ValueError,
        match=r"profile='fast': unknown Hypothesis profile; choose one of dev, ci, thorough",
    ):
        strategies.settings_for("fast")


def test_profiles_are_registered_on_first_use():
    assert strategies.settings_for("ci").derandomize
    assert strategies.settings_for("thorough").deadline is None


def test_every_profile_in_force_is_the_projects_even_where_hypothesis_has_one_of_that_name():
    # Hypothesis registers a `ci` profile of its own; it must not stand in for ours
    from hypothesis import settings

    settings.register_profile("ci", max_examples=3)  # as a foreign registration would
    strategies.register_profiles()
    for name, values in strategies.PROFILES.items():
        got = strategies.settings_for(name)
        for key, value in values.items():
            want = tuple(value) if isinstance(value, list) else value  # settings keep tuples
            assert getattr(got, key) == want, (name, key)


# ---- the correctness rule against an emulated kernel ----------------------------------------


@pytest.mark.parametrize("spec", [SIMT32, SIMT_BF16, MMA_FP16], ids=lambda s: s.name)
def test_the_kernel_algorithm_passes_the_rule_at_logits_of_60(spec):
    # If this fails the rule is stricter than fp32 arithmetic allows, whatever the GPU does.
    for seed in range(4):
        case = Case(2, 2, 131 + seed * 50, 263 - seed * 40, None, 60.0, seed)
        result = run_case(spec, case, emulate)
        assert result.passed, result.describe()
        assert result.ratio < 0.8


def test_run_case_reports_sizes_scale_and_seed():
    result = checks.check_variant(SIMT32, b=1, h=2, tq=7, tk=5, seed=9, scale=0.3, execute=emulate)
    assert (result.b, result.h, result.tq, result.tk, result.seed) == (1, 2, 7, 5, 9)
    assert result.scale == 0.3 and result.passed and not result.has_nan
    assert result.describe().startswith("pass: flash_fwd_simt_d32")


def test_an_unwritten_row_fails_with_nan():
    result = run_case(
        SIMT_BF16, Case(1, 1, 9, 9, None, 5.0, 1), lambda *a: emulate(*a, skip_last_row=True)
    )
    assert result.has_nan and not result.passed and result.ratio == math.inf
    assert "NaN in output" in result.describe()


# ---- the property runner ---------------------------------------------------------------------


def test_property_check_passes_a_correct_kernel_and_counts_examples():
    result = property_check(SIMT_BF16, examples=6, profile="ci", execute=emulate)
    assert result.passed and result.failure is None
    pinned = len(strategies.pinned_cases(SIMT_BF16))
    assert result.examples >= 6 + pinned - 1  # Hypothesis may skip a duplicate draw
    assert 0 < result.worst_ratio <= 1


def test_property_check_finds_a_missing_causal_mask_and_names_the_problem():
    def no_mask(*args):
        return emulate(*args, ignore_mask=True)

    result = property_check(SIMT32, examples=10, profile="ci", execute=no_mask, shrink=False)
    assert not result.passed and result.worst_ratio > 1
    assert result.failure is not None
    assert "FAIL: flash_fwd_simt_d32" in result.failure
    assert re.search(
        r"(Falsifying|Failing explicit|Falsifying explicit) example: prop\(\s*case=Case\(",
        result.failure,
    )


def test_a_bug_in_every_problem_fails_on_the_first_pinned_example():
    def last_row_unwritten(*args):
        return emulate(*args, skip_last_row=True)

    result = property_check(SIMT_BF16, examples=5, profile="ci", execute=last_row_unwritten)
    assert not result.passed and result.failure is not None
    assert re.search(r"Case\(b=1,\s*h=1,\s*tq=1,\s*tk=1,", result.failure), result.failure


def test_property_check_shrinks_a_failure_to_a_minimal_problem():
    def wrong_second_head_on_long_queries(spec, q, k, v, scale):
        o, lse = emulate(spec, q, k, v, scale)
        if q.shape[1] >= 2 and q.shape[2] >= 50:  # no pinned example has both
            o[:, 1] += 1
        return o, lse

    result = property_check(
        SIMT_BF16, examples=40, profile="ci", execute=wrong_second_head_on_long_queries
    )
    assert not result.passed and result.failure is not None
    shrunk = re.search(r"Case\(b=1,\s*h=2,\s*tq=(\d+),\s*tk=1,\s*scale=None", result.failure)
    assert shrunk and 50 <= int(shrunk[1]) <= 64, result.failure  # 50, or a special length


def test_derandomized_runs_are_repeatable_and_differ_between_variants():
    seen: dict[str, list[tuple[int, int]]] = {}

    def record(spec, q, k, v, scale):
        seen.setdefault(spec.name, []).append((q.shape[2], k.shape[2]))
        return emulate(spec, q, k, v, scale)

    other = KernelSpec(family="simt", d=64, br=32, bc=32, dtype="bf16")
    property_check(SIMT_BF16, examples=5, profile="ci", execute=record)
    first = seen.pop(SIMT_BF16.name)
    property_check(SIMT_BF16, examples=5, profile="ci", execute=record)
    property_check(other, examples=5, profile="ci", execute=record)
    assert seen[SIMT_BF16.name] == first
    pinned = len(strategies.pinned_cases(other))
    assert seen[other.name][pinned:] != first[pinned:]


def test_failure_text_keeps_notes_and_every_exception_of_a_group():
    err = AssertionError("FAIL: x")
    err.__notes__ = ["Falsifying example: prop(case=Case(b=1))"]  # add_note() is 3.11+
    text = checks.failure_text(err)
    assert text == "AssertionError: FAIL: x\nFalsifying example: prop(case=Case(b=1))"

    class Group(Exception):  # what an ExceptionGroup exposes (a builtin only from 3.11)
        exceptions = (ValueError("a"), AssertionError("b"))

    assert checks.failure_text(Group("two bugs")) == "ValueError: a\nAssertionError: b"


def test_check_result_ratio_is_the_worse_of_o_and_lse():
    r = CheckResult(SIMT32, 1, 1, 1, 1, 1.0, 4.0, 3e-5, 1e-4, False, True, 0.1, 0)
    assert r.ratio == pytest.approx(0.3)
    assert (
        CheckResult(SIMT32, 1, 1, 1, 1, 0.0, 4.0, 0.0, 1e-4, True, False, 0.1, 0).ratio == math.inf
    )


# ---- compilation and the GPU boundary -----------------------------------------------------


def test_compile_all_reports_failures_per_variant_without_stopping(monkeypatch):
    calls = []

    def fake_compile(spec, arch):
        calls.append((spec.name, arch))
        if spec == SIMT32:
            raise RuntimeError("nvcc failed")
        return f"cubin-{spec.name}"

    monkeypatch.setattr(checks, "compile_kernel", fake_compile)
    out = checks.compile_all([SIMT32, SIMT_BF16, MMA_FP16], arch="sm_90", workers=2)
    assert isinstance(out[SIMT32], RuntimeError)
    assert out[SIMT_BF16] == f"cubin-{SIMT_BF16.name}" and out[MMA_FP16] == f"cubin-{MMA_FP16.name}"
    assert sorted(calls) == sorted((s.name, "sm_90") for s in (SIMT32, SIMT_BF16, MMA_FP16))


def test_compile_all_compiles_real_variants_in_parallel(nvcc_required, tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(tmp_path))
    specs = [SIMT32, SIMT_BF16]
    out = checks.compile_all(specs, arch="sm_90", workers=2)
    for spec in specs:
        built = out[spec]
        assert not isinstance(built, Exception), built
        assert built.arch == "sm_90" and built.cubin[:4] == b"\x7fELF"


def test_without_pycuda_the_gpu_is_one_clear_error(no_pycuda):
    with pytest.raises(
        GpuUnavailable, match=r"PyCUDA cannot be imported .*pip install 'flashgen\[gpu\]'"
    ):
        runtime.gpu()
    assert "PyCUDA cannot be imported" in (runtime.gpu_status() or "")


def test_check_and_fuzz_raise_gpu_unavailable_without_pycuda(no_pycuda):
    with pytest.raises(GpuUnavailable):
        checks.check_variant(SIMT32, b=1, h=1, tq=3, tk=3, seed=0)
    with pytest.raises(GpuUnavailable):
        checks.run_fuzz("simt", 2, "ci")
    with pytest.raises(GpuUnavailable):
        property_check(SIMT32, examples=2, profile="ci")
    assert checks.GpuUnavailable is GpuUnavailable


@pytest.mark.parametrize(
    "device,arch",
    [("sm_90", "sm_90"), ("sm_80", "sm_80"), ("sm_86", "sm_86"), ("sm_89", "sm_89")],
)
def test_kernels_are_compiled_for_an_arch_the_device_runs(monkeypatch, device, arch):
    monkeypatch.delenv("FLASHGEN_ARCH", raising=False)
    monkeypatch.setattr(runtime, "device_arch", lambda: device)
    assert runtime.kernel_arch(SIMT32) == arch


def test_a_device_newer_than_every_family_arch_compiles_for_itself(monkeypatch):
    monkeypatch.delenv("FLASHGEN_ARCH", raising=False)
    monkeypatch.setattr(runtime, "device_arch", lambda: "sm_120")
    assert runtime.kernel_arch(SIMT32) == "sm_120"


def test_flashgen_arch_overrides_the_device(monkeypatch):
    monkeypatch.setenv("FLASHGEN_ARCH", "sm_90a")
    assert runtime.kernel_arch(SIMT32) == "sm_90a"


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_poison_bit_patterns_are_nan_in_their_dtype(dtype):
    bits, width = runtime.NAN_BITS[dtype]
    info = KernelSpec(family="simt", dtype=dtype).dtype_info
    raw = np.array([bits], dtype=np.uint32 if width == 4 else np.uint16)
    assert width == info.itemsize
    assert np.isnan(raw.view(np.dtype(info.numpy)).astype(np.float32)).all()
    assert runtime.NAN_BITS["fp32"][1] == 4  # lse is float32


@pytest.mark.parametrize("family", ["simt", "mma"])
def test_the_launch_format_matches_the_rendered_kernel_signature(family):
    # the packing (from generator/abi.py) against what the template really declares
    spec = KernelSpec(family=family, d=64, dtype="bf16" if family == "mma" else "fp32")
    m = re.search(rf"\b{spec.name}\(([^{{]*)\)", render(spec).source)
    assert m, spec.name
    sig = re.sub(r"//[^\n]*", "", m.group(1))
    code = {"*": "P", "long long": "q", "int": "i", "float": "f"}
    params = [p.strip() for p in sig.split(",")]
    codes = "".join(next(c for t, c in code.items() if t in p) for p in params)
    assert codes == runtime.ABI_FORMAT and len(params) == 25


# ---- per-tensor layouts and V distributions (issue 9) -----------------------------------------
@pytest.mark.parametrize("layout", checks.LAYOUTS)
def test_every_layout_holds_the_tensor_and_d_stays_contiguous(layout):
    x = np.arange(2 * 3 * 5 * 16, dtype=np.float32).reshape(2, 3, 5, 16)
    backing = checks.layout_backing(x, layout)
    view = checks.layout_view(backing, layout, 16)
    assert backing.flags.c_contiguous and np.shares_memory(view, backing)
    assert np.array_equal(view, x) and view.strides[3] == 4
    if layout == "pad":
        assert np.isnan(backing[..., 16:]).all()


def test_the_layouts_give_four_different_stride_patterns():
    x = np.zeros((2, 3, 5, 16), np.float16)
    strides = {
        lay: checks.layout_view(checks.layout_backing(x, lay), lay, 16).strides
        for lay in checks.LAYOUTS
    }
    assert len(set(strides.values())) == len(checks.LAYOUTS)


def test_a_kernel_reading_v_with_ks_strides_fails_the_pinned_layout_case():
    spec = SIMT_BF16
    case = strategies.pinned_cases(spec)[-1]
    _, lk, lv, lo = case.layouts
    assert lk != lv and lo != "bhtd"
    q, k, v = make_inputs(spec, case)
    k_view = checks.layout_view(checks.layout_backing(k, lk), lk, spec.d)
    v_buf = checks.layout_backing(v, lv, fill=0.0)
    # the bug: V's memory stepped through with K's strides (in bounds: V's buffer is larger)
    v_wrong = np.lib.stride_tricks.as_strided(v_buf, v.shape, k_view.strides)
    assert v_buf.nbytes >= k_view.nbytes and not np.array_equal(v_wrong, v)
    right = run_case(spec, case, execute=emulate)
    wrong = run_case(spec, case, execute=lambda s, q_, k_, v_, sc: emulate(s, q_, k_, v_wrong, sc))
    assert right.passed and not wrong.passed


def test_cases_draw_distinct_layouts_per_tensor_and_off_centre_heavy_tailed_v():
    spec = SIMT_BF16
    # about 2% of draws qualify: search wide, with our own random source, so the outcome does
    # not hang on the active profile's derandomized seed (CI's Hypothesis found none in 2000)
    found = find(
        strategies.cases(spec),
        lambda c: len(set(c.layouts)) == 4 and c.v_mean != 0 and c.v_dof is not None,
        settings=settings(max_examples=20000, database=None, derandomize=False, phases=NO_SHRINK),
        random=Random(20261130),
    )
    assert found.layouts[1] != found.layouts[2]


def test_v_can_be_off_centre_and_heavy_tailed():
    spec = SIMT_BF16
    base = Case(1, 1, 4, 4096, None, None, 3)
    _, _, v0 = make_inputs(spec, base)
    _, _, v1 = make_inputs(spec, Case(1, 1, 4, 4096, None, None, 3, v_mean=30.0, v_dof=2.5))
    v0, v1 = v0.astype(np.float64), v1.astype(np.float64)
    assert abs(v0.mean()) < 0.05 and abs(v1.mean() - 30.0) < 0.5
    # Student-t(2.5) has far heavier tails than a normal: many more entries beyond 5 sigma
    assert (np.abs(v1 - 30.0) > 5).sum() > 100 * max(1, (np.abs(v0) > 5).sum())
