"""The property suite: every shipped variant of every family against the oracle.

For each variant Hypothesis draws batch, heads, Tq and Tk (1, primes, tile multiples and their
neighbours, anything up to 600, Tq != Tk both ways), a random or default scale and Q/K
magnitudes with logits up to +-60, after the pinned problems (`strategies.pinned_cases`:
one token, one query against a prime number of keys, Tq > Tk so causal rows see no key,
Tq < Tk, three full query tiles plus a ragged one; feature variants add windows that skip
tiles or leave rows empty). Variants compiled with features draw their values too (window
sizes from empty to past the sequence, softcaps, ALiBi slopes), and `head_dim_probes` adds
unshipped variants at odd head dims (8 ... 248, zero-padded in-kernel). Outputs are
poisoned with NaN before every launch; O and LSE must satisfy docs/design.md's rule and hold no NaN.

Random problems per variant: FLASHGEN_GPU_EXAMPLES, else 4 (dev), 8 (ci), 100 (thorough),
with the profile from FLASHGEN_HYPOTHESIS_PROFILE. FLASHGEN_GPU_SHRINK=0 skips shrinking a
failure (faster when many variants fail at once).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from flashgen.generator.compile import CompiledKernel
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec
from flashgen.verify.checks import property_check
from flashgen.verify.strategies import gpu_examples, head_dim_probes

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("spec", shipped() + head_dim_probes(), ids=lambda s: s.name)
def test_variant_matches_the_oracle(
    spec: KernelSpec, compiled: dict[KernelSpec, CompiledKernel | Exception], record: Any
) -> None:
    built = compiled[spec]
    if isinstance(built, Exception):
        pytest.fail(f"{spec.name} did not compile: {built}", pytrace=False)
    result = property_check(
        spec,
        examples=gpu_examples(),
        compiled=built,
        shrink=os.environ.get("FLASHGEN_GPU_SHRINK", "1") != "0",
    )
    record(result)
    if not result.passed:
        pytest.fail(result.failure or f"{spec.name} failed", pytrace=False)
