"""A call's hooks and aux values, checked the same way by every front door that takes hooks
(`flashgen.torch.attention`, `flashgen.attention`): the hooks resolved from what the caller
passed, the aux names against the hooks' declarations, the scalars against their dtypes.
Arrays are each front door's own (torch tensors, NumPy arrays, GPUArrays)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from flashgen.generator.features.hook import Slot, slots
from flashgen.generator.hooks import Hook
from flashgen.generator.hooks.bounds import out_of_range
from flashgen.generator.hooks.trace import as_hook


def resolve_hook(value: Any, kind: str) -> Hook:
    """`value` as a traced hook of `kind`: a Hook as it is, a function traced without aux."""
    if not isinstance(value, Hook) and not callable(value):
        raise ValueError(
            f"{kind}={value!r}: must be a traced hook (flashgen.generator.hooks) or a function"
        )
    try:
        hook = as_hook(value, kind)
    except Exception as exc:  # the tracer's message says what the function may not do
        raise ValueError(
            f"{kind}={getattr(value, '__name__', value)!r}: tracing it failed "
            f"({type(exc).__name__}: {exc}); a hook that reads aux values is traced first: "
            f"hk.trace_{kind}(fn, hk.Aux(...)) (docs/hooks.md)"
        ) from None
    if hook.kind != kind:
        raise ValueError(f"{kind}: the hook given is a {hook.kind}; pass it as {hook.kind}=")
    return hook


def resolve_hooks(score_mod: Any, mask_mod: Any) -> tuple[Hook, ...]:
    """The call's hooks, score_mod first (the kernel's aux block order); () for none."""
    hooks = []
    if score_mod is not None:
        hooks.append(resolve_hook(score_mod, "score_mod"))
    if mask_mod is not None:
        hooks.append(resolve_hook(mask_mod, "mask_mod"))
    return tuple(hooks)


def aux_slots(hooks: tuple[Hook, ...], aux: Mapping[str, Any] | None) -> tuple[Slot, ...]:
    """The hooks' aux slots (`features.hook.slots`), after checking that `aux` names exactly
    the values they declare. ValueError naming the missing and unknown names otherwise."""
    values = dict(aux or {})
    block = slots(hooks)
    names = {s.aux.name for s in block}
    if set(values) != names:
        missing, unknown = sorted(names - set(values)), sorted(set(values) - names)
        raise ValueError(
            f"aux={sorted(values)}: the hooks read {sorted(names) or 'no aux values'}"
            + (f"; missing {', '.join(missing)}" if missing else "")
            + (f"; unknown {', '.join(unknown)}" if unknown else "")
            + "; pass one value per aux declaration, by name"
        )
    return block


def scalar(slot: Slot, value: Any) -> float | int:
    """A scalar aux value as its slot takes it (float32 or int32). ValueError otherwise."""
    a = slot.aux
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"aux {a.name}={value!r}: a {a.dtype} scalar; pass a Python number")
    if slot.kind == "float":
        return float(value)
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"aux {a.name}={value!r}: an int32 scalar; pass an int")
    return int(value)


def empty_table(name: str) -> str:
    """The message for an empty table a mask reads at ranges of indices."""
    return (
        f"aux {name}: an empty table; the mask_mod reads it at every query row and key, so "
        "every index it evaluates must be inside it: pass one entry per index"
    )


def check_indices(
    hooks: tuple[Hook, ...], values: Mapping[str, Any], *, batch: int, heads: int, q_len: int,
    kv_len: int,
) -> None:  # fmt: skip
    """ValueError when a hook can index an aux table outside its shape on this problem
    (`hooks.bounds.out_of_range`: where interval arithmetic can tell); `values` the call's aux
    values by name (arrays of any kind, read for their shape; scalars). Memoized by problem."""
    shapes, scalars = {}, {}
    for s in slots(hooks):
        v = values[s.aux.name]
        if s.kind == "ptr":
            shapes[s.aux.name] = tuple(int(n) for n in v.shape)
        else:
            scalars[s.aux.name] = scalar(s, v)
    message = _first_out_of_range(
        hooks, batch, heads, q_len, kv_len, tuple(sorted(shapes.items())),
        tuple(sorted(scalars.items())),
    )  # fmt: skip
    if message is not None:
        raise ValueError(message)


@functools.lru_cache(maxsize=512)
def _first_out_of_range(
    hooks: tuple[Hook, ...], batch: int, heads: int, q_len: int, kv_len: int,
    shapes: tuple[tuple[str, tuple[int, ...]], ...], scalars: tuple[tuple[str, Any], ...],
) -> str | None:  # fmt: skip
    for hook in hooks:
        message = out_of_range(
            hook, batch=batch, heads=heads, q_len=q_len, kv_len=kv_len, shapes=dict(shapes),
            scalars=dict(scalars),
        )  # fmt: skip
        if message is not None:
            return message
    return None
