"""KernelSpec: the one frozen description of a generated kernel, its name, and its validation."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from .dtypes import DTYPES, DTypeInfo

if TYPE_CHECKING:
    from .families import Family


class SpecError(ValueError):
    """A configuration broke one or more rules; `problems` lists each as value, rule and fix."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True)
class KernelSpec:
    """A kernel configuration: every size a compile-time constant of the generated source.

    `warps` and `stages` are performance knobs of families that have them; 0 means "the
    family's default" and is replaced by it on construction, so two specs that generate the
    same kernel compare equal.
    """

    family: str = "simt"
    d: int = 64
    br: int = 32
    bc: int = 32
    dtype: str = "fp32"
    causal: bool = False
    warps: int = 0
    stages: int = 0

    def __post_init__(self) -> None:
        from .families import FAMILIES, family_of  # families import KernelSpec for typing only

        problems: list[str] = []
        for fname in ("d", "br", "bc", "warps", "stages"):
            value = getattr(self, fname)
            if isinstance(value, bool) or not isinstance(value, int):
                problems.append(f"{fname}={value!r}: must be an integer; e.g. {fname}=64")
        if not isinstance(self.causal, bool):
            problems.append(f"causal={self.causal!r}: must be True or False")
        # isinstance first: an unhashable value (a list) must be a SpecError, not a TypeError
        if not isinstance(self.dtype, str) or self.dtype not in DTYPES:
            problems.append(
                f"dtype={self.dtype!r}: unknown dtype; choose one of {', '.join(DTYPES)}"
            )
        try:
            # a non-string (even an unhashable list) is reported like an unknown name
            fam = family_of(self.family if isinstance(self.family, str) else "")
        except KeyError:
            problems.append(
                f"family={self.family!r}: unknown family; choose one of {', '.join(FAMILIES)}"
            )
            raise SpecError(problems) from None
        if problems:
            raise SpecError(problems)
        if self.warps == 0:
            object.__setattr__(self, "warps", fam.default_warps(self))
        if self.stages == 0:
            object.__setattr__(self, "stages", fam.default_stages(self))
        problems = fam.check(self)
        if problems:
            raise SpecError(problems)

    # ---- identity -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """Readable identity, also the kernel symbol: fixed field order, `[a-z0-9_]` only."""
        base = (
            f"flash_fwd_{self.family}_d{self.d}_br{self.br}_bc{self.bc}_{self.dtype}_"
            f"{'causal' if self.causal else 'noncausal'}"
        )
        if self.fam.has_knobs:
            base += f"_w{self.warps}_s{self.stages}"
        return base

    @classmethod
    def from_name(cls, name: str) -> KernelSpec:
        """Inverse of `name`; raise SpecError naming the expected pattern when it does not parse."""
        m = _NAME_RE.fullmatch(name)
        if m is None:
            raise SpecError(
                [
                    f"name={name!r}: not a flashgen kernel name; expected "
                    "flash_fwd_<family>_d<D>_br<BR>_bc<BC>_<dtype>_<causal|noncausal>"
                    "[_w<W>_s<S>], e.g. flash_fwd_simt_d64_br32_bc32_fp32_noncausal"
                ]
            )
        spec = cls(
            family=m["family"],
            d=int(m["d"]),
            br=int(m["br"]),
            bc=int(m["bc"]),
            dtype=m["dtype"],
            causal=m["mask"] == "causal",
            warps=int(m["w"] or 0),
            stages=int(m["s"] or 0),
        )
        if spec.name != name:
            raise SpecError([f"name={name!r}: not canonical; the canonical name is {spec.name}"])
        return spec

    def to_json(self) -> str:
        """The spec as one sorted JSON line (the banner of every generated file carries it)."""
        data = asdict(self)
        return json.dumps(data, sort_keys=True, separators=(", ", ": "))

    # ---- derived values -------------------------------------------------------------------
    @property
    def fam(self) -> Family:
        """The family object that owns this spec's rules and derived values."""
        from .families import family_of

        return family_of(self.family)

    @property
    def dtype_info(self) -> DTypeInfo:
        """The dtype table row for this spec."""
        return DTYPES[self.dtype]

    @property
    def threads(self) -> int:
        """Threads per block."""
        return int(self.warps * 32)

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory per block, in bytes."""
        return int(self.fam.smem_bytes(self))

    @property
    def archs(self) -> tuple[str, ...]:
        """The architectures this variant is compiled for when shipped."""
        return tuple(self.fam.archs)

    @property
    def align_elems(self) -> int:
        """Base pointers and strides (q, k, v, o) must be multiples of this many elements."""
        return int(self.fam.align_elems(self))

    def grid(self, batch: int, heads: int, tq: int) -> tuple[int, int, int]:
        """Launch grid for a problem: (query tiles, heads, batch)."""
        return (-(-tq // self.br), heads, batch)

    def replace(self, **changes: object) -> KernelSpec:
        """A copy with some fields changed (validated again)."""
        data = asdict(self)
        data.update(changes)
        return KernelSpec(**data)  # type: ignore[arg-type]


_NAME_RE = re.compile(
    r"flash_fwd_(?P<family>[a-z0-9]+)_d(?P<d>\d+)_br(?P<br>\d+)_bc(?P<bc>\d+)_"
    r"(?P<dtype>[a-z0-9]+)_(?P<mask>causal|noncausal)(?:_w(?P<w>\d+)_s(?P<s>\d+))?"
)
