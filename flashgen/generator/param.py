"""One kernel argument (`Param`): the unit of the kernel ABI (abi.py) and of a feature's
arguments (features/)."""

from __future__ import annotations

from dataclasses import dataclass

ROLES = ("tensor", "size", "stride", "scalar", "feature", "tensor_map")


@dataclass(frozen=True)
class Param:
    """One kernel argument: its name, C type, struct code and role.

    `code` is the `struct` code of the packed value (P a pointer, i an int32, q an int64, f a
    float32; "" for a by-value blob such as a 128-byte tensor map, packed by its builder).
    `role`: `tensor` (a device pointer that changes per call), `size`, `stride` (elements),
    `scalar`, `feature` (a run-time feature value), `tensor_map`. `note` is printed beside the
    declaration in the generated source.
    """

    name: str
    ctype: str
    code: str
    role: str
    note: str = ""

    def declaration(self, elem: str, restrict: bool = True) -> str:
        """`const elem_t* __restrict__ q`: the parameter as a C declaration."""
        ctype = {"T*": f"{elem}*", "const T*": f"const {elem}*"}.get(self.ctype, self.ctype)
        if ctype.endswith("*"):
            return f"{ctype} __restrict__ {self.name}" if restrict else f"{ctype} {self.name}"
        if self.role == "tensor_map":
            return f"const __grid_constant__ {ctype} {self.name}"
        return f"const {ctype} {self.name}" if restrict else f"{ctype} {self.name}"
