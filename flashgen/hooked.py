"""Attention with user hooks on torch tensors: `flashgen.torch.attention(..., score_mod=...,
mask_mod=..., aux={...})` lands here.

A hook is a traced `Hook` (`flashgen.generator.hooks.trace_score_mod(fn, hk.Aux(...))`) or a
plain function of the hook's arguments without aux, traced on first use. The forward runs the
variant an unhooked call would (family wgmma's on Hopper) compiled with the hooks, or family
mma's where that one refuses them, and so does the backward (docs/hooks.md): the custom ops
`torch.ops.flashgen.hooked_attention` and `hooked_attention_backward` (fake implementations
for torch.compile; CUDA-graph safe like `flashgen.torch.attention`). The hooks travel through
the ops as their feature tokens (`scoremod<digest>,maskmod<digest>`, registered in this
process by the front door), and their aux values as three lists in the order of the kernel's
aux block (`features.hook.slots`): tensors, float scalars, int scalars. The tensor list may
then hold, after the aux tensors, the range summary of each table a mask_mod reads at a range
of indices (`features.hook.summary_slots`; `doc_ids[q_idx]`); without them (what the front
door passes) the op builds them itself on the current stream, one small kernel per table
(runtime/summary_kernel.py; `range_summary`'s torch ops for a table too long for it), so a call
costs one launch for them, not ~20 torch ops of host time (bench/NOTES.md, twentieth session).
Family wgmma's forward skips tiles with them. Where the mask reads a table at ranges, the op
also builds block maps (runtime/block_map.py: the tile verdicts made once, before the kernel,
read as bits) for wgmma's forward and backward, or takes the ones a caller built once with
`block_map` and passes to every call (`BlockMap`; two tensors after the summaries, their
tiles as four ints after the hooks' ints).

Aux tensors are int32 or float32 on q's device, 1-D or 2-D as declared, the last axis
contiguous; the kernels read them without bounds checks (docs/hooks.md: clamp indices in the
hook). Gradients flow to q, k and v, not to aux values.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import threading
from collections.abc import Iterator, Mapping
from typing import Any

try:
    import torch
except ImportError as _exc:  # one line, says what is missing
    raise ImportError(
        f"flashgen.hooked needs PyTorch, which cannot be imported ({_exc}); install torch"
    ) from None

from flashgen.generator.arch import ARCHS
from flashgen.generator.features.hook import (
    HookArgs,
    Slot,
    hook_of,
    map_slot,
    slots,
    summary_slots,
    token_of,
)
from flashgen.generator.hooks import Hook
from flashgen.generator.hooks.summary import CHUNK, chunks, levels
from flashgen.generator.numerics import LOG2E
from flashgen.generator.spec import KernelSpec, SpecError
from flashgen.runtime import block_map as map_kernel
from flashgen.runtime import (
    feature_values,
    hook_spec,
    launch,
    op_args,
    summary_kernel,
)
from flashgen.runtime import gpu as runtime
from flashgen.runtime.hook_calls import (
    aux_slots,
    check_indices,
    empty_table,
    resolve_hooks,
    scalar,
)
from flashgen.runtime.validate import check_head_dims, check_layout, check_scale, check_spec
from flashgen.torch_support import (
    backward_family_for,
    dispatch_stack,
    eager_autograd,
    feature_args,
    function_modes,
    out_strides,
    raw_stream,
    run_backward,
)

_HOOK_FAMILY = hook_spec.HOOK_FAMILY  # compiles every hook in, forward and backward
_AUX_DTYPES = {"int32": torch.int32, "float32": torch.float32}


def _fail(msg: str) -> Any:
    raise ValueError(msg)


# ---- the front door's side: hooks and aux values into op arguments ---------------------------
def hook_op_args(
    score_mod: Any, mask_mod: Any, aux: Mapping[str, Any] | None, q: Any
) -> tuple[str, list[Any], list[float], list[int]]:
    """The hooks' op arguments: their tokens joined by commas, then the aux tensors (the op
    adds the range summaries of `summary_slots` itself: `_with_summaries`), float scalars and
    int scalars in the order of the kernel's aux block. ValueError naming the aux
    value and its rule when one does not fit its declaration (the tables' lengths against the
    call's sizes: `_check_indices`, where the op runs)."""
    hooks = list(resolve_hooks(score_mod, mask_mod))
    values = dict(aux or {})
    block = aux_slots(tuple(hooks), values)
    tensors: list[Any] = []
    floats: list[float] = []
    ints: list[int] = []
    for s in block:
        v = values[s.aux.name]
        if s.kind == "ptr":
            tensors.append(_aux_tensor(s, v, q))
        elif s.kind == "float":
            floats.append(float(scalar(s, v)))
        else:
            ints.append(int(scalar(s, v)))
    for s in summary_slots(hooks):
        if values[s.aux.name].numel() == 0:
            _fail(empty_table(s.aux.name))
    return ",".join(token_of(h) for h in hooks), tensors, floats, ints


def range_summary(table: Any) -> Any:
    """The range summary of a 1-D int32 tensor (hooks/summary.py's layout, int32 of shape
    (levels, 2, chunks), as `summarize` builds it on the host) on the tensor's device, with
    torch ops only: no host sync, so it can run inside a CUDA graph and be traced by
    torch.compile (which specializes on the table's length: the summary's shape follows it).
    About levels + 6 small kernels: a sparse table, level k built from level k - 1 in one op."""
    n = int(table.shape[0])  # the summary's shape is a function of n: a concrete length
    nc, n_levels = chunks(n), levels(n)
    # chunk min and max: pad with the last element (no chunk's min or max changes)
    padded = torch.cat([table, table[-1:].expand(nc * CHUNK - n)])
    lo, hi = torch.aminmax(padded.view(nc, CHUNK), dim=1)
    # max as a min of ~x (~ reverses the order without overflow): one minimum per level builds
    # both rows; padded with the last chunk so that level k's run at i stops at chunk nc - 1
    run = torch.stack([lo, hi.bitwise_not()])
    run = torch.cat([run, run[:, -1:].expand(2, (1 << (n_levels - 1)) - 1)], dim=1)
    runs = [run]
    for k in range(1, n_levels):
        w = 1 << (k - 1)
        run = torch.minimum(run[:, :-w], run[:, w:])
        runs.append(run)
    out = torch.stack([r[:, :nc] for r in runs])
    out[:, 1].bitwise_not_()
    return out


@functools.lru_cache(maxsize=256)
def _summary_plan(hooks: str) -> tuple[int, tuple[int, ...]]:
    """(aux tensors the hooks take, the tensor index of each table `summary_slots` names)."""
    tokens = _hooks(hooks)
    block = slots(tokens)
    tables = tuple(
        next(b.index for b in block if b.kind == "ptr" and b.aux == s.aux)
        for s in summary_slots(tokens)
    )  # fmt: skip
    return sum(s.kind == "ptr" for s in block), tables


@functools.lru_cache(maxsize=16)
def _summary_arch(dev: int) -> str | None:
    arch = _arch(dev)
    return arch if arch in ARCHS else None


def _with_summaries(hooks: str, aux_tensors: list[Any], q: Any) -> list[Any]:
    """The op's aux tensors with the range summaries the hooks read appended, built here on
    q's device and current stream (one `summary_kernel` launch per table; torch ops for a
    table too long for it), when the caller passed none. As they are: when the hooks read
    none, when the caller passed them, or when a table is not a non-empty contiguous 1-D
    int32 tensor on q's device (`_hook_args` and the front door name what is wrong; the
    verdicts do without)."""
    n_tables, tables = _summary_plan(hooks)
    if not tables or len(aux_tensors) != n_tables:
        return aux_tensors
    dev = q.device
    summaries = []
    for i in tables:
        t = aux_tensors[i]
        if not (
            type(t) is torch.Tensor and t.dtype == torch.int32 and t.dim() == 1
            and t.device == dev and t.stride(0) == 1 and t.shape[0] > 0
        ):  # fmt: skip
            return aux_tensors
        n = int(t.shape[0])
        arch = _summary_arch(dev.index)
        if arch is None or not summary_kernel.fits(n):
            summaries.append(range_summary(t))
            continue
        out = torch.empty((levels(n), 2, chunks(n)), dtype=torch.int32, device=dev)
        summary_kernel.launch(t.data_ptr(), n, out.data_ptr(), raw_stream(dev.index),
                              dev.index, arch)  # fmt: skip
        summaries.append(out)
    return [*aux_tensors, *summaries]


def _aux_tensor(slot: Slot, v: Any, q: Any) -> Any:
    a = slot.aux
    if not isinstance(v, torch.Tensor):
        _fail(f"aux {a.name}: a {type(v).__name__}; pass a torch tensor on q's device")
    if v.dtype != _AUX_DTYPES[a.dtype] or v.dim() != a.ndim:
        _fail(
            f"aux {a.name}: {v.dtype} with {v.dim()} dimensions; the hook declares {a.dtype} "
            f"with {a.ndim}: pass {a.name}.to(torch.{a.dtype})"
        )
    if v.device != q.device:
        _fail(f"aux {a.name} on {v.device}, q on {q.device}: move it with .to(q.device)")
    if v.stride(-1) != 1 or (a.ndim == 2 and v.stride(0) < v.shape[1]):
        _fail(f"aux {a.name}: its last axis must be contiguous; pass {a.name}.contiguous()")
    return v


# ---- the ops' side: op arguments into a launch ---------------------------------------------
def _hooks(tokens: str) -> tuple[Hook, ...]:
    return tuple(hook_of(t) for t in tokens.split(",") if t)


def _by_name(
    hooks: tuple[Hook, ...], tensors: list[Any], floats: list[float], ints: list[int]
) -> dict[str, Any]:
    """The op's aux lists back into values by aux name (the aux block's slot order)."""
    it: dict[str, Iterator[Any]] = {"ptr": iter(tensors), "float": iter(floats), "int": iter(ints)}
    return {s.aux.name: next(it[s.kind]) for s in slots(hooks)}


def _check_indices(
    hooks: tuple[Hook, ...], tensors: list[Any], floats: list[float], ints: list[int],
    q: Any, k: Any,
) -> None:  # fmt: skip
    """ValueError when a hook can index one of the aux tables outside its shape on this call's
    (B, H, Tq) x Tk sizes (`hook_calls.check_indices`). Where the op runs, on a signature's
    first call (the signature holds the tables' shapes and the scalars): eager and compiled
    calls alike, and no tracing of the analysis."""
    b, h, tq = (int(n) for n in q.shape[:3])
    check_indices(hooks, _by_name(hooks, tensors, floats, ints), batch=b, heads=h, q_len=tq,
                  kv_len=int(k.shape[2]))  # fmt: skip


def _hook_args(hooks: tuple[Hook, ...], tensors: list[Any], floats: list[float],
               ints: list[int], block_map: int | None = None) -> HookArgs:  # fmt: skip
    """The launcher's aux values (`HookArgs`) from the op's lists: the aux tensors, then the
    range summaries (all of `summary_slots`, or none: the verdicts do without); `block_map`
    the address of a block map for the map slot, or None."""
    block, wanted = slots(hooks), summary_slots(hooks)
    n_tables = sum(s.kind == "ptr" for s in block)
    given = tensors[n_tables:]
    if len(given) not in (0, len(wanted)):
        _fail(
            f"aux_tensors: {len(tensors)} tensors; the hooks take {n_tables} aux tensors, then "
            f"either no range summaries or one per table {[s.aux.name for s in wanted]}: pass "
            "the lists hook_op_args makes"
        )
    values = _by_name(hooks, tensors, floats, ints)
    for s in block:
        if s.kind == "ptr":
            v = values[s.aux.name]
            values[s.aux.name] = (v.data_ptr(), v.stride(0)) if s.aux.ndim == 2 else v.data_ptr()
    summaries: dict[str, tuple[int, int]] = {}
    for s, summary in zip(wanted, given, strict=False):
        table = next(b for b in block if b.kind == "ptr" and b.aux == s.aux)
        n = int(tensors[table.index].shape[0])
        shape = (levels(n), 2, chunks(n)) if n else ()
        if (
            tuple(summary.shape) != shape
            or summary.dtype != torch.int32
            or not summary.is_contiguous()
            or summary.device != tensors[0].device
        ):
            _fail(
                f"range summary of aux {s.aux.name}: {summary.dtype} {tuple(summary.shape)} on "
                f"{summary.device}; a table of {n} entries takes a contiguous int32 {shape} "
                "on its device: pass flashgen.hooked.range_summary(table)"
            )
        summaries[s.aux.name] = (summary.data_ptr(), n)
    return HookArgs(hooks, values, summaries, block_map)


def _key_of(x: Any) -> tuple[Any, ...]:
    return (tuple(x.shape), x.stride(), x.dtype, x.device, x.data_ptr())


def _aux_key(x: Any) -> tuple[Any, ...]:
    """An aux tensor's part of a signature: its layout and alignment, not its address. The
    launch takes each call's aux pointers (`hook_ptrs`): a range summary is a fresh tensor on
    every call, and a signature keyed on its address re-planned the launch whenever the
    allocator handed out another block (H200: ~0.6 ms of host time per call, bench/NOTES.md)."""
    return (tuple(x.shape), x.stride(), x.dtype, x.device, x.data_ptr() & 15)


def _arch(dev: int) -> str:
    return "sm_{}{}".format(*torch.cuda.get_device_capability(dev))


_entries: dict[tuple[Any, ...], Any] = {}
_lock = threading.Lock()


def _forward_spec(problem: Any, causal: bool, dev: int, tokens: tuple[str, ...]) -> KernelSpec:
    """The hooked forward's variant on torch's CUDA device `dev` (`hook_spec.forward_spec`)."""
    return hook_spec.forward_spec(
        problem, causal, _arch(dev), torch.cuda.get_device_name(dev), tokens
    )  # fmt: skip


def _run(
    q: Any, k: Any, v: Any, causal: bool, scale: float | None, hooks: str,
    aux_tensors: list[Any], aux_floats: list[float], aux_ints: list[int], *rest: Any,
) -> tuple[Any, Any]:  # fmt: skip
    """The CUDA forward: signature lookup, allocate, launch on the current stream. `rest`:
    the feature arguments, then `deterministic` (for the backward only)."""
    feature_arguments = rest[: op_args.N_FEATURE_ARGS]
    values = op_args.values_of(feature_arguments)
    aux_tensors, aux_ints, given = _given_maps(hooks, aux_tensors, aux_ints)
    aux_tensors = _with_summaries(hooks, aux_tensors, q)
    key = (  # layouts and alignments, not addresses: the launch takes each call's pointers
        "fwd", *(_key_of(x)[:4] for x in (q, k, v)), tuple(x.data_ptr() & 15 for x in (q, k, v)),
        causal, scale, hooks,
        tuple(_aux_key(t) for t in aux_tensors), tuple(aux_floats), tuple(aux_ints),
        given.key() if given is not None else None, feature_values.signature(values, _key_of),
    )  # fmt: skip
    e = _entries.get(key)
    if e is None:
        if causal is not True and causal is not False:
            _fail(f"causal={causal!r}: must be True or False")
        problem = check_layout(q, k, v)
        check_head_dims(problem)
        value = check_scale(scale, problem.d)
        dev = int(q.get_device())
        features = feature_args(values, q, problem.h)
        tokens = _hooks(hooks)
        _check_indices(tokens, aux_tensors, aux_floats, aux_ints, q, k)
        spec = _forward_spec(problem, causal, dev, (*features.tokens, *hooks.split(",")))
        made = runtime.device_plan(spec, _arch(dev), dev)
        shape = (*(int(n) for n in q.shape[:3]), int(v.shape[3]))
        o_stride = out_strides(shape, tuple(int(s) for s in q.stride()))  # q's layout
        o = torch.empty_strided(shape, o_stride, dtype=q.dtype, device=q.device)
        lse = torch.empty(shape[:3], dtype=torch.float32, device=q.device)
        full = check_layout(q, k, v, o=o, lse=lse)
        check_spec(spec, full, check_pointers=True)
        bare = dataclasses.replace(
            full, q_ptr=None, k_ptr=None, v_ptr=None, o_ptr=None, lse_ptr=None
        )
        maps = _map_plan(spec, hooks, aux_tensors, q, k, dev)
        if maps is not None and given is not None:
            given.check(maps, spec, q)
        # a launch binds which aux slots are set; the map's address is each call's own
        # (`_call_maps`), so the slot is bound with a stand-in here
        placeholder = _MAP_STAND_IN if _reads_map(maps, given) else None
        bound = made.bind(
            bare, value * LOG2E, features,
            hooks=_hook_args(tokens, aux_tensors, aux_floats, aux_ints, block_map=placeholder),
        )  # fmt: skip
        e = (bound, shape, o_stride, q.device, q.dtype, tokens, maps)
        launch.remember(_entries, key, e)
    bound, shape, o_stride, device, dtype, tokens, maps = e
    o = torch.empty_strided(shape, o_stride, dtype=dtype, device=device)
    lse = torch.empty(shape[:3], dtype=torch.float32, device=device)
    args = _hook_args(tokens, aux_tensors, aux_floats, aux_ints)
    stream = raw_stream(device.index)
    ptrs, held = _call_maps(maps, given, args, device, stream)  # held: alive until launched
    bound(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), stream,
          hook_ptrs=ptrs)  # fmt: skip
    del held
    return o, lse


_MAP_STAND_IN = 1 << 12
"""A nonzero, aligned address a launch is bound with in the map slot; never read (each call
passes its own map's address)."""


@dataclasses.dataclass(frozen=True)
class _MapPlan:
    """A signature's block map (runtime/block_map.py): its layout and slot; `build`: whether
    the op builds one on each call when the caller passed none."""

    tokens: tuple[str, ...]
    layout: map_kernel.Layout
    tq: int
    tk: int
    slot: int
    arch: str
    build: bool


def _map_plan(spec: KernelSpec, hooks: str, aux_tensors: list[Any], q: Any, k: Any,
              dev: int) -> _MapPlan | None:  # fmt: skip
    """The block map this signature's forward or backward (`spec.direction`) reads: family
    wgmma's kernels do, when the aux block has a slot for it (None otherwise: a map passed
    is not read, and the kernels evaluate the mask as they would). The op builds one itself
    (`build`) where it pays: a mask_mod that reads a table at ranges (its in-kernel verdicts
    wait on the table's range summary; a table-free mask's verdicts are a few integer
    operations) whose summaries the op built."""
    tokens = tuple(hooks.split(","))
    slot = map_slot(_hooks(hooks))
    arch = _summary_arch(dev)
    if spec.family != "wgmma" or slot is None or arch is None:
        return None
    n_tables, tables = _summary_plan(hooks)
    b, h, tq = (int(n) for n in q.shape[:3])
    tk = int(k.shape[2])
    lay = map_kernel.layout(tokens, b, h, tq, tk, spec.br, spec.bc, spec.direction == "bwd")
    build = bool(tables) and len(aux_tensors) == n_tables + len(tables)
    return _MapPlan(tokens, lay, tq, tk, slot, arch, build)


@dataclasses.dataclass(frozen=True)
class _GivenMaps:
    """Block maps the caller built (`flashgen.torch.block_map`): the forward's and the
    backward's int32 tensors, and the (br, bc) tiles they were built for, forward then
    backward."""

    forward: Any
    backward: Any
    tiles: tuple[int, int, int, int]

    def key(self) -> tuple[Any, ...]:
        return (self.tiles, _aux_key(self.forward), _aux_key(self.backward))

    def check(self, plan: _MapPlan, spec: KernelSpec, q: Any) -> Any:
        """The map for `plan`'s direction, checked against it (ValueError naming the
        difference); the tensor."""
        back = plan.layout.backward
        t = self.backward if back else self.forward
        tile = self.tiles[2:] if back else self.tiles[:2]
        lay = plan.layout
        if (
            tile != (lay.br, lay.bc) or type(t) is not torch.Tensor or t.dtype != torch.int32
            or not t.is_contiguous() or t.device != q.device or t.numel() != lay.size
        ):  # fmt: skip
            _fail(
                f"block_map: its {'backward' if back else 'forward'} map was built for a "
                f"{tile[0]} x {tile[1]} tile ({t.numel()} int32 on {t.device}); this call's "
                f"{spec.name} reads one for a {lay.br} x {lay.bc} tile, {lay.size} contiguous "
                "int32 on q's device: build the block map with flashgen.torch.block_map for "
                "this call's q, k, causal and hooks"
            )
        return t


def _given_maps(hooks: str, aux_tensors: list[Any], aux_ints: list[int]
                ) -> tuple[list[Any], list[int], _GivenMaps | None]:  # fmt: skip
    """The op's aux lists without the caller's block maps, and the maps: two tensors after
    the range summaries and four ints, their tiles, after the hooks' int scalars (how
    `flashgen.torch.block_map` passes them); the lists as they are without."""
    n_ints = sum(s.kind == "int" for s in slots(_hooks(hooks)))
    if len(aux_ints) != n_ints + 4:
        return aux_tensors, aux_ints, None
    n_tables, tables = _summary_plan(hooks)
    if len(aux_tensors) != n_tables + len(tables) + 2:
        _fail(
            f"aux_tensors: {len(aux_tensors)} tensors with a block map's four tile ints; a "
            f"block map travels as two tensors after the {n_tables} aux tensors and "
            f"{len(tables)} range summaries: pass flashgen.torch.block_map's object"
        )
    tiles = tuple(int(i) for i in aux_ints[n_ints:])
    given = _GivenMaps(aux_tensors[-2], aux_tensors[-1], tiles)  # type: ignore[arg-type]
    return aux_tensors[:-2], aux_ints[:n_ints], given


def _call_maps(plan: _MapPlan | None, given: _GivenMaps | None, args: HookArgs,
               device: Any, stream: int) -> tuple[tuple[int, ...], Any]:  # fmt: skip
    """(The aux block's pointers for this call, what holds its block map alive): the caller's
    map, or one built here (`_build_block_map`) where the plan says so, or none."""
    ptrs = args.pointers()
    if plan is None or (given is None and not plan.build):
        return ptrs, None
    if given is not None:
        t = given.backward if plan.layout.backward else given.forward
    else:
        t = _build_block_map(plan, args, device, stream)
    return tuple(t.data_ptr() if i == plan.slot else p for i, p in enumerate(ptrs)), t


def _reads_map(plan: _MapPlan | None, given: _GivenMaps | None) -> bool:
    return plan is not None and (given is not None or plan.build)


def _build_block_map(plan: _MapPlan, args: HookArgs, device: Any, stream: int) -> Any:
    """A block map built on `stream` from the call's aux values. The caller holds it until
    the kernel that reads it is enqueued: freed earlier, torch's allocator hands its memory to
    the next allocation on the stream (the backward's scratch), whose writes land before the
    kernel reads it."""
    out = torch.empty(plan.layout.size, dtype=torch.int32, device=device)
    map_kernel.launch(plan.tokens, plan.layout, plan.tq, plan.tk, args.kernel_args(),
                      out.data_ptr(), stream, device.index, plan.arch)  # fmt: skip
    return out


def _backward_spec(
    problem: Any, causal: bool, dev: int, deterministic: bool, tokens: tuple[str, ...],
    tensors: tuple[Any, ...],
) -> KernelSpec:  # fmt: skip
    """The backward variant an unhooked call would run (`backward_family_for`: family wgmma's
    on Hopper where the call fits its rules), compiled with the hooks and features; family
    mma's where that one refuses them. Why the first: wgmma's backward recomputes P with the
    same lowered score_mod as wgmma's forward, and runs at the built-in backward's speed."""
    det = ("deterministic",) if deterministic else ()
    family = backward_family_for(_arch(dev), problem, deterministic, tensors)
    for fam in dict.fromkeys((family, _HOOK_FAMILY)):
        try:
            return KernelSpec(
                family=fam, d=problem.d, dtype=problem.dtype, causal=causal, direction="bwd",
                features=(*tokens, *det),
            )  # fmt: skip
        except SpecError:
            if fam == _HOOK_FAMILY:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _run_backward(
    q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, causal: bool, scale: float | None,
    deterministic: bool, hooks: str, aux_tensors: list[Any], aux_floats: list[float],
    aux_ints: list[int], *feature_arguments: Any,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """The CUDA backward: the hooked backward variant (`_backward_spec`) on the current stream
    (fp32 scratch from torch's allocator), nothing synchronized."""
    from flashgen.runtime import backward

    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    do = do if tuple(do.stride()) == tuple(o.stride()) else do.contiguous()
    values = op_args.values_of(feature_arguments)
    aux_tensors, aux_ints, given = _given_maps(hooks, aux_tensors, aux_ints)
    aux_tensors = _with_summaries(hooks, aux_tensors, q)
    tensors = (q, k, v, o, lse, do)
    key = (
        "bwd", *(_key_of(x)[:4] for x in tensors), tuple(t.data_ptr() & 15 for t in tensors),
        causal, scale, bool(deterministic), hooks, tuple(_aux_key(t) for t in aux_tensors),
        tuple(aux_floats), tuple(aux_ints), given.key() if given is not None else None,
        feature_values.signature(values, _key_of),
    )  # fmt: skip
    hit = _entries.get(key)
    if hit is None:
        problem = check_layout(q, k, v)
        dev = int(q.get_device())
        features = feature_args(values, q, problem.h)
        spec = _backward_spec(problem, bool(causal), dev, bool(deterministic),
                              (*features.tokens, *hooks.split(",")), tensors)  # fmt: skip
        plan = runtime.device_plan(spec, _arch(dev), dev)
        bp = backward.validate_backward(spec, q, k, v, o, lse, do, dq, dk, dv)
        value = check_scale(scale, problem.d)
        tokens = _hooks(hooks)
        _check_indices(tokens, aux_tensors, aux_floats, aux_ints, q, k)
        maps = _map_plan(spec, hooks, aux_tensors, q, k, dev)
        if maps is not None and given is not None:
            given.check(maps, spec, q)
        placeholder = _MAP_STAND_IN if _reads_map(maps, given) else None  # as the forward's
        args = _hook_args(tokens, aux_tensors, aux_floats, aux_ints, block_map=placeholder)
        hit = (backward.Prepared(plan, spec, bp, value * LOG2E, features, hooks=args), dev,
               tokens, maps)  # fmt: skip
        launch.remember(_entries, key, hit)
    prepared, dev, tokens, maps = hit
    call = _hook_args(tokens, aux_tensors, aux_floats, aux_ints)
    stream = raw_stream(dev)
    ptrs, held = _call_maps(maps, given, call, q.device, stream)  # held: alive until launched
    run_backward(prepared, (q, k, v, o, lse, do, dq, dk, dv), stream, hook_ptrs=ptrs)
    del held
    return dq, dk, dv


def _fake(
    q: Any, k: Any, v: Any, causal: bool, scale: float | None, hooks: str,
    aux_tensors: list[Any], aux_floats: list[float], aux_ints: list[int], *rest: Any,
) -> tuple[Any, Any]:  # fmt: skip
    op_args.values_of(rest[: op_args.N_FEATURE_ARGS])  # the scalar features' checks
    o_shape = (*tuple(q.shape)[:3], v.shape[3])
    o = q.new_empty_strided(o_shape, out_strides(o_shape, tuple(q.stride())))  # as _run's
    return o, q.new_empty(tuple(q.shape[:3]), dtype=torch.float32)


def _fake_backward(
    q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, *rest: Any
) -> tuple[Any, Any, Any]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx: Any, inputs: Any, output: Any) -> None:
    q, k, v, causal, scale, hooks, aux_tensors, aux_floats, aux_ints, *rest = inputs
    n = op_args.N_FEATURE_ARGS
    feature_arguments = rest[:n]
    ctx.deterministic = rest[n]
    ctx.causal, ctx.scale, ctx.hooks = causal, scale, hooks
    ctx.aux_floats, ctx.aux_ints, ctx.n_aux = list(aux_floats), list(aux_ints), len(aux_tensors)
    arrays = [a if isinstance(a, torch.Tensor) else None for a in feature_arguments]
    ctx.feature_arguments = tuple(
        None if isinstance(a, torch.Tensor) else a for a in feature_arguments
    )
    o, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, o, lse, *aux_tensors, *arrays)


def _backward(ctx: Any, grad_o: Any, grad_lse: Any) -> Any:
    q, k, v, o, lse, *rest = ctx.saved_tensors
    aux_tensors, arrays = rest[: ctx.n_aux], rest[ctx.n_aux :]
    # one entry per input in the inputs' structure, which torch checks: causal, scale, hooks,
    # aux_tensors (a list: a None per tensor), aux_floats, aux_ints (a number list: None; an
    # empty list: []), the features, deterministic
    none = (None, None, None, [None] * ctx.n_aux, [] if not ctx.aux_floats else None,
            [] if not ctx.aux_ints else None, *(None,) * op_args.N_FEATURE_ARGS, None)  # fmt: skip
    if grad_o is None:
        return (None, None, None, *none)
    feature_arguments = tuple(
        t if a is None else a for a, t in zip(ctx.feature_arguments, arrays, strict=True)
    )
    dq, dk, dv = _BWD_OP(
        q, k, v, o, lse, grad_o, ctx.causal, ctx.scale, ctx.deterministic, ctx.hooks,
        list(aux_tensors), ctx.aux_floats, ctx.aux_ints, *feature_arguments,
    )  # fmt: skip
    return (dq, dk, dv, *none)


# No defaults in the forward's schema: the dispatcher drops trailing arguments equal to their
# defaults before autograd sees them, and with a tensor list among the inputs torch wants the
# backward's gradients in exactly the structure of what is left. With every argument always
# passed (hooked_attention does), _backward returns one entry per schema argument.
_FEATURES_NO_DEFAULTS = re.sub(r"=[^,]+", "", op_args.FEATURE_SCHEMA)
SCHEMA = (
    "hooked_attention(Tensor q, Tensor k, Tensor v, bool causal, float? scale, str hooks, "
    "Tensor[] aux_tensors, float[] aux_floats, int[] aux_ints, "
    f"{_FEATURES_NO_DEFAULTS}, bool deterministic) -> (Tensor, Tensor)"
)
BWD_SCHEMA = (
    "hooked_attention_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor do, "
    "bool causal, float? scale, bool deterministic, str hooks, Tensor[] aux_tensors, "
    f"float[] aux_floats, int[] aux_ints, {op_args.FEATURE_SCHEMA}) -> (Tensor, Tensor, Tensor)"
)
_library: Any = torch.library  # partly untyped: keep mypy --strict quiet with torch installed
_LIB: Any = _library.Library("flashgen", "FRAGMENT")
_LIB.define(SCHEMA)
_LIB.define(BWD_SCHEMA)
_LIB.impl("hooked_attention", _run, "CUDA")
_LIB.impl("hooked_attention_backward", _run_backward, "CUDA")
_library.register_fake("flashgen::hooked_attention", _fake, lib=_LIB)
_library.register_fake("flashgen::hooked_attention_backward", _fake_backward, lib=_LIB)
_library.register_autograd(
    "flashgen::hooked_attention", _backward, setup_context=_setup_context, lib=_LIB
)
_OP = torch.ops.flashgen.hooked_attention.default
_BWD_OP = torch.ops.flashgen.hooked_attention_backward.default


def _direct(q: Any, k: Any, v: Any, aux_tensors: list[Any]) -> bool:
    return (
        not torch.compiler.is_compiling()
        and type(q) is torch.Tensor and q.is_cuda
        and not (torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)))
        and not dispatch_stack() and not function_modes()
        and all(type(t) is torch.Tensor for t in aux_tensors)
    )  # fmt: skip


class _EagerHookedAttention(torch.autograd.Function):
    """`flashgen::hooked_attention` with its registered autograd formula (`_setup_context`,
    `_backward`), for eager calls only (`torch_support.eager_autograd`: the custom op's
    autograd wrapper costs ~250 us of host time per forward + backward). `apply(q, k, v, causal,
    scale, hooks, aux_floats, aux_ints, deterministic, n_aux, *aux_tensors, *features)`."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, q: Any, k: Any, v: Any, causal: bool, scale: float | None, hooks: str,
        aux_floats: list[float], aux_ints: list[int], deterministic: bool, n_aux: int,
        *rest: Any,
    ) -> tuple[Any, Any]:  # fmt: skip
        tensors, features = list(rest[:n_aux]), rest[n_aux:]
        args = (q, k, v, causal, scale, hooks, tensors, aux_floats, aux_ints, *features)
        o, lse = _run(*args)
        _setup_context(ctx, (*args, deterministic), (o, lse))
        return o, lse

    @staticmethod
    def backward(ctx: Any, grad_o: Any, grad_lse: Any) -> Any:  # type: ignore[override]
        dq, dk, dv, *_ = _backward(ctx, grad_o, grad_lse)
        return (dq, dk, dv, *(None,) * (7 + ctx.n_aux + len(ctx.feature_arguments)))


@dataclasses.dataclass(frozen=True, eq=False)
class BlockMap:
    """A hooked call's block maps, built once (`block_map`) and passed to every call of the
    same shapes, hooks and aux values (`flashgen.torch.attention(..., block_map=)`): across
    layers and steps, as FlexAttention's BlockMask. It holds the range summaries of the
    tables the mask reads and the forward's and backward's maps (runtime/block_map.py) for
    the variants those calls run, so a call builds neither. Its aux tensors are the ones it
    was built from: a call must pass those same tensors, unmodified (checked by identity and
    torch's version counter, in eager calls; a changed table needs a new map)."""

    hooks: str
    aux: tuple[Any, ...]
    versions: tuple[int, ...]
    summaries: tuple[Any, ...]
    forward: Any
    backward: Any
    tiles: tuple[int, int, int, int]
    sizes: tuple[int, int, int, int, int, int]  # B, H, Tq, Tk, d, dv
    dtype: Any
    causal: bool

    def op_args(self, hooks: str, tensors: list[Any], ints: list[int], q: Any, k: Any, v: Any,
                causal: bool) -> tuple[list[Any], list[int]]:  # fmt: skip
        """The op's aux lists with this map appended, after checking that the call is the
        one it was built for (ValueError naming the difference)."""
        b, h, tq, d = (int(n) for n in q.shape)
        sizes = (b, h, tq, int(k.shape[2]), d, int(v.shape[3]))
        if hooks != self.hooks:
            _fail("block_map: built for other hooks; build it with this call's score_mod and "
                  "mask_mod")  # fmt: skip
        if (sizes, q.dtype, bool(causal)) != (self.sizes, self.dtype, self.causal):
            _fail(
                f"block_map: built for (B, H, Tq, Tk, d, dv) = {self.sizes}, {self.dtype}, "
                f"causal={self.causal}; this call is {sizes}, {q.dtype}, causal={causal}: build "
                "one for these shapes"
            )
        # identity and version counters are eager facts: under torch.compile the tensors are
        # fakes, so there the shapes above are all that is checked
        checked = () if torch.compiler.is_compiling() else tensors
        for t, mine, version in zip(checked, self.aux, self.versions, strict=False):
            if t is not mine or t._version != version:
                _fail(
                    "block_map: built from other aux tensors, or they were modified since "
                    "(a map holds the verdicts of the tables it was built from): pass the same "
                    "unmodified tensors, or build a new map"
                )
        return [*tensors, *self.summaries, self.forward, self.backward], [*ints, *self.tiles]


def block_map(
    q: Any, k: Any, v: Any, *, mask_mod: Any, score_mod: Any = None,
    aux: Mapping[str, Any] | None = None, causal: bool = False,
) -> BlockMap:  # fmt: skip
    """The block maps of a hooked call (`BlockMap`): for calls of q, k, v's shapes, dtype and
    device with these hooks and aux values (features beside them must leave the variant's
    tile as it is: a call whose variant reads another tile is refused, naming it). Built on
    the current stream; no synchronization."""
    if q.device.type != "cuda":
        _fail(f"q on {q.device}: a block map is built on a CUDA device; move q with .cuda()")
    if mask_mod is None:
        _fail("mask_mod=None: a block map holds a mask_mod's tile verdicts; pass the mask_mod")
    if causal is not True and causal is not False:
        _fail(f"causal={causal!r}: must be True or False")
    hooks, tensors, floats, ints = hook_op_args(score_mod, mask_mod, aux, q)
    with_summaries = _with_summaries(hooks, tensors, q)
    problem = check_layout(q, k, v)
    dev = int(q.get_device())
    tokens = tuple(hooks.split(","))
    n_tables, _ = _summary_plan(hooks)
    hooks_ = _hooks(hooks)
    _check_indices(hooks_, tensors, floats, ints, q, k)
    fwd = _forward_spec(problem, causal, dev, tokens)
    bwd = _backward_spec(problem, causal, dev, False, tokens, (q, k, v))
    stream = raw_stream(dev)
    maps = []
    for spec in (fwd, bwd):
        plan = _map_plan(spec, hooks, with_summaries, q, k, dev)
        if plan is None:  # a kernel that reads no map: an empty one
            maps.append(torch.empty(0, dtype=torch.int32, device=q.device))
            continue
        args = _hook_args(hooks_, with_summaries, floats, ints)
        maps.append(_build_block_map(plan, args, q.device, stream))
    b, h, tq = (int(n) for n in q.shape[:3])
    sizes = (b, h, tq, int(k.shape[2]), problem.d, problem.value_dim)
    return BlockMap(
        hooks=hooks, aux=tuple(tensors), versions=tuple(t._version for t in tensors),
        summaries=tuple(with_summaries[n_tables:]), forward=maps[0], backward=maps[1],
        tiles=(fwd.br, fwd.bc, bwd.br, bwd.bc), sizes=sizes, dtype=q.dtype, causal=causal,
    )  # fmt: skip


def hooked_attention(
    q: Any, k: Any, v: Any, *, score_mod: Any, mask_mod: Any, aux: Mapping[str, Any] | None,
    causal: bool, scale: float | None, deterministic: bool, feature_arguments: tuple[Any, ...],
    block_map: BlockMap | None = None,
) -> tuple[Any, Any]:  # fmt: skip
    """(O, LSE) of `flashgen.torch.attention` with hooks (its docstring; module docstring)."""
    if q.device.type != "cuda":
        _fail(f"q on {q.device}: hooked attention runs on a CUDA device; move it with .cuda()")
    hooks, tensors, floats, ints = hook_op_args(score_mod, mask_mod, aux, q)
    if block_map is not None:
        tensors, ints = block_map.op_args(hooks, tensors, ints, q, k, v, causal)
    args = (q, k, v, causal, scale, hooks, tensors, floats, ints, *feature_arguments)
    if _direct(q, k, v, tensors):
        return _run(*args)
    arrays = [a for a in feature_arguments if isinstance(a, torch.Tensor)]
    if eager_autograd(q, k, v, [*tensors, *arrays]):
        return _EagerHookedAttention.apply(  # type: ignore[no-any-return, no-untyped-call]
            q, k, v, causal, scale, hooks, floats, ints, deterministic, len(tensors), *tensors,
            *feature_arguments,
        )  # fmt: skip
    return _OP(*args, deterministic)  # type: ignore[no-any-return]


def clear_cache() -> None:
    """Forget every validated signature (the loaded kernels stay cached)."""
    with _lock:
        _entries.clear()


__all__ = [
    "BWD_SCHEMA",
    "SCHEMA",
    "BlockMap",
    "block_map",
    "clear_cache",
    "hook_op_args",
    "hooked_attention",
    "range_summary",
]
