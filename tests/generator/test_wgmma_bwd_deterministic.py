"""The wgmma backward's deterministic mode on the CPU: its variants, scratch and rules, and a model
of the order in which its blocks add into dQ (templates/wgmma_bwd.cu.j2, DETERMINISTIC).

The order rests on two facts the template does not check at run time, so they are checked here
over many shapes with the template's own arithmetic transcribed (`tiles_seeing`, `rows_seeing`):
the key tiles that see a query tile are consecutive (so "the next key tile adds just before me
when it sees the query tile" chains every contributor, highest first), and with blocks started
from the last key tile down, no block ever waits for one started after it (so every wait ends).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from flashgen.generator import backward as bwd_shape
from flashgen.generator.families.wgmma import bwd as wgmma_bwd
from flashgen.generator.render import render
from flashgen.generator.select import backward_family
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec, SpecError

BR = 64


@dataclass(frozen=True)
class Shape:
    tq: int
    tk: int
    bc: int
    causal: bool
    window: tuple[int, int] | None  # (left, right), -1 unbounded; None: no window

    @property
    def n_qtiles(self) -> int:
        return -(-self.tq // BR)

    @property
    def n_ktiles(self) -> int:
        return -(-self.tk // self.bc)


def _rows_seeing(s: Shape, k_first: int, k_last: int) -> tuple[int, int]:
    """The template's rows_seeing (templates/_bwd.cuh.j2)."""
    shift = s.tk - s.tq
    lo, hi = 0, s.tq
    if s.causal:
        lo = max(lo, k_first - shift)
    if s.window is not None and s.window[1] >= 0:
        lo = max(lo, k_first - s.window[1] - shift)
    if s.window is not None and s.window[0] >= 0:
        hi = min(hi, k_last + s.window[0] - shift + 1)
    return (0, 0) if hi <= lo else (lo, hi)


def _tiles_seeing(s: Shape, kv: int) -> tuple[int, int]:
    """The template's tiles_seeing macro: (first query tile, how many) that see keys kv..kv+BC-1."""
    first = max(0, kv - (s.tk - s.tq)) // BR if s.causal else 0
    count = max(0, s.n_qtiles - first)
    if s.window is not None:
        lo, hi = _rows_seeing(s, kv, min(kv + s.bc, s.tk) - 1)
        first = lo // BR
        count = (hi - 1) // BR + 1 - first if hi > lo else 0
    return first, count


def _sees(s: Shape, n: int, m: int) -> bool:
    first, count = _tiles_seeing(s, n * s.bc)
    return count > 0 and first <= m < first + count


def _want(s: Shape, n: int, m: int) -> int:
    """What block n (key tile n) waits for in query tile m's semaphore (the consumer's `want`)."""
    if n + 1 >= s.n_ktiles:  # (kv0 + BC >= tk: no next key tile)
        return 0
    return n + 2 if _sees(s, n + 1, m) else 0


def _shapes(count: int, seed: int) -> Iterator[Shape]:
    rng = random.Random(seed)
    for _ in range(count):
        tq, tk = rng.randint(1, 700), rng.randint(1, 700)
        causal = rng.random() < 0.6
        window = None
        if rng.random() < 0.5:
            window = (rng.choice([-1, 0, 1, 63, 64, 100, 300]), rng.choice([-1, 0, 5, 64, 200]))
            if window == (-1, -1):
                window = None
        yield Shape(tq, tk, rng.choice([64, 128]), causal, window)


@pytest.mark.parametrize("seed", range(4))
def test_each_query_tile_gets_its_adds_from_consecutive_key_tiles_highest_first(seed: int) -> None:
    for s in _shapes(400, seed):
        for m in range(s.n_qtiles):
            adders = [n for n in range(s.n_ktiles) if _sees(s, n, m)]
            assert adders == list(range(adders[0], adders[-1] + 1)) if adders else True, s
            semaphore = 0  # the pre kernel's zero; each add leaves 1 + its key tile
            for n in reversed(adders):
                assert _want(s, n, m) == semaphore, (s, m, n)
                semaphore = n + 1


def _protocol(
    b: int, h_kv: int, group: int, s: Shape, d: int, slots: int, rng: random.Random,
    order: str = "tiles_outer",
) -> str:
    """The whole protocol as the rendered kernel runs it: the pre kernel's zeroing over its
    grid, the main kernel's semaphore index and `want`, a pending release per consumer's issuing
    thread (at its next reduce after `wait_group 1`, or at the block's end after `wait_group
    0`), consumers taking steps in turn at d 64, GQA and batch; blocks started in `order`
    ("tiles_outer": the deterministic grid, key tiles from the last down and every (batch, K/V
    head) within one; "rows_outer": each (batch, K/V head)'s key tiles from the last down;
    "ascending": from the first) onto `slots` SMs; reduces complete at random. Asserts every
    add comes after all higher key tiles' adds into its (batch, head, query tile, region) have
    completed, and that each is made once; returns "ok" or "DEADLOCK". The accumulator and the
    regions are over DP = d rounded up to 64 (the template's DQ_SPLIT, `scratch_shapes`)."""
    bc, consumers, chunk = s.bc, s.bc // 64, 64
    dp = -(-d // 64) * 64
    dq_split = (dp // consumers) % chunk == 0
    regions = consumers if dq_split else 1
    h = h_kv * group
    nq = s.n_qtiles
    tqp = nq * BR
    sems_n = b * h * nq * regions
    alloc = (b * h * tqp + -(-sems_n // dp)) * dp  # the accumulator's floats (scratch_shapes)
    base = b * h * tqp * dp
    mem: dict[int, int] = {}
    pre_lanes, pre_rows = 8, 128 * (consumers + 1) // 8
    for z in range(b):  # the pre kernel, grid (ceil(tqp / PRE_ROWS), H, B)
        for y in range(h):
            for x in range(-(-tqp // pre_rows)):
                for t in range(pre_rows * pre_lanes):
                    sub, row = t % pre_lanes, x * pre_rows + t // pre_lanes
                    if row < tqp and sub < regions and row % BR == 0:
                        idx = base + ((z * h + y) * (tqp // BR) + row // BR) * regions + sub
                        assert base <= idx < alloc and idx not in mem
                        mem[idx] = 0
    assert len(mem) == sems_n
    nkt = s.n_ktiles
    tiles = list(range(nkt)) if order == "ascending" else list(reversed(range(nkt)))
    if order == "tiles_outer":
        launch = [(z, y, kt) for kt in tiles for z in range(b) for y in range(h_kv)]
    else:
        launch = [(z, y, kt) for z in range(b) for y in range(h_kv) for kt in tiles]
    blocks = []
    for z, y, kt in launch:
        jf, ph = _tiles_seeing(s, kt * bc)
        steps = [(y * group + i // ph, jf + i % ph) for i in range(group * ph)] if ph else []
        blocks.append({
            "z": z, "kt": kt, "steps": steps, "s": 0, "sub": 0, "pending": [-1] * consumers,
            "inflight": [[] for _ in range(consumers)],
        })  # fmt: skip
    contributors: dict[tuple[int, ...], list[int]] = {}
    for blk in blocks:
        for hh, m in blk["steps"]:
            for r in range(regions):
                contributors.setdefault((blk["z"], hh, m, r), []).append(blk["kt"])
    adds: dict[tuple[int, ...], list[tuple[int, dict[str, bool]]]] = {}
    waiting, running = list(blocks), []

    def release(blk: dict, c: int) -> None:
        mem[base + (c if dq_split else 0) + blk["pending"][c]] = blk["kt"] + 1

    while waiting or running:
        while waiting and len(running) < slots:
            running.append(waiting.pop(0))
        moved = False
        for blk in rng.sample(running, len(running)):
            for c in range(consumers):  # bulk reduces complete at random
                if blk["inflight"][c] and rng.random() < 0.5:
                    blk["inflight"][c].pop(0)["done"] = True
                    moved = True
            if blk["s"] >= len(blk["steps"]):  # the epilogue: wait_group 0, then release
                for c in range(consumers):
                    for op in blk["inflight"][c]:
                        op["done"] = True
                    blk["inflight"][c] = []
                    if blk["pending"][c] >= 0:
                        release(blk, c)
                running.remove(blk)
                moved = True
                continue
            hh, m = blk["steps"][blk["s"]]
            issuers = list(range(consumers)) if dq_split else [blk["s"] % consumers]
            c = issuers[blk["sub"]]
            tile = ((blk["z"] * h + hh) * tqp + m * BR) * dp  # the accumulator offset
            sem = tile // (BR * dp) * regions  # tile / (BR * DP) * DQ_REGIONS
            idx = base + (c if dq_split else 0) + sem
            assert idx in mem
            if mem[idx] != _want(s, blk["kt"], m):
                continue
            key = (blk["z"], hh, m, c if dq_split else 0)
            before = adds.setdefault(key, [])
            higher = sorted((k for k in contributors[key] if k > blk["kt"]), reverse=True)
            assert [k for k, _ in before] == higher, ("order", s, key)
            assert all(op["done"] for _, op in before), ("an add before the last one completed", s)
            op = {"done": False}
            before.append((blk["kt"], op))
            blk["inflight"][c].append(op)
            if blk["pending"][c] >= 0:  # wait_group 1: all but the reduce just issued
                for old in blk["inflight"][c][:-1]:
                    old["done"] = True
                blk["inflight"][c] = blk["inflight"][c][-1:]
                release(blk, c)
            blk["pending"][c] = sem
            blk["sub"] += 1
            if blk["sub"] == len(issuers):
                blk["sub"], blk["s"] = 0, blk["s"] + 1
            moved = True
        if not moved and not any(blk["inflight"][c] for blk in running for c in range(consumers)):
            return "DEADLOCK"
    for key, ks in contributors.items():
        assert sorted(k for k, _ in adds.get(key, [])) == sorted(ks)
    return "ok"


@pytest.mark.parametrize("seed", range(2))
def test_the_protocol_adds_in_order_and_never_waits_forever(seed: int) -> None:
    rng = random.Random(seed)
    for s in _shapes(60, seed + 10):
        d = rng.choice([64, 128])
        got = _protocol(rng.randint(1, 2), rng.randint(1, 2), rng.choice([1, 2, 3]), s, d,
                        slots=rng.choice([1, 2, 3, 5, 9]), rng=rng)  # fmt: skip
        assert got == "ok", s


@pytest.mark.parametrize("d", [96, 72, 40])
def test_the_protocol_at_head_dims_run_padded(d: int) -> None:
    """d 96 and 72 run at DP 128 (two regions at bc 128), d 40 at 64 (one: turns): the semaphore
    index is the accumulator offset over BR * DP."""
    rng = random.Random(d)
    for s in _shapes(30, d):
        got = _protocol(rng.randint(1, 2), rng.randint(1, 2), rng.choice([1, 2, 3]), s, d,
                        slots=rng.choice([1, 2, 3, 5, 9]), rng=rng)  # fmt: skip
        assert got == "ok", s


def test_started_from_the_first_key_tile_the_same_waits_would_deadlock() -> None:
    """The model can fail: started in ascending order on one SM, key tile 0 waits for key tile
    1's add, and tile 1 never starts."""
    s = Shape(256, 256, 64, causal=False, window=None)
    rng = random.Random(0)
    assert _protocol(1, 1, 1, s, 64, slots=1, rng=rng) == "ok"
    assert _protocol(1, 1, 1, s, 64, slots=1, rng=rng, order="ascending") == "DEADLOCK"


def _makespan(rows: int, t: int, causal: bool, lag: float, tiles_outer: bool,
              ordered: bool = True, slots: int = 132) -> float:  # fmt: skip
    """A timing model: blocks of (row, key tile) started in order onto `slots` SMs; a step takes
    1; a step that adds after the next key tile waits until that add's release, `lag` steps after
    it was issued (the lazy release: ~1 at d 128, ~2 at d 64 where consumers take turns)."""
    nkt, nq = t // 128, t // 64
    launch = ([(r, nkt - 1 - x) for x in range(nkt) for r in range(rows)] if tiles_outer
              else [(r, nkt - 1 - x) for r in range(rows) for x in range(nkt)])  # fmt: skip
    released: dict[tuple[int, int, int], float] = {}
    free = [0.0] * slots
    end_all = 0.0
    for r, kt in launch:
        start = heapq.heappop(free)
        mine = list(range(2 * kt if causal else 0, nq))
        theirs = set(range(2 * (kt + 1) if causal else 0, nq)) if kt + 1 < nkt else set()
        now = start
        for m in mine:
            now += 1
            if ordered and m in theirs:
                now = max(now, released[(r, kt + 1, m)])
            released[(r, kt, m)] = now + lag
        heapq.heappush(free, now)
        end_all = max(end_all, now)
    return end_all


def test_key_tiles_outermost_keep_the_chains_short() -> None:
    """Why the grid starts key tiles outermost: in the model, T 4096 non-causal with 16 (batch,
    K/V head) rows, the ordered backward takes ~1.3x (d 128) / ~1.6x (d 64) the unordered time
    started row by row, ~1.03x / ~1.05x key tiles outermost; causal is ~1.0 either way."""
    free = _makespan(16, 4096, False, 0.0, tiles_outer=False, ordered=False)
    for lag, worst_rows_outer, best_tiles_outer in ((1.0, 1.2, 1.04), (2.0, 1.4, 1.07)):
        assert _makespan(16, 4096, False, lag, tiles_outer=False) / free > worst_rows_outer
        assert _makespan(16, 4096, False, lag, tiles_outer=True) / free < best_tiles_outer
    causal = _makespan(16, 4096, True, 0.0, tiles_outer=False, ordered=False)
    assert _makespan(16, 4096, True, 2.0, tiles_outer=True) / causal < 1.01


def _det(d: int, causal: bool, **kw: object) -> KernelSpec:
    return KernelSpec(
        family="wgmma", d=d, causal=causal, direction="bwd", dtype="bf16",
        features=("deterministic", *kw.pop("extra", ())),  # type: ignore[misc]
        **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def test_deterministic_wgmma_variants_ship_and_keep_the_three_kernels() -> None:
    det = [s for s in shipped("wgmma", direction="bwd") if bwd_shape.is_deterministic(s)]
    assert {(s.d, s.dtype, s.causal) for s in det} == {
        (d, t, c) for d in (64, 128) for t in ("fp16", "bf16") for c in (False, True)
    }
    spec = _det(128, True)
    assert spec.name == "flash_bwd_wgmma_d128_br64_bc128_bf16_causal_deterministic_s2"
    assert bwd_shape.kernel_names(spec)[2] == f"{spec.name}_post"  # no dQ kernel
    assert not bwd_shape.has_dq_kernel(spec)
    assert bwd_shape.smems(spec)[2] == 0


@pytest.mark.parametrize(
    ("d", "bc", "regions"),
    [(128, 128, 2), (64, 128, 1), (128, 64, 1), (96, 128, 2), (72, 64, 1), (40, 128, 1)],
)
def test_the_scratch_holds_the_accumulator_then_a_semaphore_per_tile_and_region(
    d: int, bc: int, regions: int
) -> None:
    spec = _det(d, False, bc=bc)
    assert wgmma_bwd.dq_regions(spec) == regions
    dp = wgmma_bwd.d_pad(spec)  # the accumulator's width (d rounded up to 64)
    b, h, tq = 3, 5, 1000  # 16 query tiles of 64 rows (tq rounded up to 1024)
    d_buf, accum = bwd_shape.scratch_shapes(spec, b, h, tq, d)
    assert d_buf == (b, h, 2, 1024)
    sems = b * h * 16 * regions
    assert bwd_shape.semaphores(spec, b, h, tq) == sems
    assert accum == (b * h * 1024 + -(-sems // dp), dp)
    fast = spec.replace(features=())
    assert bwd_shape.scratch_shapes(fast, b, h, tq, d)[1] == (b, h, 1024, dp)
    assert bwd_shape.semaphores(fast, b, h, tq) == 0
    mma = KernelSpec(family="mma", d=d, direction="bwd", features=("deterministic",))
    assert bwd_shape.scratch_shapes(mma, b, h, tq, d)[1] is None  # its dQ kernel's mode


def test_the_deterministic_render_orders_the_adds_and_the_fast_one_does_not() -> None:
    reversed_tiles = "const int kv0 = (gridDim.x - 1 - (int)(linear / rows)) * BC;"
    src = render(_det(128, True)).source
    assert "DQ_REGIONS == 2" in src and "while (ld_relaxed(sems + sem) != want)" in src
    assert "st_release(sems + pending, kv0 / BC + 1);" in src and reversed_tiles in src
    assert "const int sem = (int)(tile / (BR * DP)) * DQ_REGIONS;" in src  # tile: in DP units
    fast = render(_det(128, True).replace(features=())).source
    assert "ld_acquire" not in fast and reversed_tiles not in fast
    # d 96 runs at DP 128: two regions, as at d 128 (the static_assert against dq_regions)
    padded = render(_det(96, False)).source
    assert "constexpr int DP = 128;" in padded and "DQ_REGIONS == 2" in padded


@pytest.mark.parametrize("extra", [("varlen",), ("maskmod" + "0" * 12,)], ids=["varlen", "hook"])
def test_the_deterministic_mode_refuses_varlen_and_hooks(extra: tuple[str, ...]) -> None:
    with pytest.raises(SpecError, match="deterministic mode orders dQ's adds by key tile"):
        _det(64, True, extra=extra)


def test_deterministic_calls_take_the_wgmma_backward_on_sm90_and_mma_elsewhere() -> None:
    assert backward_family("sm_90a", 128, 128, "bf16", deterministic=True) == "wgmma"
    assert backward_family("sm_90a", 64, 64, "fp16", deterministic=True) == "wgmma"
    assert backward_family("sm_80", 128, 128, "bf16", deterministic=True) == "mma"
    # head dims run padded (a multiple of 8 up to 128) too; others are mma's
    assert backward_family("sm_90a", 96, 96, "bf16", deterministic=True) == "wgmma"
    assert backward_family("sm_90a", 72, 72, "fp16", deterministic=True) == "wgmma"
    assert backward_family("sm_90a", 100, 100, "bf16", deterministic=True) == "mma"
