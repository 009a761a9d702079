"""The HBM traffic model the seed walk teaches: bytes moved, FLOPs, and which roof binds.

For one problem (B, H, Tq, Tk) and one variant (d, br, bc, dtype, causal) it counts the bytes
read from and written to HBM by three loop orders:

- **flashgen** (FlashAttention-2's order, every family here): one block owns one query tile
  for the whole pass. Q is read once; K and V are read once per query tile (ceil(Tq/br) times;
  causal: only the key tiles a query tile can see, whole `bc` tiles clipped at Tk); O and LSE
  are written once.
- **seed** (the walk's FA1 order): the outer loop runs over K/V tiles and the inner loop over
  query tiles, so K and V are read once, but for every (K/V tile, query tile) pair the query
  tile of Q is read and its running O, m and l are read and written back (the zero/-inf
  initialisation of O, m, l is not counted). Same tiles (br, bc) and storage dtype as the
  variant, so only the loop order differs; m and l are fp32.
- **ideal**: each tensor crosses HBM exactly once (Q, K, V read; O, LSE written): the floor
  any kernel pays, reached when every re-read hits L2.

The model assumes no re-read hits L2; on a real GPU the K/V tiles of one head (2*Tk*d*size
bytes) are often still in L2 when the next query tile asks, so measured traffic lies between
`flashgen` and `ideal`. FLOPs follow the benchmark convention: 4*B*H*Tq*Tk*d (two matrix
products), halved when causal. Pure: no GPU, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flashgen.generator.spec import KernelSpec

LSE_BYTES = 4  # LSE, m and l are fp32
STAT_BYTES = 4


@dataclass(frozen=True)
class Machine:
    """Peak rates of one GPU: the two roofs of its roofline."""

    name: str
    hbm_bytes_per_s: float
    tensor_flops: float  # dense fp16/bf16 tensor-core math, fp32 accumulation
    cuda_core_flops: float  # fp32 FMA on CUDA cores
    l2_bytes: int

    @property
    def tensor_ridge(self) -> float:
        """FLOP per HBM byte above which tensor-core math, not memory, is the limit."""
        return self.tensor_flops / self.hbm_bytes_per_s

    @property
    def cuda_core_ridge(self) -> float:
        """The same ridge point for fp32 math on CUDA cores."""
        return self.cuda_core_flops / self.hbm_bytes_per_s


# NVIDIA's H200 SXM data sheet: 4.8 TB/s HBM3e, 989 TFLOP/s dense bf16/fp16 tensor core
# (1979 is with 2:4 sparsity), 67 TFLOP/s fp32 on CUDA cores, 50 MB of L2.
# Ridge: 989e12 / 4.8e12 = 206 FLOP/B.
H200 = Machine("NVIDIA H200 SXM", 4.8e12, 989e12, 67e12, 50_000_000)


@dataclass(frozen=True)
class Traffic:
    """Bytes one loop order moves between HBM and the SMs, per tensor, and the FLOPs it does."""

    order: str
    read: dict[str, int]
    written: dict[str, int]
    flops: int

    @property
    def bytes_read(self) -> int:
        """All bytes read from HBM."""
        return sum(self.read.values())

    @property
    def bytes_written(self) -> int:
        """All bytes written to HBM."""
        return sum(self.written.values())

    @property
    def total(self) -> int:
        """Bytes read plus bytes written."""
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self) -> float:
        """Arithmetic intensity: FLOPs per HBM byte."""
        return self.flops / self.total


def visible_keys(q0: int, br: int, tq: int, tk: int, causal: bool) -> int:
    """Keys the query tile starting at row q0 can see: the kernels' `visible_keys`.

    Causal attention is aligned to the bottom-right corner (row i sees keys j <= i + tk - tq),
    so the tile's last row q0 + br - 1 sees up to key q0 + br - 1 + tk - tq; clamped to [0, tk].
    """
    if not causal:
        return tk
    return max(0, min(tk, q0 + br + tk - tq))


def keys_loaded(n_visible: int, bc: int, tk: int) -> int:
    """Key rows a block loads to cover `n_visible` keys: whole `bc` tiles, clipped at tk."""
    tiles = -(-n_visible // bc)
    return min(tiles * bc, tk)


def attention_flops(spec: KernelSpec, b: int, h: int, tq: int, tk: int) -> int:
    """4*B*H*Tq*Tk*d (Q K^T and P V, 2 FLOPs per multiply-add), halved when causal."""
    flops = 4 * b * h * tq * tk * spec.d
    return flops // 2 if spec.causal else flops


def _query_tiles(spec: KernelSpec, tq: int) -> list[tuple[int, int]]:
    """(first row, rows) of every query tile."""
    return [(q0, min(spec.br, tq - q0)) for q0 in range(0, tq, spec.br)]


def flashgen_traffic(spec: KernelSpec, b: int, h: int, tq: int, tk: int) -> Traffic:
    """Traffic of flashgen's loop order (query tile outside, K/V tiles inside)."""
    size = spec.dtype_info.itemsize
    heads = b * h
    kv_rows = sum(
        keys_loaded(visible_keys(q0, spec.br, tq, tk, spec.causal), spec.bc, tk)
        for q0, _ in _query_tiles(spec, tq)
    )
    return Traffic(
        order="flashgen",
        read={
            "Q": heads * tq * spec.d * size,
            "K": heads * kv_rows * spec.d * size,
            "V": heads * kv_rows * spec.d * size,
        },
        written={"O": heads * tq * spec.d * size, "LSE": heads * tq * LSE_BYTES},
        flops=attention_flops(spec, b, h, tq, tk),
    )


def seed_traffic(spec: KernelSpec, b: int, h: int, tq: int, tk: int) -> Traffic:
    """Traffic of the seed's loop order (K/V tiles outside, query tiles inside), same tiles."""
    size = spec.dtype_info.itemsize
    heads = b * h
    pair_rows = 0  # query rows summed over every visited (K/V tile, query tile) pair
    kv_tiles = 0  # K/V tiles some query tile sees: each is read once
    for q0, rows in _query_tiles(spec, tq):
        n_tiles = -(-visible_keys(q0, spec.br, tq, tk, spec.causal) // spec.bc)
        pair_rows += n_tiles * rows
        kv_tiles = max(kv_tiles, n_tiles)
    kv_rows = min(kv_tiles * spec.bc, tk)
    row_bytes = spec.d * size
    stats = 2 * STAT_BYTES  # m and l of one row
    return Traffic(
        order="seed",
        read={
            "Q": heads * pair_rows * row_bytes,
            "K": heads * kv_rows * row_bytes,
            "V": heads * kv_rows * row_bytes,
            "O": heads * pair_rows * row_bytes,
            "m,l": heads * pair_rows * stats,
        },
        written={"O": heads * pair_rows * row_bytes, "m,l": heads * pair_rows * stats},
        flops=attention_flops(spec, b, h, tq, tk),
    )


def ideal_traffic(spec: KernelSpec, b: int, h: int, tq: int, tk: int) -> Traffic:
    """The compulsory traffic: each of Q, K, V read once, O and LSE written once."""
    size = spec.dtype_info.itemsize
    heads = b * h
    return Traffic(
        order="ideal",
        read={
            "Q": heads * tq * spec.d * size,
            "K": heads * tk * spec.d * size,
            "V": heads * tk * spec.d * size,
        },
        written={"O": heads * tq * spec.d * size, "LSE": heads * tq * LSE_BYTES},
        flops=attention_flops(spec, b, h, tq, tk),
    )


def math_unit(spec: KernelSpec) -> str:
    """Which units do the variant's matrix products: 'tensor cores' or 'CUDA cores'."""
    return "tensor cores" if spec.fam.tensor_cores else "CUDA cores"


def traffic_report(
    spec: KernelSpec,
    *,
    b: int = 1,
    h: int = 16,
    tq: int = 8192,
    tk: int = 8192,
    machine: Machine = H200,
) -> dict[str, Any]:
    """The traffic model for `spec` on one problem, as plain data (inspect's --json section).

    Raises ValueError for a length below 1.
    """
    for label, value in (("B", b), ("H", h), ("Tq", tq), ("Tk", tk)):
        if value < 1:
            raise ValueError(f"{label}={value}: must be >= 1; pass a real problem size")
    tensor = math_unit(spec) == "tensor cores"
    peak = machine.tensor_flops if tensor else machine.cuda_core_flops
    ridge = machine.tensor_ridge if tensor else machine.cuda_core_ridge
    orders: dict[str, Any] = {}
    for t in (
        flashgen_traffic(spec, b, h, tq, tk),
        seed_traffic(spec, b, h, tq, tk),
        ideal_traffic(spec, b, h, tq, tk),
    ):
        t_mem = t.total / machine.hbm_bytes_per_s
        t_math = t.flops / peak
        orders[t.order] = {
            "read": dict(t.read),
            "written": dict(t.written),
            "bytes_read": t.bytes_read,
            "bytes_written": t.bytes_written,
            "bytes_total": t.total,
            "intensity": round(t.intensity, 3),
            "bound": "compute" if t.intensity >= ridge else "memory",
            # the roofline's lower bound on the run time: the slower of the two roofs
            "time_lower_bound_s": max(t_mem, t_math),
        }
    kv_head = 2 * tk * spec.d * spec.dtype_info.itemsize
    return {
        "problem": {"B": b, "H": h, "Tq": tq, "Tk": tk, "d": spec.d, "dtype": spec.dtype},
        # K and V of one head: what the query tiles of that head re-read; when it fits in L2
        # (and few heads run at once) most re-reads are L2 hits, not HBM traffic
        "kv_bytes_per_head": kv_head,
        "kv_head_fits_l2": kv_head <= machine.l2_bytes,
        "causal": spec.causal,
        "flops": attention_flops(spec, b, h, tq, tk),
        "machine": {
            "name": machine.name,
            "hbm_bytes_per_s": machine.hbm_bytes_per_s,
            "tensor_flops": machine.tensor_flops,
            "cuda_core_flops": machine.cuda_core_flops,
            "l2_bytes": machine.l2_bytes,
            "tensor_ridge": round(machine.tensor_ridge, 3),
            "cuda_core_ridge": round(machine.cuda_core_ridge, 3),
        },
        "math_unit": math_unit(spec),
        "ridge": round(ridge, 3),
        "orders": orders,
    }


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def format_traffic(rep: dict[str, Any]) -> list[str]:
    """The human-readable lines of a `traffic_report` (inspect's traffic section)."""
    p, m, orders = rep["problem"], rep["machine"], rep["orders"]
    causal = ", causal (FLOPs halved)" if rep["causal"] else ""
    lines = [
        f"  traffic model  B={p['B']} H={p['H']} Tq={p['Tq']} Tk={p['Tk']} d={p['d']} "
        f"{p['dtype']}{causal}: {rep['flops'] / 1e9:.1f} GFLOP",
        f"    {m['name']}: {m['tensor_flops'] / 1e12:.0f} TFLOP/s tensor core / "
        f"{m['hbm_bytes_per_s'] / 1e12:.1f} TB/s = ridge {m['tensor_ridge']:.0f} FLOP/B; "
        f"CUDA-core fp32 {m['cuda_core_flops'] / 1e12:.0f} TFLOP/s: ridge "
        f"{m['cuda_core_ridge']:.0f} FLOP/B",
        f"    this variant's math runs on {rep['math_unit']}: ridge {rep['ridge']:.0f} FLOP/B",
    ]
    labels = {
        "flashgen": "flashgen order (query tile outer, K/V re-read per query tile)",
        "seed": "seed order (K/V tile outer; Q, O, m, l re-read and O, m, l re-written)",
        "ideal": "ideal (each tensor once: every re-read an L2 hit)",
    }
    for key, label in labels.items():
        o = orders[key]
        reads = ", ".join(f"{k} {_size(v)}" for k, v in o["read"].items())
        writes = ", ".join(f"{k} {_size(v)}" for k, v in o["written"].items())
        lines += [
            f"    {label}",
            f"      read {_size(o['bytes_read'])} ({reads}); written "
            f"{_size(o['bytes_written'])} ({writes})",
            f"      {o['intensity']:.1f} FLOP/B -> {o['bound']}-bound, at best "
            f"{o['time_lower_bound_s'] * 1e3:.3f} ms",
        ]
    fits = "fits" if rep["kv_head_fits_l2"] else "does not fit"
    lines.append(
        f"    K+V of one head ({_size(rep['kv_bytes_per_head'])}) {fits} in the "
        f"{_size(m['l2_bytes'])} L2; the model counts every re-read as HBM traffic, so real "
        "traffic lies between the flashgen and ideal rows"
    )
    return lines
