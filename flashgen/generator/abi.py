"""The kernel ABI, written once: every argument of the forward and backward kernels, in order.

One table per direction (`FWD`, `BWD`), plus each family's leading by-value arguments
(`Family.fwd_prefix`, `Family.bwd_prefix`: the Hopper tensor maps). From them come the kernel
signatures the templates print (`declarations`), the struct codes the Python launcher packs
(`struct_format`), the per-call pointers (`pointers`) and the bundle launcher's declarations
and argument lists, so adding a kernel argument is one row here.

A parameter's `ctype` names the storage element type `T` where it has one; `declarations`
substitutes the C type a template or launcher uses for it (`elem_t` in the kernels).
"""

from __future__ import annotations

from collections.abc import Sequence

from flashgen.generator.features import RUNTIME_FEATURES
from flashgen.generator.features.hook import HOOK_PARAMS, hook_tokens
from flashgen.generator.param import ROLES, Param


def _strides(*tensors: str) -> tuple[Param, ...]:
    """Batch, head and token strides (in elements) of each tensor: `q_sb, q_sh, q_st`, ..."""
    return tuple(
        Param(f"{t}_s{axis}", "long long", "q", "stride") for t in tensors for axis in "bht"
    )


# every run-time feature's arguments, in registry order (generator/features)
_FEATURES = tuple(p for f in RUNTIME_FEATURES for p in f.params)

FWD: tuple[Param, ...] = (
    Param("q", "const T*", "P", "tensor"),
    Param("k", "const T*", "P", "tensor"),
    Param("v", "const T*", "P", "tensor"),
    Param("o", "T*", "P", "tensor"),
    Param("lse", "float*", "P", "tensor"),
    Param("tq", "int", "i", "size"),
    Param("tk", "int", "i", "size"),
    *_strides("q", "k", "v", "o"),
    Param("scale_log2", "float", "f", "scalar", "softmax scale times log2(e): base-2 softmax"),
    Param("kv_group", "int", "i", "scalar", "query heads per K/V head (GQA/MQA)"),
    *_FEATURES,
)
"""The forward: q, k, v, o, lse; Tq, Tk; strides of q, k, v, o; scale_log2, kv_group; the
features' values (window sides -1 when unbounded, softcap 0 and a NULL pointer when off)."""

BWD: tuple[Param, ...] = (
    Param("q", "const T*", "P", "tensor"),
    Param("k", "const T*", "P", "tensor"),
    Param("v", "const T*", "P", "tensor"),
    Param("o", "const T*", "P", "tensor"),
    Param("dout", "const T*", "P", "tensor"),
    Param("lse", "const float*", "P", "tensor"),
    Param("d_buf", "float*", "P", "tensor"),
    Param("dq_accum", "float*", "P", "tensor"),
    Param("dq", "T*", "P", "tensor"),
    Param("dk", "T*", "P", "tensor"),
    Param("dv", "T*", "P", "tensor"),
    Param("tq", "int", "i", "size"),
    Param("tk", "int", "i", "size"),
    *_strides("q", "k", "v", "o", "do", "dq", "dk", "dv"),
    Param("scale_log2", "float", "f", "scalar", "softmax scale times log2(e): P in base 2"),
    Param("kv_group", "int", "i", "scalar", "query heads per K/V head (GQA/MQA)"),
    *_FEATURES,
)
"""The backward's three kernels (pre, main, post|dq) all take this list: the forward's tensors
and dO, the fp32 scratch (D and the dQ accumulator), the gradients; strides of all eight; then
as the forward."""


DECODE: tuple[Param, ...] = (
    Param("q", "const T*", "P", "tensor"),
    Param("k", "const T*", "P", "tensor", "K cache (B, Tk, H_kv, d) or (pages, page, H_kv, d)"),
    Param("v", "const T*", "P", "tensor", "the V cache, laid out as k"),
    Param("o", "T*", "P", "tensor"),
    Param("lse", "float*", "P", "tensor"),
    Param("o_part", "float*", "P", "tensor", "fp32 scratch: each split's O (n_splits > 1)"),
    Param("lse_part", "float*", "P", "tensor", "fp32 scratch: each split's base-2 LSE"),
    Param("counters", "int*", "P", "tensor", "one per row tile, zero between launches"),
    Param("cache_seqlens", "const int*", "P", "tensor", "keys per sequence (NULL: tk each)"),
    Param("block_table", "const int*", "P", "tensor", "pages of each sequence (NULL: contiguous)"),
    Param("tq", "int", "i", "size"),
    Param("tk", "int", "i", "size", "the cache's capacity per sequence (keys)"),
    Param("page_size", "int", "i", "size", "keys per page (paged)"),
    Param("bt_stride", "int", "i", "stride", "block_table's batch stride (elements)"),
    Param("n_pages", "int", "i", "size", "pages in the cache (paged)"),
    *_strides("q", "k", "v", "o"),
    Param("scale_log2", "float", "f", "scalar", "softmax scale times log2(e): base-2 softmax"),
    Param("kv_group", "int", "i", "scalar", "query heads per K/V head (GQA/MQA)"),
    *_FEATURES,
)
"""The decode kernel: q (B, Tq, H, d) and o as q; the K/V cache, contiguous or paged (k_sb is
then the page stride); lse (B, H, Tq) fp32; the split scratch and its counters; the cache
lengths and page table (either may be NULL); sizes; strides of q, k, v, o; then as the
forward."""


DECODE_COMBINE: tuple[Param, ...] = (
    Param("o", "T*", "P", "tensor"),
    Param("lse", "float*", "P", "tensor"),
    Param("o_part", "const float*", "P", "tensor", "the decode launch's per-split O (fp32)"),
    Param("lse_part", "const float*", "P", "tensor", "... and base-2 LSE"),
    Param("tq", "int", "i", "size"),
    Param("n_splits", "int", "i", "size", "splits per row tile of the decode launch (> 1)"),
    *_strides("o"),
    Param("kv_group", "int", "i", "scalar", "query heads per K/V head (GQA/MQA)"),
)
"""The decode variant's split merge, `<name>_combine` in the same source (sm_90: launched as a
programmatic dependent right after a decode launch given counters = NULL; runtime/decode.py):
o and lse as the decode kernel's; the split scratch it wrote; tq, its split count, o's strides
and kv_group. Grid (tq x kv_group, H_kv, B): one block per packed row."""


VARLEN: tuple[Param, ...] = (
    Param("cu_seqlens_q", "const int*", "P", "tensor", "VARLEN: q, o row starts (n_seqs + 1)"),
    Param("cu_seqlens_k", "const int*", "P", "tensor", "VARLEN: k, v row starts (n_seqs + 1)"),
    Param("n_seqs", "int", "i", "size", "VARLEN: sequences in the batch"),
)
"""A `varlen` variant's block after the forward's features: the sequences of packed q (o)
and k (v), as int32 prefix sums on the device. Such a variant sees q, k, v, o as one batch of
tq = total query and tk = total key tokens (the strides' batch entries unused) and lse as
(H, tq); each sequence is attended on its own (causal bottom-right per sequence)."""


VARLEN_FWD: tuple[Param, ...] = (
    *VARLEN,
    Param(
        "work_counter", "int*", "P", "tensor",
        "VARLEN: the dynamic scheduler's 2 ints, zero at launch (the kernel leaves them zero)",
    ),
)
"""A varlen forward's block: `VARLEN`, then the dynamic tile scheduler's counter
(templates/_scheduler.cuh.j2, varlen_persistent): two int32 words that are zero when the
launch starts and that no launch running at the same time uses; the kernel's last block puts
them back to zero, so a host may keep one pair per stream (or zero fresh words per call)."""


def forward(features: Sequence[str]) -> tuple[Param, ...]:
    """The forward's parameters for a variant with `features`: `FWD`, then the `VARLEN_FWD`
    block for a variant compiled with `varlen`, then the hooks' aux block
    (`features.hook.HOOK_PARAMS`) when the variant compiles in a hook. Only those variants
    take the blocks, so every other kernel's ABI is `FWD` unchanged."""
    params = (*FWD, *VARLEN_FWD) if "varlen" in features else FWD
    return (*params, *HOOK_PARAMS) if hook_tokens(features) else params


def backward(features: Sequence[str]) -> tuple[Param, ...]:
    """The backward kernels' parameters for a variant with `features`: `BWD`, then the
    `VARLEN` block for a variant compiled with `varlen` (family wgmma), then the hooks' aux
    block (`features.hook.HOOK_PARAMS`, as the forward takes it) when the variant compiles in a
    hook. All three kernels of such a variant take the blocks (one argument list); every other
    backward's ABI is `BWD` unchanged."""
    params = (*BWD, *VARLEN) if "varlen" in features else BWD
    return (*params, *HOOK_PARAMS) if hook_tokens(features) else params


def tensor_map(name: str) -> Param:
    """A by-value 128-byte TMA descriptor (`TensorMap` in the generated source)."""
    return Param(name, "TensorMap", "", "tensor_map")


def declarations(params: Sequence[Param], elem: str = "elem_t", restrict: bool = True) -> list[str]:
    """The C declarations of `params`, in order (`elem`: the element type's C spelling)."""
    return [p.declaration(elem, restrict) for p in params]


def struct_format(params: Sequence[Param]) -> str:
    """The `struct` codes of `params` (by-value blobs excluded: their builders pack them)."""
    return "".join(p.code for p in params)


def pointers(params: Sequence[Param]) -> tuple[str, ...]:
    """The names of the per-call device pointers (role `tensor`), in order."""
    return tuple(p.name for p in params if p.role == "tensor")


__all__ = [
    "BWD", "DECODE", "DECODE_COMBINE", "FWD", "HOOK_PARAMS", "ROLES", "VARLEN", "VARLEN_FWD",
    "Param", "backward", "declarations", "forward", "pointers", "struct_format", "tensor_map",
]  # fmt: skip
