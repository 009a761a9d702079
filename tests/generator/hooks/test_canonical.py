"""A hook's identity: the same structure gives the same canonical form and digest, however it
was written; any change of meaning changes it."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from flashgen.generator import hooks as hk
from flashgen.generator.hooks import Aux
from flashgen.generator.hooks.library import alibi_hook, softcap_hook


def softcap_a(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any, cap: Any) -> Any:
    return cap * hk.tanh(score / cap)


def softcap_b(s: Any, batch: Any, head: Any, i: Any, j: Any, c: Any) -> Any:
    x = s / c  # the same structure with other names and a temporary
    t = hk.tanh(x)
    return t * c  # and the product's operands swapped


CAP = Aux("cap", "float32", 0)


def test_same_function_traced_twice() -> None:
    a, b = hk.trace_score_mod(softcap_a, CAP), hk.trace_score_mod(softcap_a, CAP)
    assert a.canonical == b.canonical and a.digest == b.digest and a == b


def test_differently_written_same_structure() -> None:
    a = hk.trace_score_mod(softcap_a, CAP)
    b = hk.trace_score_mod(softcap_b, Aux("c", "float32", 0))  # aux renamed: positional
    assert a.digest == b.digest and a == b and hash(a) == hash(b)
    # commutative operands in any order, nested either way round
    m1 = hk.trace_mask_mod(lambda b, h, q, kv: (kv <= q) & (h == 0) & (q != kv))
    m2 = hk.trace_mask_mod(lambda b, h, q, kv: (kv <= q) & ((kv != q) & (h == 0)))
    assert m1.digest != m2.digest  # associativity is structure: ((a & b) & c) is not a & (b & c)
    # m1's association with every commutative operand swapped: the same hook
    m3 = hk.trace_mask_mod(lambda b, h, q, kv: (kv != q) & ((h == 0) & (kv <= q)))
    assert m3.digest == m1.digest and m3.canonical == m1.canonical


def test_differences_of_meaning_change_the_digest() -> None:
    base = hk.trace_score_mod(softcap_a, CAP).digest
    others = [
        hk.trace_score_mod(lambda s, b, h, q, kv, c: c * hk.tanh(s * c), CAP),  # / became *
        hk.trace_score_mod(
            lambda s, b, h, q, kv, c: c[h] * hk.tanh(s / c[h]), Aux("c", "float32", 1)
        ),
        hk.trace_score_mod(lambda s, b, h, q, kv, c: 30.0 * hk.tanh(s / 30.0), CAP),
        hk.trace_score_mod(lambda s, b, h, q, kv, c: 30.5 * hk.tanh(s / 30.0), CAP),
        hk.trace_score_mod(lambda s, b, h, q, kv, c: (s / c) - c, CAP),
        hk.trace_score_mod(lambda s, b, h, q, kv, c: c - (s / c), CAP),  # - is not commutative
    ]
    digests = [base, *(o.digest for o in others)]
    assert len(set(digests)) == len(digests)
    # int vs float constants, and which input is read, are meaning too
    assert (
        hk.trace_mask_mod(lambda b, h, q, kv: q >= kv).digest
        != hk.trace_mask_mod(lambda b, h, q, kv: kv >= q).digest
    )
    assert (
        hk.trace_score_mod(lambda s, b, h, q, kv: s + hk.to_float(q // 2)).digest
        != hk.trace_score_mod(lambda s, b, h, q, kv: s + q / 2).digest
    )
    # a kind change with the same expression
    assert (
        hk.trace_mask_mod(lambda b, h, q, kv: True).digest
        != hk.trace_mask_mod(lambda b, h, q, kv: False).digest
    )


def test_aux_order_is_identity_names_are_not() -> None:
    def two(s: Any, b: Any, h: Any, q: Any, kv: Any, x: Any, y: Any) -> Any:
        return s + x[h] * y[kv]

    xy = hk.trace_score_mod(two, Aux("x", "float32", 1), Aux("y", "float32", 1))
    renamed = hk.trace_score_mod(two, Aux("p", "float32", 1), Aux("r", "float32", 1))
    swapped = hk.trace_score_mod(
        lambda s, b, h, q, kv, y, x: s + x[h] * y[kv],
        Aux("y", "float32", 1),
        Aux("x", "float32", 1),
    )
    assert xy.digest == renamed.digest
    assert xy.digest != swapped.digest  # the ABI takes aux tensors by position
    # an unused declaration is still part of the ABI, hence of the identity
    assert (
        xy.digest
        != hk.trace_score_mod(
            lambda s, b, h, q, kv, x, y, z: s + x[h] * y[kv],
            Aux("x", "float32", 1),
            Aux("y", "float32", 1),
            Aux("z", "int32", 0),
        ).digest
    )


def test_shared_subexpressions_are_listed_once() -> None:
    def deep(s: Any, b: Any, h: Any, q: Any, kv: Any) -> Any:
        for _ in range(60):  # a tree of 2^60 leaves, a DAG of 60 nodes
            s = s * s
        return s

    hook = hk.trace_score_mod(deep)
    assert len(hook.canonical.splitlines()) == 1 + 1 + 60 + 1  # header, score, 60 muls, return


GOLDEN = {  # the digests of the library's hooks: a change here renames kernels in caches
    "softcap": "98581a3312b9",
    "alibi": "ae214610081f",
}


def test_digest_is_stable_across_processes_and_releases() -> None:
    code = (
        "from flashgen.generator.hooks.library import softcap_hook, alibi_hook;"
        "print(softcap_hook().digest, alibi_hook().digest)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", **_env()},
    ).stdout.split()
    assert out == [softcap_hook().digest, alibi_hook().digest]
    assert [softcap_hook().digest, alibi_hook().digest] == [GOLDEN["softcap"], GOLDEN["alibi"]]


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
