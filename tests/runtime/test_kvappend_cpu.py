"""flashgen.kvappend on CPU tensors (the append is device-agnostic torch indexing): new rows land
where a per-row Python reference puts them, in contiguous and paged (shuffled, odd page size)
caches; a sequence that does not fit is not written at all and gets length -1; refused rows
clobber nothing, not even a valid sequence's new rows in the same page; the FlashAttention-
shaped front door refuses what it does not support, naming it. The one-launch append kernel
(runtime/append_kernel.py) compiles without spills, and the front door hands it the right
arguments (a stand-in launch), or appends with torch ops where it does not take the tensors."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from flashgen import kvappend  # noqa: E402
from flashgen.generator.arch import ARCHS  # noqa: E402
from flashgen.generator.compile import cubin_flags, run_nvcc  # noqa: E402
from flashgen.generator.report import parse_ptxas  # noqa: E402
from flashgen.kvappend import append_kv, flash_attn_with_kvcache  # noqa: E402
from flashgen.runtime import append_kernel  # noqa: E402


def _reference(k_cache, v_cache, k, v, lens, table):  # noqa: ANN001, ANN202
    """Row by row: each sequence that fits (every target page in range) writes its rows."""
    kc, vc = k_cache.clone(), v_cache.clone()
    out = []
    b, t_new = k.shape[:2]
    for s in range(b):
        n = int(lens[s])
        if table is None:
            cap = kc.shape[1]
            fits = n >= 0 and n + t_new <= cap
            targets = [(s, n + t) for t in range(t_new)] if fits else []
        else:
            ps, n_pages = kc.shape[1], kc.shape[0]
            cap = table.shape[1] * ps
            fits = n >= 0 and n + t_new <= cap
            targets = []
            if fits:
                for t in range(t_new):
                    page = int(table[s, (n + t) // ps])
                    if not 0 <= page < n_pages:
                        fits = False
                        break
                    targets.append((page, (n + t) % ps))
            targets = targets if fits else []
        for t, (i0, i1) in enumerate(targets):
            kc[i0, i1] = k[s, t]
            vc[i0, i1] = v[s, t]
        out.append(n + t_new if fits else -1)
    return kc, vc, torch.tensor(out, dtype=torch.int32)


def _check(k_cache, v_cache, k, v, lens, table=None) -> torch.Tensor:  # noqa: ANN001
    kc, vc, want = _reference(k_cache, v_cache, k, v, lens, table)
    got = append_kv(k_cache, v_cache, k, v, lens, table)
    assert torch.equal(got, want)
    assert torch.equal(k_cache, kc)
    assert torch.equal(v_cache, vc)
    return got


def test_contiguous_append_and_overflow() -> None:
    g = torch.Generator().manual_seed(0)
    kc = torch.randn(3, 8, 2, 16, generator=g)
    vc = torch.randn(3, 8, 2, 16, generator=g)
    k, v = torch.randn(3, 2, 2, 16, generator=g), torch.randn(3, 2, 2, 16, generator=g)
    before = kc.clone()
    got = _check(kc, vc, k, v, torch.tensor([2, 6, 7], dtype=torch.int32))
    assert got.tolist() == [4, 8, -1]
    assert torch.equal(kc[2], before[2])  # the sequence that overflows: untouched


def test_nothing_fits_changes_nothing() -> None:
    kc, vc = torch.randn(2, 4, 1, 8), torch.randn(2, 4, 1, 8)
    k, v = torch.randn(2, 3, 1, 8), torch.randn(2, 3, 1, 8)
    kb, vb = kc.clone(), vc.clone()
    got = append_kv(kc, vc, k, v, torch.tensor([2, -1], dtype=torch.int32))
    assert got.tolist() == [-1, -1]
    assert torch.equal(kc, kb) and torch.equal(vc, vb)


def test_refused_rows_do_not_clobber_a_valid_sequence() -> None:
    """Sequence 1's table names page 99 (out of range): its rows must not land on the page
    sequence 0 is writing (page 0 after a clamp would be the naive outcome)."""
    kc, vc = torch.zeros(4, 2, 1, 8), torch.zeros(4, 2, 1, 8)
    table = torch.tensor([[0, 1], [99, 2]], dtype=torch.int32)
    k = torch.stack([torch.full((1, 1, 8), 1.0), torch.full((1, 1, 8), 2.0)])
    got = _check(kc, vc, k, k.clone(), torch.tensor([0, 0], dtype=torch.int32), table)
    assert got.tolist() == [1, -1]
    assert float(kc[0, 0, 0, 0]) == 1.0 and float(kc.abs().sum()) == 8.0


@pytest.mark.parametrize("seed", range(12))
def test_random_paged_and_contiguous_appends_match_the_reference(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    b = int(torch.randint(1, 5, (1,), generator=g))
    t_new = int(torch.randint(1, 5, (1,), generator=g))
    ps = [1, 3, 4, 7][seed % 4]
    per_seq = int(torch.randint(1, 4, (1,), generator=g))
    cap = per_seq * ps
    lens = torch.randint(-1, cap + 2, (b,), generator=g, dtype=torch.int32)
    k, v = torch.randn(b, t_new, 2, 8, generator=g), torch.randn(b, t_new, 2, 8, generator=g)
    if seed % 2:  # contiguous
        _check(torch.randn(b, cap, 2, 8, generator=g), torch.randn(b, cap, 2, 8, generator=g),
               k, v, lens)  # fmt: skip
        return
    n_pages = b * per_seq
    table = torch.randperm(n_pages, generator=g).to(torch.int32).view(b, per_seq)
    if seed % 3 == 0:  # a bad page index somewhere
        table[int(torch.randint(0, b, (1,), generator=g)), -1] = n_pages + 5
    _check(torch.randn(n_pages, ps, 2, 8, generator=g), torch.randn(n_pages, ps, 2, 8, generator=g),
           k, v, lens, table)  # fmt: skip


def test_append_refuses_bad_arguments() -> None:
    kc = torch.zeros(2, 8, 1, 16)
    k = torch.zeros(2, 1, 1, 16)
    lens = torch.zeros(2, dtype=torch.int32)
    want = r"k.shape=\(2, 1, 1, 8\): must be \(B=2, T_new >= 1, 1, 16\)"
    with pytest.raises(ValueError, match=want):
        append_kv(kc, kc, torch.zeros(2, 1, 1, 8), k, lens)
    with pytest.raises(ValueError, match="appending needs an int32 \\(2,\\) tensor"):
        append_kv(kc, kc, k, k, lens.long())
    with pytest.raises(ValueError, match="pass v.to\\(cache\\)"):
        append_kv(kc, kc, k, k.double(), lens)
    with pytest.raises(ValueError, match="block_table: must be an int32"):
        append_kv(kc, kc, k, k, lens, torch.zeros(2, 1))
    with pytest.raises(ValueError, match="k_cache: list of shape None: must be a 4-D"):
        append_kv([], kc, k, k, lens)
    with pytest.raises(ValueError, match="the two caches must hold the same rows"):
        append_kv(kc, kc[:, :4], k, k, lens)


def test_front_door_refuses_what_it_does_not_support() -> None:
    q = torch.zeros(1, 1, 2, 16)
    kc = torch.zeros(1, 8, 1, 16)
    with pytest.raises(ValueError, match="rotary_cos: rotary embeddings are not applied"):
        flash_attn_with_kvcache(q, kc, kc, rotary_cos=torch.zeros(8, 8))
    with pytest.raises(ValueError, match="cache_batch_idx: not supported"):
        flash_attn_with_kvcache(q, kc, kc, cache_batch_idx=torch.zeros(1))
    with pytest.raises(ValueError, match="k and v: pass both"):
        flash_attn_with_kvcache(q, kc, kc, k=torch.zeros(1, 1, 1, 16))
    k1 = torch.zeros(1, 1, 1, 16)
    with pytest.raises(ValueError, match="q.dtype=torch.float32: must be torch.float16"):
        flash_attn_with_kvcache(q, kc, kc, k=k1, v=k1, cache_seqlens=0)
    with pytest.raises(ValueError, match="share one dtype and device"):
        flash_attn_with_kvcache(q.half(), kc, kc, k=k1, v=k1, cache_seqlens=0)
    assert not kc.any()  # refused before anything was written
    with pytest.raises(ValueError, match="cache_seqlens=None with k, v"):
        flash_attn_with_kvcache(q.half(), kc.half(), kc.half(), k=k1.half(), v=k1.half())
    # the attention call's own refusals come before the write too
    kh, ones = kc.half(), torch.ones(1, 1, 1, 16, dtype=torch.float16)
    for bad, match in (({"softmax_scale": -1.0}, r"scale=-1.0: must be in"),
                       ({"alibi_slopes": torch.ones(3)}, r"alibi_slopes"),
                       ({"softcap": float("inf")}, r"softcap=inf"),
                       ({"causal": 1}, r"causal=1: must be True or False"),
                       ({"num_splits": True}, r"num_splits=True: must be an int")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            flash_attn_with_kvcache(q.half(), kh, kh, k=ones, v=ones, cache_seqlens=0, **bad)
        assert not kh.any(), bad
    with pytest.raises(ValueError, match=r"q's head dim must be the cache's"):
        flash_attn_with_kvcache(q.half()[..., :8], kh, kh, k=ones, v=ones, cache_seqlens=0)
    assert not kh.any()


def _paged_case(seed: int = 0):  # noqa: ANN202
    g = torch.Generator().manual_seed(seed)
    kc, vc = torch.randn(6, 3, 2, 8, generator=g), torch.randn(6, 3, 2, 8, generator=g)
    k, v = torch.randn(2, 2, 2, 8, generator=g), torch.randn(2, 2, 2, 8, generator=g)
    table = torch.tensor([[5, 0, 3], [1, 4, 2]], dtype=torch.int32)
    lens = torch.tensor([2, 8], dtype=torch.int32)  # the second one overflows
    return kc, vc, k, v, lens, table


def test_the_registered_op_passes_torch_opcheck() -> None:
    """flashgen::append_kv's schema (the caches declared written), fake implementation and
    functionalization agree with what the op does."""
    kc, vc, k, v, lens, table = _paged_case()
    torch.library.opcheck(torch.ops.flashgen.append_kv.default, (kc, vc, k, v, lens, table))


def test_append_under_torch_compile_fullgraph_writes_the_caches() -> None:
    kc, vc, k, v, lens, table = _paged_case(1)
    kc2, vc2 = kc.clone(), vc.clone()
    want = append_kv(kc, vc, k, v, lens, table)
    compiled = torch.compile(append_kv, fullgraph=True, backend="aot_eager")
    got = compiled(kc2, vc2, k, v, lens, table)
    assert torch.equal(got, want) and got.tolist() == [4, -1]
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc)


# ---- the append kernel ----------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_append_kernel_compiles_without_spills(nvcc_required: Path, arch: str) -> None:
    cubin, log = run_nvcc(cubin_flags(ARCHS[arch].gencode), append_kernel.SOURCE,
                          what="append kernel")  # fmt: skip
    r = parse_ptxas(log, append_kernel.NAME, arch)
    assert cubin[:4] == b"\x7fELF"
    assert 0 < r.registers <= 64 and r.spill_bytes == 0 and r.stack_frame == 0, r


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[append_kernel.Append, int, str]]:
    """CPU tensors take the kernel path, into a stand-in launch that records the arguments the
    kernel would get (and writes nothing: the tests read the arguments, not the cache)."""
    got: list[tuple[append_kernel.Append, int, str]] = []
    monkeypatch.setattr(kvappend, "_kernel_arch", lambda device: "sm_90")
    monkeypatch.setattr(kvappend, "_stream", lambda index: 1234)
    monkeypatch.setattr(kvappend, "_bounds", {})

    def launch(self: append_kernel.Bound, *ptrs_stream_device_arch: object) -> None:
        *ptrs, stream, _device, arch = ptrs_stream_device_arch
        got.append((self.pointers(*ptrs), stream, arch))  # type: ignore[arg-type]

    monkeypatch.setattr(append_kernel.Bound, "launch", launch)
    return got


def test_a_contiguous_append_hands_the_kernel_its_tensors(launches) -> None:  # noqa: ANN001
    kc = torch.zeros(3, 40, 2, 64, dtype=torch.bfloat16)
    vc = torch.zeros(3, 40, 2, 32, dtype=torch.bfloat16)  # dv != d
    proj = torch.zeros(3, 5, 6, 64, dtype=torch.bfloat16)  # k a slice of a (B, T, H, d) tensor
    k, v = proj[:, :, 2:4], torch.zeros(3, 5, 2, 32, dtype=torch.bfloat16)
    lens = torch.tensor([0, 7, 35], dtype=torch.int32)
    out = append_kv(kc, vc, k, v, lens)
    (a, stream, arch), = launches
    assert (stream, arch) == (1234, "sm_90")
    assert a.new_lens == out.data_ptr() and out.dtype == torch.int32 and out.shape == (3,)
    assert a.k == append_kernel.Side(kc.data_ptr(), k.data_ptr(), (5120, 128, 64),
                                     (1920, 384, 64), 64)  # fmt: skip
    assert a.v == append_kernel.Side(vc.data_ptr(), v.data_ptr(), (2560, 64, 32), (320, 64, 32), 32)
    assert (a.lens, a.lens_stride, a.table) == (lens.data_ptr(), 1, 0)
    assert (a.batch, a.t_new, a.heads, a.capacity, a.element_size) == (3, 5, 2, 40, 2)
    assert (a.page_size, a.n_pages, a.row_blocks, a.grid) == (1, 0, 1, 3)
    assert a.k.unit(2) == 16 and a.v.unit(2) == 16
    assert not kc.any()  # the stand-in launched nothing: the torch ops did not run either


def test_a_paged_append_hands_the_kernel_its_table(launches) -> None:  # noqa: ANN001
    kc = torch.zeros(10, 3, 1, 8)  # page size 3, fp32
    table = torch.zeros(2, 8, dtype=torch.int32)[:, ::2]  # 4 pages per sequence, strided
    lens = torch.zeros(2, 2, dtype=torch.int32)[:, 1]  # strided lengths
    k = torch.zeros(2, 20, 1, 8)
    append_kv(kc, kc.clone(), k, k, lens, table)
    (a, _, _), = launches
    assert (a.table, a.table_strides) == (table.data_ptr(), (8, 2))
    assert (a.lens, a.lens_stride) == (lens.data_ptr(), 2)
    assert (a.capacity, a.page_size, a.n_pages) == (12, 3, 10)
    assert (a.t_new, a.row_blocks, a.grid) == (20, 3, 6)
    assert a.k.cache_strides == (24, 8, 8) and a.k.unit(4) == 16


def test_a_signature_builds_its_launch_once_and_every_call_brings_its_pointers(
    launches, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    built: list[append_kernel.Append] = []
    real_init = append_kernel.Bound.__init__

    def init(self: append_kernel.Bound, args: append_kernel.Append) -> None:
        built.append(args)
        real_init(self, args)

    monkeypatch.setattr(append_kernel.Bound, "__init__", init)
    def half(*shape: int) -> torch.Tensor:
        return torch.zeros(*shape, dtype=torch.float16)

    kc, vc = half(2, 16, 2, 8), half(2, 16, 2, 8)
    lens = torch.tensor([0, 3], dtype=torch.int32)
    for _ in range(3):  # decode steps: fresh new rows, the same caches
        k, v = half(2, 1, 2, 8), half(2, 1, 2, 8)
        out = append_kv(kc, vc, k, v, lens)
        a = launches[-1][0]
        assert (a.k.src, a.v.src, a.new_lens) == (k.data_ptr(), v.data_ptr(), out.data_ptr())
    assert len(built) == 1 and len(launches) == 3
    append_kv(kc, vc, half(2, 2, 2, 8), half(2, 2, 2, 8), lens)
    assert len(built) == 2  # a new T_new: a new signature


def test_a_bound_launch_writes_the_calls_pointers_and_copy_units(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    side = append_kernel.Side(0, 0, (4096, 256, 64), (512, 128, 64), 64)  # bf16: 16-byte strides
    a = append_kernel.Append(
        k=side, v=side, lens=0x3000, lens_stride=1, table=0, table_strides=(0, 0),
        new_lens=0x4000, batch=2, t_new=9, heads=4, capacity=100, page_size=1, n_pages=0,
        element_size=2,
    )  # fmt: skip
    b = append_kernel.Bound(a)
    seen: list[tuple[object, ...]] = []

    def launch_params(function_, grid, threads, stream, params, what) -> None:  # noqa: ANN001
        k, v = b._k, b._v
        seen.append((k.cache, k.src, k.unit, v.cache, v.src, v.unit, b._table.value, stream, grid))

    monkeypatch.setattr(append_kernel.small_kernel, "function", lambda *args: (1, 2))
    monkeypatch.setattr(append_kernel.small_kernel, "launch_params", launch_params)
    b.launch(0x10000, 0x20000, 0x30000, 0x40002, 0x5000, 0, 0x6000, 7, 0, "sm_90")
    b.launch(0x10008, 0x20000, 0x30000, 0x40000, 0x5000, 0x7000, 0x6000, 8, 0, "sm_90")
    # the units: 16 from the strides, narrowed by each side's addresses (v at +2 bytes, k at +8)
    assert seen == [(0x10000, 0x20000, 16, 0x30000, 0x40002, 2, None, 7, (4, 1, 1)),
                    (0x10008, 0x20000, 8, 0x30000, 0x40000, 16, 0x7000, 8, (4, 1, 1))]  # fmt: skip
    first = b.pointers(0x10000, 0x20000, 0x30000, 0x40002, 0x5000, 0, 0x6000)
    assert first.k.unit(2) == 16 and first.v.unit(2) == 2  # what Side.unit says, alike


def test_the_kernel_parameters_in_the_kernels_order_and_layout() -> None:
    side = append_kernel.Side(0x1000, 0x2002, (4096, 256, 64), (512, 128, 64), 64)
    assert side.unit(2) == 2  # src at an odd bf16 element: 2-byte copies
    a = append_kernel.Append(
        k=side, v=side, lens=0x3000, lens_stride=1, table=0, table_strides=(0, 0),
        new_lens=0x4000, batch=2, t_new=9, heads=4, capacity=100, page_size=1, n_pages=0,
        element_size=2,
    )  # fmt: skip
    p = a.params()
    assert len(p) == 15 and ctypes.sizeof(p[0]) == 80  # struct Side: 2 pointers, 7 int64, int
    k = p[0]
    assert (k.cache, k.src, list(k.cache_stride), list(k.src_stride), k.row_bytes, k.unit) == (
        0x1000, 0x2002, [8192, 512, 128], [1024, 256, 128], 128, 2,
    )  # fmt: skip
    assert p[4].value is None  # no table: a null pointer
    assert [x.value for x in p[8:]] == [2, 9, 4, 100, 1, 0, 2]  # ..., row_blocks = ceil(9 / 8)
    assert a.grid == 4 and a.fits()
    huge = append_kernel.Append(**{**a.__dict__, "capacity": 2**31})
    assert not huge.fits()
    with pytest.raises(ValueError, match="int32 indices"):
        append_kernel.launch(huge, 0, 0, "sm_90")
    many = append_kernel.Append(**{**a.__dict__, "batch": 10**6, "t_new": 100})
    assert many.grid == append_kernel.MAX_BLOCKS  # the rest by the grid-stride loop


def test_what_the_kernel_does_not_take_is_appended_with_torch_ops(launches) -> None:  # noqa: ANN001
    g = torch.Generator().manual_seed(3)
    kc, vc = torch.randn(2, 8, 2, 16, generator=g), torch.randn(2, 8, 2, 16, generator=g)
    k = torch.randn(2, 3, 2, 32, generator=g)[..., ::2]  # a head's row at stride 2
    v = torch.randn(2, 3, 2, 16, generator=g)
    _check(kc, vc, k, v, torch.tensor([1, 6], dtype=torch.int32))
    complex_cache = torch.zeros(2, 8, 2, 16, dtype=torch.complex64)
    kz = torch.ones(2, 3, 2, 16, dtype=torch.complex64)
    _check(complex_cache, complex_cache.clone(), kz, kz, torch.tensor([0, 2], dtype=torch.int32))
    kg = torch.randn(2, 3, 2, 16, generator=g, requires_grad=True)  # the torch ops keep the grad
    append_kv(kc, vc, kg, v, torch.tensor([0, 2], dtype=torch.int32))
    assert kc.requires_grad
    assert not launches


def test_cpu_tensors_take_the_torch_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kvappend.append_kernel, "launch", lambda *a: pytest.fail("launched"))
    assert kvappend._kernel_arch(torch.device("cpu")) is None
    kc, vc, k, v, lens, table = _paged_case(2)
    _check(kc, vc, k, v, lens, table)
    empty = torch.zeros(0, 1, 2, 8)  # B = 0: nothing to append, no launch
    assert append_kv(torch.zeros(0, 4, 2, 8), torch.zeros(0, 4, 2, 8), empty, empty,
                     torch.zeros(0, dtype=torch.int32)).shape == (0,)  # fmt: skip
