"""KernelSpec: the one frozen description of a generated kernel, its name, and its validation."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from flashgen.generator.dtypes import DTYPES, DTypeInfo
from flashgen.generator.features import RUNTIME_FEATURES
from flashgen.generator.features.hook import KIND_TOKENS, is_hook_token, token_kind

if TYPE_CHECKING:
    from flashgen.generator.families import Family


DEFAULT_FAMILY = "simt"
"""The family of a spec that names none (every GPU runs it; the CLI's default too)."""


class SpecError(ValueError):
    """A configuration broke one or more rules; `problems` lists each as value, rule and fix."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True)
class KernelSpec:
    """A kernel configuration: every size a compile-time constant of the generated source.

    `direction` is the pass the kernel computes: `fwd`, or `bwd` (dQ, dK, dV from Q, K, V, O,
    dO and the forward's LSE; families mma and wgmma, see `Family.bwd_template`). The backward
    takes the forward's run-time features `window`, `softcap` and `alibi` (both families) and
    mma's `deterministic` (dQ without atomics: bit-identical gradients); it refuses `gqapack`
    and the features its family's backward lacks (`Family.bwd_features`), and dv != d
    (`_check_backward`); its `br` is the query tile and `bc` the key tile of one block
    (`families/mma/bwd.py` and `families/wgmma/bwd.py` have the rules and defaults).
    `br`, `bc` = 0 and `dtype` = "" mean the family's defaults (`Family.default_tile`,
    `Family.default_dtype`: simt 32x32 fp32, mma 128x64 bf16, wgmma 128x128 bf16), so
    `KernelSpec(family="mma", d=128)` is a valid mma kernel.
    `warps` and `stages` are performance knobs of families that have them; 0 means "the
    family's default" and is replaced by it on construction, so two specs that generate the
    same kernel compare equal. `features` are compile-time feature tokens (see `FEATURES`),
    kept in canonical order. `dv` is the value head dim (of v and o; 0 means d).

    The name grammar (`name`, `from_name`):
    `flash_<direction>_<family>_d<D>[_dv<DV>]_br<BR>_bc<BC>_<dtype>_<causal|noncausal>[_<feature>...][_<knob><N>...]`
    (`_dv<DV>` only when it differs from d)
    where the knob tokens are the family's own (`Family.knobs`, e.g. `w4_s1` for mma).
    """

    family: str = DEFAULT_FAMILY
    d: int = 64
    br: int = 0
    bc: int = 0
    dtype: str = ""
    causal: bool = False
    warps: int = 0
    stages: int = 0
    direction: str = "fwd"
    features: tuple[str, ...] = ()
    dv: int = 0

    def __post_init__(self) -> None:
        from flashgen.generator.families import (  # families import KernelSpec for typing only
            FAMILIES,
            family_of,
        )

        problems: list[str] = []
        try:
            # a non-string (even an unhashable list) is reported like an unknown name
            fam = family_of(self.family if isinstance(self.family, str) else "")
        except KeyError:
            fam = None
        if fam is not None:  # the family's defaults first, so its rules judge the real values
            if self.dv == 0 and isinstance(self.d, int):
                object.__setattr__(self, "dv", self.d)
            if self.dtype == "":
                object.__setattr__(self, "dtype", fam.default_dtype)
            if isinstance(self.d, int) and (self.br == 0 or self.bc == 0):
                if self.direction == "bwd":
                    # unchecked yet: only its strings choose the tile (the checks below judge it)
                    raw = self.features if isinstance(self.features, (tuple, list)) else ()
                    feats = tuple(f for f in raw if isinstance(f, str))
                    stages = self.stages if isinstance(self.stages, int) else 0
                    best = fam.default_bwd_tile(self.d, feats, stages)
                    # a half the caller named that is not the best tile's: the plain tile's other
                    agrees = self.br in (0, best[0]) and self.bc in (0, best[1])
                    br, bc = best if agrees else fam.bwd_tile
                elif self.direction == "decode":
                    br, bc = fam.decode_tile
                else:
                    br, bc = fam.default_tile(self.d)
                if self.br == 0:
                    object.__setattr__(self, "br", br)
                if self.bc == 0:
                    object.__setattr__(self, "bc", bc)
        for fname in ("d", "br", "bc", "warps", "stages", "dv"):
            value = getattr(self, fname)
            if isinstance(value, bool) or not isinstance(value, int):
                problems.append(f"{fname}={value!r}: must be an integer; e.g. {fname}=64")
        if not isinstance(self.causal, bool):
            problems.append(f"causal={self.causal!r}: must be True or False")
        # isinstance first: an unhashable value (a list) must be a SpecError, not a TypeError
        dtype_unset = fam is None and self.dtype == ""  # no family to take the default from
        if not dtype_unset and (not isinstance(self.dtype, str) or self.dtype not in DTYPES):
            problems.append(
                f"dtype={self.dtype!r}: unknown dtype; choose one of {', '.join(DTYPES)}"
            )
        if fam is None:
            problems.append(
                f"family={self.family!r}: unknown family; choose one of {', '.join(FAMILIES)}"
            )
            raise SpecError(problems)
        if not isinstance(self.direction, str) or self.direction not in DIRECTIONS:
            problems.append(
                f"direction={self.direction!r}: unknown direction; choose one of "
                f"{', '.join(DIRECTIONS)}"
            )
        # a family's backward judges features by its own list (`_check_backward`): here only
        # that each token is a known one, named once
        bwd = self.direction == "bwd" and bool(fam.bwd_template)
        problems += _check_features(
            self.features, fam.name, frozenset(FEATURES) if bwd else fam.features
        )
        problems += _check_hooks(self, fam)
        if self.direction == "bwd":
            problems += _check_backward(self, fam)
        elif self.direction == "decode":
            problems += _check_decode(self, fam)
        elif isinstance(self.features, (tuple, list)) and any(
            f in BWD_ONLY_FEATURES for f in self.features
        ):
            problems.append(
                "features: 'deterministic' is a backward-only feature (dQ without atomics); "
                "drop it for direction='fwd' (the forward is deterministic already)"
            )
        if problems:
            raise SpecError(problems)
        object.__setattr__(self, "features", _canonical_features(self.features))
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
        """Readable identity, also the kernel symbol: `[a-z0-9_]` only (grammar: class doc)."""
        tokens = [
            "flash",
            self.direction,
            self.family,
            f"d{self.d}",
            *([f"dv{self.dv}"] if self.dv != self.d else []),
            f"br{self.br}",
            f"bc{self.bc}",
            self.dtype,
            "causal" if self.causal else "noncausal",
            *self.features,
            *(f"{token}{getattr(self, field)}" for field, token in self.fam.knobs),
        ]
        return "_".join(tokens)

    @property
    def build_command(self) -> str:
        """The `flashgen build` command line that regenerates exactly this kernel (a hooked
        variant's names the files of its hooks by placeholder: the name carries their digests,
        not where they were defined)."""
        hooks = [f for f in self.features if is_hook_token(f)]
        if hooks:
            options = " ".join(
                f"--{'score' if h.startswith('scoremod') else 'mask'}-mod FILE:NAME" for h in hooks
            )
            return (
                f"flashgen build --name {self.name} {options} (FILE:NAME: the hook with digest "
                f"{', '.join(h[-12:] for h in hooks)})"
            )
        parts = [
            "flashgen build",
            f"--family {self.family}",
            f"--d {self.d}",
            *([f"--dv {self.dv}"] if self.dv != self.d else []),
            f"--br {self.br}",
            f"--bc {self.bc}",
            f"--dtype {self.dtype}",
            "--causal" if self.causal else "--no-causal",
            *(f"--{field} {getattr(self, field)}" for field, _ in self.fam.knobs),
            *([f"--features {','.join(self.features)}"] if self.features else []),
            # the CLI has no backward yet: the banner must still not claim the forward
            *([f"--direction {self.direction}"] if self.direction != "fwd" else []),
        ]
        return " ".join(parts)

    @classmethod
    def from_name(cls, name: str) -> KernelSpec:
        """Inverse of `name`; raise SpecError naming the expected pattern when it does not parse."""
        fields = _parse_name(name)
        spec = cls(**fields)  # type: ignore[arg-type]
        if spec.name != name:
            raise SpecError([f"name={name!r}: not canonical; the canonical name is {spec.name}"])
        return spec

    def to_json(self) -> str:
        """The spec as one sorted JSON line (the banner of every generated file carries it)."""
        data = asdict(self)
        if self.dv == self.d:  # dv only when v has a head dim of its own (as in the name)
            del data["dv"]
        return json.dumps(data, sort_keys=True, separators=(", ", ": "))

    # ---- derived values -------------------------------------------------------------------
    @property
    def fam(self) -> Family:
        """The family object that owns this spec's rules and derived values."""
        from flashgen.generator.families import family_of

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

    def replace(self, **changes: object) -> KernelSpec:
        """A copy with some fields changed (validated again)."""
        data = asdict(self)
        if "d" in changes and "dv" not in changes and self.dv == self.d:
            data["dv"] = 0  # dv followed d: it follows the new d
        data.update(changes)
        return KernelSpec(**data)  # type: ignore[arg-type]


DIRECTIONS: tuple[str, ...] = ("fwd", "bwd", "decode")
"""The passes flashgen generates: the forward, the backward (dQ, dK, dV), and the decode
forward (a few query rows per sequence against a K/V cache, contiguous or paged, split over the
keys: `Family.decode_template`)."""

FEATURES: dict[str, str] = {
    **{f.token: f.summary for f in RUNTIME_FEATURES},
    "gqapack": "grouped-query heads packed into one tile: K/V read once per group (short queries)",
    "varlen": "packed sequences of different lengths (cu_seqlens_q/k on the device): every mask "
    "and position per sequence",
    "deterministic": "backward only: dQ by a kernel per query tile instead of fp32 atomics, so "
    "gradients are bit-identical run to run",
}
"""Compile-time feature tokens, in canonical name order: token -> what it enables.

A feature is compile-time when it removes work from the kernel (e.g. a window flag that turns
on window masking and tile skipping); its run-time values (window sizes, softcap) are kernel
arguments, so one compiled variant serves every value. Each family lists the tokens it
supports in `Family.features`.
"""

BWD_ONLY_FEATURES: frozenset[str] = frozenset({"deterministic"})
"""Feature tokens that only the backward pass takes (the forward refuses them)."""

_HEAD = re.compile(
    r"flash_(?P<direction>[a-z]+)_(?P<family>[a-z0-9]+)_d(?P<d>\d+)(?:_dv(?P<dv>\d+))?_br(?P<br>\d+)"
    r"_bc(?P<bc>\d+)_"
    r"(?P<dtype>[a-z0-9]+)_(?P<mask>causal|noncausal)(?P<rest>(?:_[a-z0-9]+)*)"
)
_KNOB = re.compile(r"(?P<token>[a-z]+)(?P<value>\d+)")
_EXPECTED = (
    "expected flash_<direction>_<family>_d<D>[_dv<DV>]_br<BR>_bc<BC>_<dtype>_<causal|noncausal>"
    "[_<feature>...][_<knob><N>...], e.g. flash_fwd_simt_d64_br32_bc32_fp32_noncausal"
)


def _parse_name(name: str) -> dict[str, object]:
    """Split a kernel name into KernelSpec fields; SpecError naming the bad token otherwise."""
    from flashgen.generator.families import family_of

    m = _HEAD.fullmatch(name) if isinstance(name, str) else None
    if m is None:
        raise SpecError([f"name={name!r}: not a flashgen kernel name; {_EXPECTED}"])
    fields: dict[str, object] = {
        "direction": m["direction"],
        "family": m["family"],
        "d": int(m["d"]),
        "dv": int(m["dv"]) if m["dv"] else 0,
        "br": int(m["br"]),
        "bc": int(m["bc"]),
        "dtype": m["dtype"],
        "causal": m["mask"] == "causal",
    }
    try:
        knobs = dict((token, field) for field, token in family_of(m["family"]).knobs)
    except KeyError as exc:
        raise SpecError([str(exc.args[0])]) from None
    features: list[str] = []
    for token in m["rest"].split("_")[1:]:
        knob = _KNOB.fullmatch(token)
        if token in FEATURES or is_hook_token(token):
            features.append(token)
        elif knob is not None and knob["token"] in knobs:
            fields[knobs[knob["token"]]] = int(knob["value"])
        else:
            raise SpecError(
                [
                    f"name={name!r}: token {token!r} is neither a feature "
                    f"({', '.join(FEATURES) or 'none defined'}) nor a knob of family "
                    f"{m['family']} ({', '.join(t + '<N>' for t in knobs) or 'none'}); {_EXPECTED}"
                ]
            )
    fields["features"] = tuple(features)
    return fields


def _check_features(features: object, family: str, supported: frozenset[str]) -> list[str]:
    """Problems with a `features` value: a tuple of known tokens the family supports."""
    if not isinstance(features, (tuple, list)) or not all(isinstance(f, str) for f in features):
        return [f"features={features!r}: must be a tuple of feature tokens; e.g. features=()"]
    problems = []
    for f in features:
        if is_hook_token(f):
            continue  # _check_hooks
        if f not in FEATURES:
            known = ", ".join(FEATURES) or "none are defined yet"
            problems.append(f"features: {f!r} is not a feature; known features: {known}")
        elif f not in supported:
            problems.append(
                f"features: {f!r} is not supported by family {family}; "
                f"it supports {', '.join(sorted(supported)) or 'no features'}"
            )
    if len(set(features)) != len(features):
        problems.append(f"features={features!r}: a feature is named twice; name each once")
    return problems


def _check_hooks(spec: KernelSpec, fam: Family) -> list[str]:
    """What a spec with hook tokens (`scoremod<digest>`, `maskmod<digest>`: features/hook.py)
    must satisfy: a forward or backward whose family's template for that direction calls
    hooks (`Family.features` / `Family.bwd_features` list `scoremod` / `maskmod`; no decode
    kernel takes them), one hook of each kind at most, no built-in score mod beside a
    score_mod (write softcap or ALiBi into the hook: hooks.library), no gqapack."""
    feats = spec.features
    if not isinstance(feats, (tuple, list)) or not all(isinstance(f, str) for f in feats):
        return []  # _check_features reports it
    hooks = [f for f in feats if is_hook_token(f)]
    if not hooks:
        return []
    kinds = [token_kind(f) for f in hooks]
    problems = []
    if spec.direction == "decode":
        problems.append(
            f"features: {', '.join(hooks)}: hooks are compiled into forward and backward "
            f"kernels only for now; drop them for direction={spec.direction!r}"
        )
    # the direction's own list: a family may call hooks in its forward but not its backward
    bwd = spec.direction == "bwd"
    takes_here = fam.bwd_features if bwd else fam.features
    for kind in sorted(set(kinds)):
        if spec.direction != "decode" and kind not in takes_here:
            from flashgen.generator.families import FAMILIES

            takes = [k for k in KIND_TOKENS.values() if k in takes_here]
            others = [
                f.name for f in FAMILIES.values() if kind in (f.bwd_features if bwd else f.features)
            ]
            where = "backward" if bwd else "forward"
            problems.append(
                f"features: a {kind} hook is not supported by family {fam.name}'s {where} "
                f"(it takes {', '.join(takes) or 'none'} here); families whose {where} takes "
                f"{kind} hooks: {', '.join(others) or 'none'}; use "
                + (" or ".join(f"--family {n}" for n in others) or "no hook")
            )
        if kinds.count(kind) > 1:
            problems.append(
                f"features: {kinds.count(kind)} {kind} hooks; a variant takes one of each kind, "
                "so combine them into one function"
            )
    builtin = [f for f in feats if f in ("softcap", "alibi")]
    if "scoremod" in kinds and builtin:
        problems.append(
            f"features: a score_mod hook with {', '.join(builtin)}: write the built-in score mod "
            "into the hook (hooks.library.softcap_score / alibi_score compose) and drop "
            f"{', '.join(builtin)}"
        )
    if "gqapack" in feats:
        problems.append(
            "features: gqapack with a hook: a packed tile mixes query heads, and the hook takes "
            "one; drop gqapack"
        )
    return problems


def _check_backward(spec: KernelSpec, fam: Family) -> list[str]:
    """What the backward refuses: families without a backward template, features their
    backward lacks (`Family.bwd_features`; `gqapack` in every family), and a value head dim of
    its own."""
    if not fam.bwd_template:
        from flashgen.generator.families import FAMILIES

        # the families whose backward ships (proven on a GPU)
        with_bwd = [f"--family {f.name}" for f in FAMILIES.values() if f.bwd_axes]
        return [
            f"direction='bwd': family {fam.name} has no backward kernel yet; use "
            f"{' or '.join(with_bwd)} for the backward pass"
        ]
    problems = []
    if isinstance(spec.features, (tuple, list)) and all(isinstance(f, str) for f in spec.features):
        feats = tuple(spec.features)
        # unknown tokens were named by _check_features; judge the known ones here
        for f in (f for f in feats if f in FEATURES and f not in fam.bwd_features):
            if f == "gqapack":
                problems.append(
                    f"features={feats!r}: gqapack has no backward (it packs a decoding "
                    "forward's query heads; the backward reads K and V once per GQA group "
                    "already); drop gqapack for direction='bwd'"
                )
            elif f == "deterministic":
                problems.append(
                    f"features={feats!r}: the {fam.name} backward has no deterministic mode "
                    "(its dQ is added by reductions in any order); use --family mma for "
                    "bit-identical gradients, or drop deterministic"
                )
            else:
                plain = sorted(fam.bwd_features - set(KIND_TOKENS.values()))  # hooks aside
                problems.append(
                    f"features={feats!r}: the {fam.name} backward supports "
                    f"{', '.join(plain) or 'no features'}; drop {f} for direction='bwd'"
                )
    if spec.dv != spec.d:
        problems.append(
            f"dv={spec.dv}: the backward pass needs v's head dim equal to d={spec.d} for now; "
            "leave dv unset for direction='bwd'"
        )
    return problems


def _check_decode(spec: KernelSpec, fam: Family) -> list[str]:
    """What the decode direction refuses: families without a decode template, and the
    features it lacks (`Family.decode_features`)."""
    if not fam.decode_template:
        from flashgen.generator.families import FAMILIES

        with_decode = [f"--family {f.name}" for f in FAMILIES.values() if f.decode_template]
        return [
            f"direction='decode': family {fam.name} has no decode kernel; use "
            f"{' or '.join(with_decode)}"
        ]
    problems = []
    if isinstance(spec.features, (tuple, list)) and all(isinstance(f, str) for f in spec.features):
        for f in (f for f in spec.features if f in FEATURES and f not in fam.decode_features):
            problems.append(
                f"features={tuple(spec.features)!r}: the {fam.name} decode kernel supports "
                f"{', '.join(sorted(fam.decode_features)) or 'no features'}; drop {f} for "
                "direction='decode'"
                + (" (it always packs a GQA group's query heads)" if f == "gqapack" else "")
            )
    return problems


def _families() -> list[Family]:
    from flashgen.generator.families import FAMILIES

    return list(FAMILIES.values())


def _canonical_features(features: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    # hook tokens sit after the run-time features (score_mod, then mask_mod), before gqapack
    order = list(FEATURES)
    hook_at = len(RUNTIME_FEATURES) - 0.5

    def key(f: str) -> tuple[float, str]:
        if is_hook_token(f):
            return hook_at + (0.0 if f.startswith("scoremod") else 0.25), f
        return float(order.index(f)), f

    return tuple(sorted(features, key=key))
