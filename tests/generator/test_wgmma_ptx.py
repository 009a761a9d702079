"""The wgmma wrappers generated in Python: operand lists, A source, transposed B."""

from __future__ import annotations

import re

import pytest

from flashgen.generator.families.wgmma.ptx import Wgmma, wrappers


@pytest.mark.parametrize("n", [64, 128, 176, 256])
@pytest.mark.parametrize("a_regs", [False, True])
def test_every_accumulator_is_an_operand_once(n: int, a_regs: bool) -> None:
    src = Wgmma(n=n, a_regs=a_regs, trans_b=a_regs, mma_type="bf16").source()
    assert src.count('"+f"(d[') == n // 2
    assert f'"+f"(d[{n // 2 - 1}])' in src and f"d[{n // 2}]" not in src
    # the accumulator list names %0 .. %(n/2 - 1) in order
    acc = re.search(r'"\{ ([^}]*)\}, "', src)
    assert acc is not None
    assert acc.group(1).split(", ") == [f"%{i}" for i in range(n // 2)]
    assert f"m64n{n}k16.f32.bf16.bf16" in src


def test_register_a_takes_four_registers_and_only_the_b_transpose_bit() -> None:
    rs = Wgmma(n=128, a_regs=True, trans_b=True, mma_type="f16").source()
    assert '"r"(a[3])' in rs and "desc_a" not in rs
    assert "p, 1, 1, 1;" in rs  # scale-d, scale-a, scale-b, trans-b
    ss = Wgmma(n=128, a_regs=False, trans_b=False, mma_type="f16").source()
    assert '"l"(desc_a)' in ss and "p, 1, 1, 0, 0;" in ss  # ... trans-a, trans-b


def test_wrappers_are_deduplicated_and_ordered() -> None:
    a = Wgmma(n=64, a_regs=False, trans_b=False, mma_type="bf16")
    b = Wgmma(n=64, a_regs=True, trans_b=True, mma_type="bf16")
    text = wrappers([b, a, b])
    assert text.count("void wgmma_m64n64k16_rs_tb(") == 1
    assert text.index(b.fn) < text.index(a.fn)  # sorted by name: rs before ss
    assert "{%" not in text and "{{" not in text  # Jinja never sees these, but readers do
