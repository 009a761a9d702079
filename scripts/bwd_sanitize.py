"""Run backward GPU test cases outside pytest, so that compute-sanitizer can wrap them.

    compute-sanitizer --tool racecheck python3 scripts/bwd_sanitize.py PATTERN [PATTERN ...]

Each PATTERN selects the cases of tests/gpu/test_backward.py whose id contains every
`&`-separated part, e.g. `wgmma_d128_br64_bc128_bf16_noncausal_s2&B1H8kv2q257k129` (a plain
case: 5 query tiles x 4 heads = 20 steps per block, so the Q/dO ring wraps) or
`wgmma_d128&window_softcap&257` (a feature case). The cases run exactly as the tests do
(oracle rule, exact zeros where nothing is seen); the kernels must be in the cubin cache or
compile on the way. Why not pytest: compute-sanitizer crashed (SIGSEGV) on the test module's
fixture that compiles the feature forwards in parallel. Exits 1 when a case fails, 2 when no
case matches.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.gpu import test_backward as tb  # noqa: E402  (the repository root is on the path now)


def cases(patterns: list[str]) -> list[tuple[str, object]]:
    """(id, thunk) of every test case whose id matches a pattern."""
    out: list[tuple[str, object]] = []

    def wanted(ident: str) -> bool:
        return any(all(part in ident for part in pat.split("&")) for pat in patterns)

    for spec in tb.SPECS:
        for case in tb.CASES:
            ident = f"{spec.name}-B{case[0]}H{case[1]}kv{case[2]}q{case[3]}k{case[4]}"
            if wanted(ident):
                out.append((ident, lambda s=spec, c=case: tb.test_backward_matches_the_oracle(
                    s, c, {s: None})))  # fmt: skip
    for param in tb.FEATURE_PARAMS:
        spec, problem = param.values
        if not hasattr(spec, "name"):
            continue  # refused or not for this GPU: the test suite reports it
        ident = f"{spec.name}-{problem.label}"
        if wanted(ident):
            fwd = tb._forward_of(spec)
            out.append((ident, lambda s=spec, p=problem, f=fwd: (
                tb.test_backward_with_features_matches_the_oracle(s, p, {s: None}, {f: None}))))
    return out


def main() -> int:
    todo = cases(sys.argv[1:])
    if not todo:
        print(f"no backward test case matches {sys.argv[1:]}", file=sys.stderr)
        return 2
    failed = 0
    for ident, run in todo:
        try:
            run()  # type: ignore[operator]
            print(f"ok   {ident}", flush=True)
        except Exception:  # a failed case is a line and the traceback, then the next case
            failed += 1
            print(f"FAIL {ident}\n{traceback.format_exc()}", flush=True)
    print(f"{len(todo) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
