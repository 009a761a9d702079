"""Which elements of its aux tables a hook can read over a whole problem, checked before a launch.

The kernels read aux tables without bounds checks (hooks/aux.py: every index a hook computes
must be inside its table, both branches of a `where` included); a table shorter than the
problem it is used on (document ids for 1000 tokens on a 4096-token call) would be read past its
end: wrong output, or a fault. So the front doors ask `out_of_range` first: tiles.py's interval
rules over the whole problem (b in [0, B - 1], h in [0, H - 1], q_idx in [0, Tq - 1], kv_idx in
[0, Tk - 1], q_len and kv_len and the aux scalars as points) bound every index of every table
load; one whose range leaves the table's shape is named. An index the rules cannot bound (one
read from another table, or past an unsupported operation) is left to the contract: the check
is sound where it speaks, silent where it cannot tell.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flashgen.generator.hooks.expr import DType, postorder
from flashgen.generator.hooks.hook import Hook
from flashgen.generator.hooks.tiles import _ARITH, EITHER, FULL, Range, _where_range, clip


def out_of_range(
    hook: Hook, *, batch: int, heads: int, q_len: int, kv_len: int,
    shapes: Mapping[str, tuple[int, ...]], scalars: Mapping[str, float | int],
) -> str | None:  # fmt: skip
    """A message naming the first aux table `hook` can index outside its shape (`shapes` by aux
    name) on a problem of batch x heads x q_len x kv_len, with the aux scalars' values; None
    when every index the rules can bound stays inside."""
    inputs: dict[str, Range] = {
        "b": (0, batch - 1), "h": (0, heads - 1), "q_idx": (0, q_len - 1),
        "kv_idx": (0, kv_len - 1), "q_len": (q_len, q_len), "kv_len": (kv_len, kv_len),
    }  # fmt: skip
    if min(batch, heads, q_len, kv_len) < 1:
        return None  # nothing is evaluated
    ranges: dict[int, Range | None] = {}
    for n in postorder(hook.expr):
        args = [ranges.get(id(a)) for a in n.args]
        if n.op == "load" and n.value.name in shapes:
            shape = shapes[n.value.name]
            for axis, (r, size) in enumerate(zip(args, shape, strict=False)):
                if r is not None and r != FULL and (r[0] < 0 or r[1] >= size):
                    return _message(hook, n.value.name, axis, r, shape, n.value.ndim)
        ranges[id(n)] = _range(n, args, inputs, scalars)
    return None


def _range(
    n: Any, args: list[Range | None], inputs: Mapping[str, Range],
    scalars: Mapping[str, float | int],
) -> Range | None:  # fmt: skip
    """An int node's range over the problem, FULL where the rules cannot tell; None for a
    float or bool node (no index is computed from those but through a cast the rules leave)."""
    if n.dtype is not DType.INT:
        return None
    op = n.op
    if op == "const":
        return (n.value, n.value)
    if op == "input":
        return inputs.get(n.value, FULL)
    if op == "scalar":
        v = scalars.get(n.value.name)
        return (int(v), int(v)) if isinstance(v, (int, float)) else FULL
    if any(a is None for a in args):
        return FULL
    if op in _ARITH:
        return clip(_ARITH[op](*args))
    if op == "where":  # either branch may be taken somewhere in the problem
        return clip(_where_range(EITHER, args[1], args[2]))  # type: ignore[arg-type]
    return FULL  # a table's element (its values are not known here), or no rule


def _message(
    hook: Hook, name: str, axis: int, r: Range, shape: tuple[int, ...], ndim: int
) -> str:
    where = f"axis {axis} of " if ndim > 1 else ""
    return (
        f"aux {name}: the {hook.kind} {hook.name or hook.digest} reads {where}it at indices "
        f"{r[0]}..{r[1]} on this call, but it has shape {tuple(shape)} (the kernels read aux "
        "tables unchecked); pass a table covering every index the call reaches, or clamp the "
        "index in the hook: hk.minimum(hk.maximum(i, 0), n - 1)"
    )
