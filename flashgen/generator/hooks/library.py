"""Ready-made hooks, written with the public API: the built-in features as hooks, and the masks
users ask for most.

Each comes twice: the plain Python function (compose them: `causal_mask(b, h, q, kv) &
document_mask(b, h, q, kv, doc_ids)`) and a `*_hook()` that traces it with its aux
declarations. Parameters that the built-in features take at run time (a softcap's cap, a
window's sides, ALiBi's slopes) are aux tensors here too, so one kernel serves every value.

Positions follow flashgen's convention (features/window.py, features/alibi.py, the templates'
key_hidden): query row i sits at key position p = i + Tk - Tq (bottom-right alignment). The int
arithmetic is the templates' own: p - j is computed as (i - Tq + Tk) - j, which stays in int32
for every row and key of a problem.
"""

from __future__ import annotations

from flashgen.generator.hooks.aux import Aux, AuxRef
from flashgen.generator.hooks.expr import KV_LEN, Q_LEN, Expr, abs_, tanh
from flashgen.generator.hooks.hook import Hook
from flashgen.generator.hooks.trace import trace_mask_mod, trace_score_mod

SOFTCAP_AUX = Aux("softcap", "float32", 0)
ALIBI_AUX = Aux("alibi_slopes", "float32", 1)
WINDOW_AUX = (Aux("window_left", "int32", 0), Aux("window_right", "int32", 0))
DOC_IDS_AUX = Aux("doc_ids", "int32", 1)
PREFIX_AUX = Aux("prefix", "int32", 0)


def key_position(q_idx: Expr) -> Expr:
    """The key position p = q_idx + Tk - Tq of query row q_idx (bottom-right alignment)."""
    return q_idx - Q_LEN + KV_LEN


# ---- score_mods ----------------------------------------------------------------------------


def softcap_score(score: Expr, b: Expr, h: Expr, q_idx: Expr, kv_idx: Expr, cap: Expr) -> Expr:
    """Logit softcapping (Gemma 2): c * tanh(s / c), the `softcap` feature; c > 0."""
    return cap * tanh(score / cap)


def alibi_score(score: Expr, b: Expr, h: Expr, q_idx: Expr, kv_idx: Expr, slopes: AuxRef) -> Expr:
    """ALiBi, the `alibi` feature: s - slope[h] * |p - j| with one float32 slope per query
    head (natural-log units)."""
    return score - slopes[h] * abs_(key_position(q_idx) - kv_idx)


# ---- mask_mods -----------------------------------------------------------------------------


def causal_mask(b: Expr, h: Expr, q_idx: Expr, kv_idx: Expr) -> Expr:
    """Causal attention, bottom-right aligned: key j is seen when j <= p."""
    return kv_idx <= key_position(q_idx)


def window_mask(b: Expr, h: Expr, q_idx: Expr, kv_idx: Expr, left: Expr, right: Expr) -> Expr:
    """The sliding window, the `window` feature: p - left <= j <= p + right, a negative side
    unbounded. Compared as the offset j - p against the sides, as the templates do, so no
    edge p +- side is ever formed (it may pass int32)."""
    ahead = kv_idx - key_position(q_idx)  # j - p
    return ((left < 0) | (ahead >= -left)) & ((right < 0) | (ahead <= right))


def document_mask(b: Expr, h: Expr, q_idx: Expr, kv_idx: Expr, doc_ids: AuxRef) -> Expr:
    """Packed sequences: a query sees the keys of its own document. `doc_ids` holds one int32
    document id per token; queries and keys index the same sequence (Tq == Tk, as in packed
    training). Combine with `causal_mask` for causal packed attention."""
    return doc_ids[q_idx] == doc_ids[kv_idx]


def prefix_lm_mask(b: Expr, h: Expr, q_idx: Expr, kv_idx: Expr, prefix: Expr) -> Expr:
    """Prefix-LM: the first `prefix` keys are seen by every query, the rest causally."""
    return (kv_idx < prefix) | causal_mask(b, h, q_idx, kv_idx)


# ---- traced ----------------------------------------------------------------------------------


def softcap_hook() -> Hook:
    """`softcap_score` traced; aux: softcap (float32 scalar)."""
    return trace_score_mod(softcap_score, SOFTCAP_AUX)


def alibi_hook() -> Hook:
    """`alibi_score` traced; aux: alibi_slopes (float32, one per query head)."""
    return trace_score_mod(alibi_score, ALIBI_AUX)


def causal_hook() -> Hook:
    """`causal_mask` traced; no aux."""
    return trace_mask_mod(causal_mask)


def window_hook() -> Hook:
    """`window_mask` traced; aux: window_left, window_right (int32 scalars, -1 unbounded)."""
    return trace_mask_mod(window_mask, *WINDOW_AUX)


def document_hook() -> Hook:
    """`document_mask` traced; aux: doc_ids (int32, one per token)."""
    return trace_mask_mod(document_mask, DOC_IDS_AUX)


def prefix_lm_hook() -> Hook:
    """`prefix_lm_mask` traced; aux: prefix (int32 scalar)."""
    return trace_mask_mod(prefix_lm_mask, PREFIX_AUX)


LIBRARY = {
    "softcap": softcap_hook,
    "alibi": alibi_hook,
    "causal": causal_hook,
    "window": window_hook,
    "document": document_hook,
    "prefix_lm": prefix_lm_hook,
}
"""Every ready-made hook's factory, by name."""
