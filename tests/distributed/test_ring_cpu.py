"""flashgen.distributed on the CPU: the ring's plans, sharding and merge, and whole rings of 2
and 3 gloo processes (MathBlocks, float64) against a float64 autograd oracle -- O, LSE, dQ, dK, dV
to rounding, causal and not, zigzag and contiguous, GQA. The GPU side (flashgen's kernels per
step, NCCL) is scripts/ring_check.py under torchrun."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from flashgen.distributed import (  # noqa: E402
    MathBlocks,
    block_plan,
    positions,
    ring_attention,
    shard,
    unshard,
)
from flashgen.distributed.merge import empty_accumulator, merge_into  # noqa: E402

WORKER = Path(__file__).with_name("ring_worker.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_plans_cover_the_mask_once(layout: str, causal: bool, world: int) -> None:
    """Over a ring's steps, every (query, key) pair the mask shows meets exactly once, and no
    hidden pair meets at all."""
    t = 4 * world
    t_local = t // world
    pos = [positions(r, world, t, layout) for r in range(world)]
    seen: dict[tuple[int, int], int] = {}
    for rank in range(world):
        for step in range(world):
            src = (rank - step) % world
            plan = block_plan(rank, src, world, t_local, causal, layout)
            if plan is None:
                continue
            for qi in range(*plan.q_rows):
                for kj in range(*plan.kv_rows):
                    qp, kp = pos[rank][qi], pos[src][kj]
                    hidden_by_block = plan.causal and kj > qi
                    if not hidden_by_block:
                        seen[(qp, kp)] = seen.get((qp, kp), 0) + 1
    want = {(i, j) for i in range(t) for j in range(t) if not causal or j <= i}
    assert set(seen) == want
    assert set(seen.values()) == {1}


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_zigzag_steps_do_equal_work(world: int) -> None:
    """Causal zigzag: every step of every rank but the diagonal pairs half the local rows with
    half the keys' worth of work (T_local^2 / 2 pairs), so the ranks stay in step."""
    t_local = 8
    for rank in range(world):
        for step in range(1, world):
            plan = block_plan(rank, (rank - step) % world, world, t_local, True, "zigzag")
            assert plan is not None
            area = (plan.q_rows[1] - plan.q_rows[0]) * (plan.kv_rows[1] - plan.kv_rows[0])
            assert area == t_local * t_local // 2


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_shard_unshard_round_trip(layout: str) -> None:
    world, t = 3, 12
    x = torch.arange(2 * t * 5).reshape(2, 1, t, 5)
    parts = [shard(x, r, world, layout=layout) for r in range(world)]
    assert torch.equal(unshard(parts, layout=layout), x)
    for r, p in enumerate(parts):  # positions() names the same tokens
        tokens = p[0, 0, :, 0].div(5, rounding_mode="floor").tolist()
        assert tokens == positions(r, world, t, layout)


def test_shard_refuses_uneven_lengths() -> None:
    with pytest.raises(ValueError, match=r"x.shape\[2\]=10: .* multiple of 4; pad .* 12"):
        shard(torch.zeros(1, 1, 10, 8), 0, 2)
    with pytest.raises(ValueError, match="layout='ring'"):
        shard(torch.zeros(1, 1, 8, 8), 0, 2, layout="ring")


def test_merge_of_key_blocks_is_the_whole_attention() -> None:
    """Three key blocks merged by LSE (one of them hiding some rows entirely) give the
    attention over all keys, in float64 to rounding."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g, dtype=torch.float64) for _ in range(3))
    eng = MathBlocks()
    o_ref, lse_ref = eng.forward(q, k, v, False, 0.3)
    acc_o, acc_lse = empty_accumulator(q, 8)
    for a, b in ((0, 2), (2, 5), (5, 6)):
        o, lse = eng.forward(q, k[:, :, a:b], v[:, :, a:b], False, 0.3)
        merge_into(acc_o, acc_lse, o, lse)
    assert float((acc_o - o_ref).abs().max()) < 1e-13
    assert float((acc_lse - lse_ref).abs().max()) < 1e-13
    # a block that no row sees (LSE -inf everywhere) changes nothing
    merge_into(acc_o, acc_lse, torch.zeros_like(acc_o), torch.full_like(acc_lse, -math.inf))
    assert float((acc_o - o_ref).abs().max()) < 1e-13


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_rings_of_gloo_processes_match_the_oracle() -> None:
    """Rings of 2 and 3 processes (started together), and a ring over a subgroup of the
    3 (global ranks 0 and 2): every rank's O, LSE and gradients equal its shard of the
    whole-sequence float64 oracle's; under torch.compile(fullgraph=True) (the 2-ring, through
    the registered ops), the same as eager."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("FLASHGEN_REQUIRE_NVCC", None)
    procs = []
    for world in (2, 3):
        port = _free_port()
        for rank in range(world):
            cmd = [sys.executable, str(WORKER), str(rank), str(world), str(port)]
            procs.append((world, rank, subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
            )))  # fmt: skip
    lines = []
    for world, rank, p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, f"world {world} rank {rank}: {err[-2000:]}"
        lines += [(world, json.loads(x)) for x in out.splitlines() if x.startswith("{")]
    assert len(lines) == 4 * (2 + 3) + 2 + 2  # four cases a rank; the subgroup's; compiled
    for world, row in lines:
        assert max(row["err"]) < 1e-12, (world, row)


def test_ring_attention_refuses_bad_calls() -> None:
    q = torch.zeros(1, 2, 8, 8)
    with pytest.raises(ValueError, match="torch.distributed is not initialized"):
        ring_attention(q, q, q)
    with pytest.raises(ValueError, match=r"T_local=7: .* must be even"):
        ring_attention(q[:, :, :7], q[:, :, :7], q[:, :, :7])
    with pytest.raises(ValueError, match="k and v must be"):
        ring_attention(q, q[:, :, :4], q[:, :, :4])
    with pytest.raises(ValueError, match="H=2, H_kv=3"):
        ring_attention(q, torch.zeros(1, 3, 8, 8), torch.zeros(1, 3, 8, 8))
    with pytest.raises(ValueError, match="layout='ring'"):
        ring_attention(q, q, q, layout="ring")
    with pytest.raises(ValueError, match="must be a 4-D torch tensor"):
        ring_attention(q[0], q, q)
    with pytest.raises(ValueError, match="share one dtype"):
        ring_attention(q, q.double(), q)


def test_ring_check_oracle_is_the_attention_gradient() -> None:
    """scripts/ring_check.py's chunked float64 oracle (the GPU bar's reference) against torch
    autograd, causal and not, GQA, chunks that do not divide T."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from ring_check import oracle
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    g = torch.Generator().manual_seed(3)
    for causal in (True, False):
        q, do = (torch.randn(1, 4, 40, 16, generator=g, dtype=torch.float64) for _ in range(2))
        k, v = (torch.randn(1, 2, 40, 16, generator=g, dtype=torch.float64) for _ in range(2))
        qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
        s = qq @ kk.repeat_interleave(2, 1).transpose(-1, -2) * 0.3
        if causal:
            s = s.masked_fill(torch.ones(40, 40, dtype=torch.bool).triu(1), -math.inf)
        o = torch.softmax(s, -1) @ vv.repeat_interleave(2, 1)
        o.backward(do)
        rows, keys = torch.tensor([0, 5, 17, 39]), torch.tensor([1, 20, 39])
        ref = oracle(q, k, v, do, causal, 0.3, rows, keys, chunk=7)
        assert qq.grad is not None and kk.grad is not None and vv.grad is not None
        want = {"o": o[:, :, rows], "lse": torch.logsumexp(s, -1)[:, :, rows],
                "dq": qq.grad[:, :, rows], "dk": kk.grad[:, :, keys],
                "dv": vv.grad[:, :, keys]}  # fmt: skip
        for name, w in want.items():
            assert float((ref[name] - w.detach()).abs().max()) < 1e-12, name


def test_nccl_exchange_batches_sends_to_the_next_rank_and_receives_from_the_previous(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The NCCL path (not runnable here) with torch.distributed stood in for: one batch of
    isends to the next rank and irecvs from the previous, peers named by global rank (a
    subgroup whose ranks 0, 1, 2 are global 4, 6, 9), received buffers shaped like the sent."""
    from flashgen.distributed import exchange

    group = object()
    calls: list[tuple[str, int, tuple[int, ...]]] = []

    class Work:
        def wait(self) -> None:
            calls.append(("wait", -1, ()))

    def p2p(op, tensor, peer, grp):  # noqa: ANN001, ANN202
        assert grp is group
        return (op.__name__, peer, tuple(tensor.shape))

    def batch(ops):  # noqa: ANN001, ANN202
        calls.extend(ops)
        return [Work()]

    ranks = [4, 6, 9]
    monkeypatch.setattr(exchange.dist, "get_rank", lambda g: 0)
    monkeypatch.setattr(exchange.dist, "get_world_size", lambda g: 3)
    monkeypatch.setattr(exchange.dist, "get_backend", lambda g: "nccl")
    monkeypatch.setattr(exchange.dist, "get_global_rank", lambda g, r: ranks[r])
    monkeypatch.setattr(exchange.dist, "P2POp", p2p)
    monkeypatch.setattr(exchange.dist, "batch_isend_irecv", batch)
    ring = exchange.RingExchange(group)
    got = ring.start([torch.zeros(2, 3), torch.zeros(5)]).wait()
    assert calls == [("isend", 6, (2, 3)), ("isend", 6, (5,)),
                     ("irecv", 9, (2, 3)), ("irecv", 9, (5,)), ("wait", -1, ())]  # fmt: skip
    assert [tuple(t.shape) for t in got] == [(2, 3), (5,)]
