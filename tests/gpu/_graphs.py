"""The GPU tier's CUDA-graph helpers: a call proven free of host synchronization, and a call
captured once in a CUDA graph on a side stream (replayed by the test with new device inputs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def assert_no_sync(call: Callable[[], Any]) -> None:
    """Run `call` (already compiled and loaded) with torch's sync debug mode at "error": any
    host synchronization inside it raises."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        call()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def capture(call: Callable[[], Any]) -> tuple[Any, Any]:
    """(graph, output): `call` captured once on a side stream."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = call()
    return graph, out
