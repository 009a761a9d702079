"""docs/hooks.md's Python examples run, and the layer's status note leads the page."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[3] / "docs" / "hooks.md"


def test_examples_run() -> None:
    text = DOC.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 2
    scope: dict[str, object] = {"print": lambda *a: None}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), scope)
    assert scope["hook"].kind == "mask_mod"  # type: ignore[attr-defined]


def test_status_note_first() -> None:
    head = DOC.read_text().split("\n\n")[1]
    assert "the expression layer; the kernels take hooks in a later" in head.replace("\n> ", " ")
