"""docs/hooks.md's Python examples run, and the status note leads the page."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[3] / "docs" / "hooks.md"


def test_examples_run() -> None:
    text = DOC.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 3
    scope: dict[str, object] = {"print": lambda *a: None}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), scope)
    assert scope["hook"].kind == "mask_mod"  # type: ignore[attr-defined]
    name = scope["spec"].name  # type: ignore[attr-defined]
    assert re.fullmatch(
        r"flash_fwd_mma_d128_.*_scoremod[0-9a-f]{12}_maskmod[0-9a-f]{12}_w\d_s\d", name
    )


def test_status_note_first() -> None:
    head = DOC.read_text().split("\n\n")[1]
    assert "family `mma` compiles hooks into its forward and its backward" in head.replace(
        "\n> ", " "
    )
