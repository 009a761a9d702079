"""Combining partial attention results by their log-sum-exp, in float32 (float64 for float64
inputs).

A ring step gives, for some query rows, the attention over one source's keys: O_s (softmax
over those keys only, times V) and LSE_s (natural-log sum of their exponentiated scores). Over
the union of the keys, LSE = log(sum_s exp(LSE_s)) and O = sum_s exp(LSE_s - LSE) O_s. The
accumulator keeps O in float32, so the merge adds no rounding of the storage dtype; rows no
step has reached yet hold LSE = -inf and O = 0, and a merge with such a row weights it 0
(never exp(-inf - -inf)).
"""

from __future__ import annotations

from typing import Any

import torch


def accumulator_dtype(x: Any) -> Any:
    """float64 for float64 tensors, float32 for every other dtype."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def empty_accumulator(q: Any, dv: int) -> tuple[Any, Any]:
    """(O, LSE) for q's rows before any step: O zeros (B, H, T, dv), LSE -inf (B, H, T), in
    `accumulator_dtype(q)`."""
    b, h, t = q.shape[0], q.shape[1], q.shape[2]
    ct = accumulator_dtype(q)
    o = torch.zeros(b, h, t, dv, device=q.device, dtype=ct)
    lse = torch.full((b, h, t), float("-inf"), device=q.device, dtype=ct)
    return o, lse


def merge_into(acc_o: Any, acc_lse: Any, o: Any, lse: Any) -> None:
    """acc (O, LSE) <- the merge of acc and one step's (O, LSE), in place (acc_o and acc_lse,
    in the accumulator's dtype, may be views of the rows the step covered)."""
    new = torch.logaddexp(acc_lse, lse)
    # a row with no keys on either side stays -inf: weigh against 0 there, not -inf
    base = torch.where(torch.isinf(new), torch.zeros_like(new), new)
    w_acc = torch.exp(acc_lse - base).unsqueeze(-1)
    w_new = torch.exp(lse.to(base.dtype) - base).unsqueeze(-1)
    # two passes over O: scale in place, then add o * w_new (o read in its own dtype)
    acc_o.mul_(w_acc).addcmul_(o, w_new)
    acc_lse.copy_(new)
