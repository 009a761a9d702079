"""The row oracle, the non-finite rule, and the GPU robustness harness, checked on the CPU.

`rowref.row_reference` must be `oracle.reference` restricted to some rows (keys given in full
or as one repeating period); `judge` must pass the oracle's own answer and fail any change of
its NaN/inf pattern or any error beyond the bound. The GPU robustness tests
(tests/gpu/test_robustness.py) are run here with the oracle standing in for the kernel and a
NumPy array standing in for device memory: every case's premise holds, a perfect kernel
passes, and a kernel that gets the last rows of a huge tensor wrong fails.
"""

from __future__ import annotations

import math
from typing import Any

import gpu.test_robustness as robust  # tests/ is on sys.path (pytest's rootdir import)
import ml_dtypes
import numpy as np
import pytest

from flashgen.generator.spec import KernelSpec
from flashgen.verify.oracle import reference, rounded_reference
from flashgen.verify.rowref import (
    fill_periodic,
    judge,
    key_counts,
    nonfinite_mismatch,
    read_rows,
    rounded_row_reference,
    row_reference,
    score_slack,
    sum_slack,
    visible_keys,
)

BF16 = ml_dtypes.bfloat16


def rand(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


# ---- row_reference against oracle.reference ---------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("tq", "tk"), [(37, 53), (53, 37), (1, 1), (9, 1)])
def test_row_reference_is_the_oracle_on_those_rows(causal: bool, tq: int, tk: int) -> None:
    d = 16
    q, k, v = rand((1, 1, tq, d), 1), rand((1, 1, tk, d), 2), rand((1, 1, tk, d), 3)
    o64, lse64 = reference(q, k, v, causal=causal, scale=0.3)
    rows = np.unique(np.array([0, tq // 2, tq - 1]))
    o, lse = row_reference(
        q[0, 0, rows], rows, k[0, 0], v[0, 0], tq=tq, tk=tk, causal=causal, scale=0.3
    )
    np.testing.assert_allclose(o, o64[0, 0, rows], rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(lse64[0, 0, rows]))
    fin = np.isfinite(lse)
    np.testing.assert_allclose(lse[fin], lse64[0, 0, rows][fin], rtol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_periodic_keys_equal_the_tiled_tensor(causal: bool) -> None:
    d, period, tq, tk = 8, 7, 11, 30
    kb, vb = rand((period, d), 4), rand((period, d), 5)
    q = rand((1, 1, tq, d), 6)
    k = np.resize(kb, (tk, d))[None, None]  # key t is kb[t % period]
    v = np.resize(vb, (tk, d))[None, None]
    o64, lse64 = reference(q, k, v, causal=causal, scale=0.5)
    rows = np.arange(tq)
    o, lse = row_reference(q[0, 0], rows, kb, vb, tq=tq, tk=tk, causal=causal, scale=0.5)
    np.testing.assert_allclose(o, o64[0, 0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, lse64[0, 0], rtol=1e-12)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_rounded_row_reference_is_the_rounded_oracle(dtype: str) -> None:
    d, tq, tk = 32, 20, 45
    q, k, v = rand((1, 1, tq, d), 7), rand((1, 1, tk, d), 8), rand((1, 1, tk, d), 9)
    want = rounded_reference(q, k, v, causal=True, scale=0.2, dtype=dtype)[0, 0]
    rows = np.arange(tq)
    got = rounded_row_reference(
        q[0, 0], rows, k[0, 0], v[0, 0], tq=tq, tk=tk, causal=True, scale=0.2, dtype=dtype
    )
    # float32 sums in another order may round P across a boundary: rare, one ulp of P
    assert (got == want).mean() > 0.95
    np.testing.assert_allclose(got, want, atol=2.0**-7 * np.abs(want).max())


def test_visible_keys_and_key_counts() -> None:
    assert visible_keys([0, 4, 9], tq=10, tk=6, causal=True).tolist() == [0, 1, 6]
    assert visible_keys([0, 9], tq=10, tk=6, causal=False).tolist() == [6, 6]
    counts = key_counts([0, 9], 4, tq=10, tk=10, causal=True)
    assert counts.tolist() == [[1, 0, 0, 0], [3, 3, 2, 2]]  # row 9 sees keys 0..9 of period 4


def test_row_reference_rejects_bad_rows_and_shapes() -> None:
    q, k = rand((3, 8), 1), rand((5, 8), 2)
    with pytest.raises(ValueError, match=r"rows 0\.\.7: must lie in \[0, tq=5\)"):
        row_reference(q, [0, 1, 7], k, k, tq=5, tk=5, causal=False, scale=1.0)
    with pytest.raises(ValueError, match=r"k has 5 rows for tk=4"):
        row_reference(q, [0, 1, 2], k, k, tq=5, tk=4, causal=False, scale=1.0)
    with pytest.raises(ValueError, match=r"need q_rows \(n, d\)"):
        row_reference(q, [0, 1, 2], k[:, :4], k[:, :4], tq=5, tk=5, causal=False, scale=1.0)


# ---- the oracle's non-finite semantics --------------------------------------------------------
def _oracle(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = False) -> Any:
    with np.errstate(all="ignore"):
        return reference(q, k, v, causal=causal, scale=0.25)


def test_a_nan_query_makes_only_its_row_nan() -> None:
    q, k, v = rand((1, 2, 6, 4), 1), rand((1, 2, 9, 4), 2), rand((1, 2, 9, 4), 3)
    q[0, 1, 2, 0] = np.nan
    o, lse = _oracle(q, k, v)
    assert np.isnan(o[0, 1, 2]).all() and np.isnan(lse[0, 1, 2])
    assert np.isnan(o).sum() == 4 and np.isnan(lse).sum() == 1


def test_a_nan_key_reaches_only_the_rows_that_see_it() -> None:
    q, k, v = rand((1, 1, 6, 4), 1), rand((1, 1, 6, 4), 2), rand((1, 1, 6, 4), 3)
    k[0, 0, 3, 1] = np.nan
    o, lse = _oracle(q, k, v, causal=True)
    assert np.isnan(lse[0, 0]).tolist() == [False, False, False, True, True, True]


def test_minus_inf_keys_get_zero_weight_or_make_nan_with_mixed_signs() -> None:
    q, k, v = rand((1, 1, 5, 4), 1), rand((1, 1, 7, 4), 2), rand((1, 1, 7, 4), 3)
    qpos = np.abs(q) + 0.25
    k2 = k.copy()
    k2[0, 0, 4] = -np.inf
    o, lse = _oracle(qpos, k2, v)
    drop = [0, 1, 2, 3, 5, 6]
    o_without, lse_without = _oracle(qpos, k[:, :, drop], v[:, :, drop])
    np.testing.assert_allclose(o, o_without, rtol=1e-12)
    np.testing.assert_allclose(lse, lse_without, rtol=1e-12)
    q[..., 0], q[..., 1] = np.abs(q[..., 0]), -np.abs(q[..., 1])  # both signs in every row
    o, lse = _oracle(q, k2, v)  # q . k = inf - inf = NaN
    assert np.isnan(o).all() and np.isnan(lse).all()
    k2[0, 0] = -np.inf  # every logit -inf: like a row that sees no key
    o, lse = _oracle(qpos, k2, v)
    assert (o == 0).all() and np.isneginf(lse).all()


def test_inf_in_v_makes_its_column_inf() -> None:
    q, k, v = rand((1, 1, 5, 4), 1), rand((1, 1, 7, 4), 2), rand((1, 1, 7, 4), 3)
    v[0, 0, 0, 2] = np.inf
    o, lse = _oracle(q, k, v)
    assert np.isposinf(o[0, 0, :, 2]).all() and np.isfinite(np.delete(o, 2, axis=-1)).all()
    assert np.isfinite(lse).all()


# ---- judge ---------------------------------------------------------------------------------
def _outputs(dtype: str) -> tuple[Any, ...]:
    q, k, v = rand((1, 2, 20, 16), 1), rand((1, 2, 30, 16), 2), rand((1, 2, 30, 16), 3)
    q[0, 0, 3, 0] = np.nan
    v[0, 1, 0, 5] = -np.inf
    with np.errstate(all="ignore"):
        o64, lse64 = reference(q, k, v, causal=True, scale=0.25)
        o_ref = rounded_reference(q, k, v, causal=True, scale=0.25, dtype=dtype)
    store = {"bf16": BF16, "fp16": np.float16, "fp32": np.float32}[dtype]
    return o64.astype(store), lse64.astype(np.float32), o64, lse64, o_ref


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_judge_passes_the_oracle_rounded_to_the_storage_type(dtype: str) -> None:
    o, lse, o64, lse64, o_ref = _outputs(dtype)
    verdict = judge(o, lse, o64, lse64, o_ref, dtype=dtype)
    assert verdict.passed, verdict.describe()


@pytest.mark.parametrize(
    ("where", "value", "kind"),
    [
        ((0, 1, 7, 2), np.nan, "NaN"),  # a NaN where the oracle is finite
        ((0, 0, 3, 0), 0.0, "NaN"),  # a finite value where the oracle is NaN
        ((0, 1, 9, 5), np.inf, "+inf"),  # the oracle says -inf
    ],
)
def test_judge_fails_a_different_non_finite_pattern(
    where: tuple[int, ...], value: float, kind: str
) -> None:
    o, lse, o64, lse64, o_ref = _outputs("bf16")
    o = o.astype(np.float64)
    o[where] = value
    verdict = judge(o, lse, o64, lse64, o_ref, dtype="bf16")
    assert not verdict.passed
    assert verdict.mismatch is not None and f"differ in {kind}" in verdict.mismatch
    assert str(where) in verdict.mismatch


def test_judge_fails_a_finite_error_beyond_the_bound_and_slack_widens_it() -> None:
    o, lse, o64, lse64, o_ref = _outputs("bf16")
    lse = lse.astype(np.float64)
    lse[0, 1, 4] += 3e-4
    assert not judge(o, lse, o64, lse64, o_ref, dtype="bf16").passed
    assert judge(o, lse, o64, lse64, o_ref, dtype="bf16", lse_slack=3e-4).passed
    o = o.astype(np.float64)
    o[0, 1, 4, 1] += 0.05
    verdict = judge(o, lse, o64, lse64, o_ref, dtype="bf16", lse_slack=3e-4)
    assert not verdict.passed and verdict.o_err > verdict.o_bound
    assert judge(o, lse, o64, lse64, o_ref, dtype="bf16", o_slack=0.05, lse_slack=3e-4).passed


def test_judge_fp32_is_relative() -> None:
    o, lse, o64, lse64, _ = _outputs("fp32")
    assert not judge(o64 * (1 + 3e-5), lse, o64, lse64, None, dtype="fp32").passed
    assert judge(o64 * (1 + 3e-6), lse, o64, lse64, None, dtype="fp32").passed


def test_judge_rejects_bad_arguments() -> None:
    o, lse, o64, lse64, o_ref = _outputs("bf16")
    with pytest.raises(ValueError, match="needs o_ref"):
        judge(o, lse, o64, lse64, None, dtype="bf16")
    with pytest.raises(ValueError, match=r"expected o\(1, 2, 20, 16\)"):
        judge(o[:, :1], lse, o64, lse64, o_ref, dtype="bf16")
    with pytest.raises(ValueError, match="unknown dtype"):
        judge(o, lse, o64, lse64, o_ref, dtype="fp8")


def test_nonfinite_mismatch_is_none_for_equal_patterns() -> None:
    a = np.array([1.0, np.nan, np.inf, -np.inf])
    assert nonfinite_mismatch("x", a, a * 2) is None
    assert "differ in +inf, first at (2,)" in (nonfinite_mismatch("x", a, -a) or "")


def test_slacks_grow_with_the_logits_and_the_row_length() -> None:
    q, k = np.ones((1, 1, 2, 64)), np.ones((1, 1, 3, 64))  # scale * sum|q k| = 64 * scale
    assert score_slack(q, k, 1.0) == pytest.approx(16 * 8 * 2.0**-24 * 64)
    assert score_slack(q, k, 1.0) < 1e-3 < score_slack(q, k, 100.0) < score_slack(q, k, 1e3)
    assert sum_slack(1) < sum_slack(4096) < 1e-4 < sum_slack(4_000_000) < 2e-3


# ---- the GPU robustness harness, with the oracle as the kernel -----------------------------------
def _oracle_kernel(spec: KernelSpec, q: Any, k: Any, v: Any, scale: float) -> tuple[Any, Any]:
    """A perfect kernel: the float64 oracle rounded to the storage type (LSE to fp32)."""
    with np.errstate(all="ignore"):
        o64, lse64 = reference(q, k, v, causal=spec.causal, scale=scale)
    return o64.astype(q.dtype), lse64.astype(np.float32)


@pytest.mark.parametrize("case", robust.CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("spec", robust.SPECS, ids=lambda s: s.name)
def test_every_robustness_case_holds_its_premise_and_passes_a_perfect_kernel(
    spec: KernelSpec, case: Any
) -> None:
    prob = case.build(spec)
    assert prob.q.dtype == np.dtype(spec.dtype_info.numpy)
    o, lse = _oracle_kernel(spec, prob.q, prob.k, prob.v, prob.scale)
    verdict = robust.evaluate(spec, case, prob, o, lse)  # also asserts the case's premise
    assert verdict.passed, verdict.describe()


@pytest.mark.parametrize("spec", robust.SPECS, ids=lambda s: s.name)
def test_robustness_cases_fail_a_kernel_that_zeroes_nan_rows(spec: KernelSpec) -> None:
    case = next(c for c in robust.CASES if c.name == "nan-in-one-q-row")
    prob = case.build(spec)
    o, lse = _oracle_kernel(spec, prob.q, prob.k, prob.v, prob.scale)
    o, lse = np.nan_to_num(o.astype(np.float64)), np.nan_to_num(lse)  # a kernel hiding NaN
    assert not robust.evaluate(spec, case, prob, o, lse).passed


class FakeDevice:
    """Device memory as one NumPy byte array: enough of PyCUDA for the huge-tensor harness."""

    def __init__(self) -> None:
        self.mem = np.zeros(0, np.uint8)
        self.drv = self
        self.Context = self  # drv.Context.synchronize()

    def synchronize(self) -> None:
        """Nothing is asynchronous here."""

    def alloc(self, shape: tuple[int, ...], dtype: Any) -> Any:
        dt = np.dtype(ml_dtypes.bfloat16 if dtype == "bf16" else dtype)
        base = (self.mem.size + 255) // 256 * 256 + 256  # never address 0
        nbytes = int(np.prod(shape)) * dt.itemsize
        self.mem = np.concatenate([self.mem, np.zeros(base + nbytes - self.mem.size, np.uint8)])
        return _FakeArray(tuple(shape), dt, base)

    def memcpy_htod(self, dst: int, src: np.ndarray) -> None:
        self.mem[int(dst) : int(dst) + src.size] = src

    def memcpy_dtod(self, dst: int, src: int, n: int) -> None:
        self.mem[dst : dst + n] = self.mem[src : src + n].copy()

    def memcpy_dtoh(self, dst: np.ndarray, src: int) -> None:
        dst[:] = self.mem[src : src + dst.size]

    def view(self, a: Any) -> np.ndarray:
        n = int(np.prod(a.shape)) * a.dtype.itemsize
        return self.mem[a.gpudata : a.gpudata + n].view(a.dtype).reshape(a.shape)


class _FakeArray:
    def __init__(self, shape: tuple[int, ...], dtype: np.dtype[Any], ptr: int) -> None:
        self.shape, self.dtype, self.gpudata = shape, dtype, ptr
        self.size = int(np.prod(shape))


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> FakeDevice:
    """runtime.gpu/empty/launch on a FakeDevice; launch runs the oracle (a perfect kernel)."""
    from flashgen.runtime import gpu as runtime

    dev = FakeDevice()

    def launch(spec: KernelSpec, q: Any, k: Any, v: Any, o: Any, lse: Any, **kw: Any) -> None:
        o_host, lse_host = _oracle_kernel(spec, dev.view(q), dev.view(k), dev.view(v), spec.d**-0.5)
        dev.view(o)[...] = o_host
        dev.view(lse)[...] = lse_host
        dev.launched = (q.shape, kw)  # type: ignore[attr-defined]

    monkeypatch.setattr(runtime, "gpu", lambda: dev)
    monkeypatch.setattr(runtime, "empty", dev.alloc)
    monkeypatch.setattr(runtime, "launch", launch)
    monkeypatch.setattr(robust, "PERIOD", 7)  # a few tokens, so the tiling wraps many times
    return dev


def test_fill_periodic_tiles_the_block_over_a_ragged_length(fake_gpu: FakeDevice) -> None:
    block = np.arange(12, dtype=np.float32).reshape(3, 4)
    dst = fake_gpu.alloc((101,), np.float32)
    fill_periodic(dst, block)
    np.testing.assert_array_equal(fake_gpu.view(dst), np.arange(101) % 12)
    np.testing.assert_array_equal(read_rows(dst, 5, 2, 4), [[8, 9, 10, 11], [0, 1, 2, 3]])


def test_fill_periodic_stays_in_phase_when_the_copy_cap_is_not_a_block_multiple(
    fake_gpu: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On the H200 the 1 GiB copy cap was not a multiple of the block: later copies landed out
    # of phase, and the last heads of the >2^31-element tensors held other data than assumed.
    from flashgen.verify import rowref

    monkeypatch.setattr(rowref, "MAX_COPY_BYTES", 4 * 50)  # 50 floats: not a multiple of 12
    block = np.arange(12, dtype=np.float32).reshape(3, 4)
    dst = fake_gpu.alloc((1001,), np.float32)
    fill_periodic(dst, block)
    np.testing.assert_array_equal(fake_gpu.view(dst), np.arange(1001) % 12)


@pytest.mark.parametrize("causal", [False, True])
def test_huge_harness_passes_a_perfect_kernel(fake_gpu: FakeDevice, causal: bool) -> None:
    spec = KernelSpec(family="simt", d=16, br=16, bc=16, dtype="bf16", causal=causal)
    results = robust.run_huge(spec, 2, 3, 40)
    assert len(results) == 4 and fake_gpu.launched == ((2, 3, 40, 16), {"poison_outputs": True})  # type: ignore[attr-defined]
    for where, verdict in results:
        assert verdict.passed, f"{where}: {verdict.describe()}"


def test_huge_harness_catches_wrong_last_rows(
    fake_gpu: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel whose offsets wrap (here: the last head reads the first head's Q) fails."""
    from flashgen.runtime import gpu as runtime

    perfect = runtime.launch

    def wrapping(spec: KernelSpec, q: Any, k: Any, v: Any, o: Any, lse: Any, **kw: Any) -> None:
        qv = fake_gpu.view(q)
        saved = qv[-1, -1].copy()
        qv[-1, -1] = qv[0, 0]
        perfect(spec, q, k, v, o, lse, **kw)
        qv[-1, -1] = saved

    monkeypatch.setattr(runtime, "launch", wrapping)
    spec = KernelSpec(family="simt", d=16, br=16, bc=16, dtype="bf16", causal=False)
    verdicts = dict(robust.run_huge(spec, 2, 3, 40))
    failed = [where for where, v in verdicts.items() if not v.passed]
    assert failed and all(where.startswith("head 5 ") for where in failed), verdicts


def test_huge_shapes_really_exceed_2_31_elements() -> None:
    for param in robust.HUGE:
        spec, b, h, t = param.values
        assert b * h * t * spec.d > 2**31
        assert math.ceil(t / spec.br) <= 2**31 - 1 and b <= 65535 and h <= 65535


# ---- scripts/largest_t.py: its length rounding and its row check -------------------------------
def _largest_t() -> Any:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "largest_t.py"
    spec = importlib.util.spec_from_file_location("largest_t", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_largest_t_lengths_are_ragged_and_never_grow() -> None:
    lt = _largest_t()
    for n in (37, 100, 4096, 270_000_001, lt.MAX_TK):
        r = lt.ragged(n)
        assert r <= n and r % 64 == 37 and n - r < 64


@pytest.mark.parametrize("error", [0.0, 0.05])
def test_largest_t_checks_every_row_against_the_tiled_keys(error: float) -> None:
    lt = _largest_t()
    d, period, tq, tk = lt.SPEC.d, 7, 300, 1000  # 300 rows: three oracle chunks
    kb, vb = rand((period, d), 1).astype(BF16), rand((period, d), 2).astype(BF16)
    q = rand((tq, d), 3).astype(BF16)
    k, v = np.resize(kb, (tk, d))[None, None], np.resize(vb, (tk, d))[None, None]
    o64, lse64 = reference(q[None, None], k, v, causal=False, scale=d**-0.5)
    o = (o64[0, 0] + error).astype(BF16)
    check = lt.check_rows(q, kb, vb, o, lse64[0, 0].astype(np.float32), tk)
    assert check["rows"] == tq and check["passed"] is (error == 0.0), check
