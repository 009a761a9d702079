"""The `wgmma.mma_async` wrappers the `wgmma` family's template includes, written out in Python.

One wgmma instruction names every accumulator register of its m64nNk16 tile (N/2 fp32 values
per thread), so each N needs its own asm statement with N/2 operands. Spelling those lists
out is mechanical and error prone by hand and needs arithmetic a template should not do, so
they are generated here, one C++ function per (N, A source), and handed to the template as
text. Everything else about the kernel stays in the template.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Wgmma:
    """One wrapper: D(64xN, fp32) (+)= A(64x16) * B(16xN), B from a shared-memory descriptor.

    `a_regs`: A comes from four 32-bit registers per thread (the m16n8k16 A-fragment layout,
    one 16-row slice per warp); otherwise A comes from a shared-memory descriptor too.
    `trans_b`: B is stored N-major (V in O += P V: keys are rows, d is contiguous).
    `trans_a`: A (from shared memory) is stored M-major (the backward's dS in dQ = dS K: keys
    are rows, queries contiguous).
    """

    n: int
    a_regs: bool
    trans_b: bool
    mma_type: str  # bf16 or f16
    trans_a: bool = False

    @property
    def fn(self) -> str:
        """The C++ function name."""
        a_src = "rs" if self.a_regs else "ss"
        ta = "_ta" if self.trans_a else ""
        return f"wgmma_m64n{self.n}k16_{a_src}{ta}{'_tb' if self.trans_b else ''}"

    def source(self) -> str:
        """The C++ definition: a forceinline device function around one asm statement."""
        if self.trans_a and self.a_regs:
            raise ValueError("trans_a applies to A in shared memory only")
        acc = self.n // 2
        outs = ", ".join(f'"+f"(d[{i}])' for i in range(acc))
        regs = ", ".join(f"%{i}" for i in range(acc))
        tb = 1 if self.trans_b else 0
        if self.a_regs:
            a_ops = f"{{ %{acc}, %{acc + 1}, %{acc + 2}, %{acc + 3}}}"
            b_op, p_op = f"%{acc + 4}", f"%{acc + 5}"
            tail = f"p, 1, 1, {tb}"  # scale-d, imm-scale-a, imm-scale-b, imm-trans-b
            ins = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d)'
            a_param = "const uint32_t (&a)[4]"
        else:
            a_ops = f"%{acc}"
            b_op, p_op = f"%{acc + 1}", f"%{acc + 2}"
            ta = 1 if self.trans_a else 0
            tail = f"p, 1, 1, {ta}, {tb}"  # ... imm-trans-a, imm-trans-b
            ins = '"l"(desc_a), "l"(desc_b), "r"(scale_d)'
            a_param = "uint64_t desc_a"
        shape = f"m64n{self.n}k16.f32.{self.mma_type}.{self.mma_type}"
        return (
            f"__device__ __forceinline__ void {self.fn}(float (&d)[{acc}], {a_param}, "
            "uint64_t desc_b, int scale_d) {\n"
            "  asm volatile(\n"
            '      "{\\n.reg .pred p;\\n"\n'
            f'      "setp.ne.b32 p, {p_op}, 0;\\n"\n'
            f'      "wgmma.mma_async.sync.aligned.{shape} "\n'
            f'      "{{ {regs}}}, "\n'
            f'      "{a_ops}, {b_op}, {tail};\\n}}\\n"\n'
            f"      : {outs}\n"
            f"      : {ins});\n"
            "}\n"
        )


def wrappers(specs: list[Wgmma]) -> str:
    """The C++ text of every distinct wrapper in `specs`, in a stable order."""
    seen: dict[str, Wgmma] = {}
    for w in specs:
        seen.setdefault(w.fn, w)
    return "\n".join(seen[k].source() for k in sorted(seen))
