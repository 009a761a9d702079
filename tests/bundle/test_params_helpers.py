"""The header's params helpers, flashgen_fwd_params_contiguous and flashgen_bwd_params_contiguous,
set EVERY field of their struct, whatever the struct held before: a struct declared on the stack
and handed to a helper must run (sources/params_helpers.c fills it with garbage bytes first).

The fields are read from the generated header's struct definitions, and each must have its value
below: a field added to a struct without a value here fails the test, so that whoever adds one
also decides (and the helper sets) its default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flashgen.bundle.emit import HEADER, bundle_files

from ._support import (
    BWD_A,
    MMA,
    SIMT,
    STAND_IN,
    bwd_symbol,
    compile_all,
    cuda_includes,
    dtype_enum,
    fill,
    prose,
    rows,
    run_program,
    symbol,
    tool,
    words,
)
from .conftest import StandIns

# the variants the program calls (d = 32 = its D): a plain forward of each family here, the
# backward of the same d
FWD_RUNS = [SIMT, MMA]
BWD_RUNS = [BWD_A]
assert all(s in STAND_IN for s in [*FWD_RUNS, *BWD_RUNS])
PATTERNS = 3  # 0xAB, 0xFF, pseudo-random bytes

Q_STRIDES = ["(long long)H * TQ * D", "(long long)TQ * D", "D"]
K_STRIDES = ["(long long)H * TK * D", "(long long)TK * D", "D"]
AXES = ["batch", "head", "token"]


def strides(tensor: str, values: list[str]) -> dict[str, str]:
    return {f"{tensor}_{axis}_stride": v for axis, v in zip(AXES, values, strict=True)}


# each field's value after the helper, as a C expression over the program's names (B, H, TQ, TK,
# D; the tensors q, k, v, o, lse, dout, dq, dk, grad_v)
FWD_FIELDS = {
    "q": "q", "k": "k", "v": "v", "o": "o", "lse": "lse",
    "B": "B", "H": "H", "Tq": "TQ", "Tk": "TK", "d": "D",
    **strides("q", Q_STRIDES), **strides("k", K_STRIDES),
    **strides("v", K_STRIDES), **strides("o", Q_STRIDES),
    "scale": "1.0f / sqrtf((float)D)",
    "H_kv": "H",  # plain multi-head attention
    "use_window": "0", "window_left": "-1", "window_right": "-1",  # no window
    "softcap": "0.0f",  # off
    "alibi_slopes": "NULL",  # off
    "dv": "D",  # V's head dim is d
}  # fmt: skip
BWD_FIELDS = {
    "q": "q", "k": "k", "v": "v", "o": "o", "dout": "dout", "lse": "lse",
    "dq": "dq", "dk": "dk", "dv": "grad_v",
    "B": "B", "H": "H", "H_kv": "H", "Tq": "TQ", "Tk": "TK", "d": "D",
    **{f: v for t in ("q", "o", "dout", "dq") for f, v in strides(t, Q_STRIDES).items()},
    **{f: v for t in ("k", "v", "dk", "dv") for f, v in strides(t, K_STRIDES).items()},
    "scale": "1.0f / sqrtf((float)D)",
    "workspace": "NULL", "workspace_bytes": "0",  # the caller's to set
}  # fmt: skip


def struct_fields(header: str, name: str) -> list[str]:
    """The field names of `typedef struct name { ... } name;` in a C header, in order."""
    m = re.search(rf"typedef\s+struct\s+{name}\s*\{{(.*?)\}}\s*{name}\s*;", header, re.S)
    assert m is not None, f"no struct {name}"
    body = re.sub(r"/\*.*?\*/|//[^\n]*", " ", m.group(1), flags=re.S)
    fields = []
    for decl in body.split(";"):
        if decl.strip():  # `type a`, or `type a, b, c`: the last word of each declarator
            fields += [re.findall(r"\w+", d)[-1] for d in decl.split(",")]
    return fields


def test_the_test_knows_every_field_of_both_structs() -> None:
    """A new field of either struct needs its value after the helper in FWD_FIELDS or
    BWD_FIELDS (and the helper must set it: the program below checks)."""
    header = bundle_files(STAND_IN)[HEADER]
    fwd = struct_fields(header, "flashgen_fwd_params")
    bwd = struct_fields(header, "flashgen_bwd_params")
    assert len(fwd) == len(set(fwd)) and len(bwd) == len(set(bwd))
    assert set(fwd) == set(FWD_FIELDS), set(fwd) ^ set(FWD_FIELDS)
    assert set(bwd) == set(BWD_FIELDS), set(bwd) ^ set(BWD_FIELDS)


@pytest.mark.parametrize(
    ("compiler", "lang", "std"), [("gcc", "c", "-std=c99"), ("g++", "c++", "-std=c++11")]
)
def test_params_helpers_set_every_field_of_a_struct_full_of_garbage(
    stand_ins: StandIns, tmp_path: Path, compiler: str, lang: str, std: str
) -> None:
    """Structs filled with garbage bytes, then given to the helpers: every field holds its value
    (the defaults included: H_kv = H, dv = d, no window, softcap or ALiBi, no workspace), no
    garbage byte is left (padding included), the variants' checks accept the params and the
    dispatch runs the plain variant of the key on the CPU stand-ins, forward and backward (the
    backward with its workspace set)."""
    root = stand_ins.root
    header = (root / HEADER).read_text()
    fwd_fields = struct_fields(header, "flashgen_fwd_params")
    bwd_fields = struct_fields(header, "flashgen_bwd_params")
    source = fill(
        "params_helpers.c",
        FWD_FIELDS="\n  ".join(f"FIELD({f}, {FWD_FIELDS[f]})" for f in fwd_fields),
        BWD_FIELDS="\n  ".join(f"FIELD({f}, {BWD_FIELDS[f]})" for f in bwd_fields),
        FWD_RUNS="\n  ".join(
            f"FWD_RUN({symbol(s)}, {dtype_enum(s)}, {int(s.causal)})" for s in FWD_RUNS
        ),
        BWD_RUNS="\n  ".join(
            f"BWD_RUN({bwd_symbol(s)}, {dtype_enum(s)}, {int(s.causal)})" for s in BWD_RUNS
        ),
    )
    src = tmp_path / f"params_helpers.{lang}"
    src.write_text(source)
    cc = tool(compiler)
    compile_all(
        [[cc, "-x", lang, std, "-Wall", "-Wextra", "-Werror", "-c", f"-I{root}", *cuda_includes(),
          str(src), "-o", "params_helpers.o"]],
        tmp_path,
    )  # fmt: skip
    compile_all(
        [[tool("g++"), "params_helpers.o", *stand_ins.objects, "-o", "params_helpers"]], tmp_path
    )
    out = run_program(tmp_path / "params_helpers")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr

    for what, fields in (("fwd", fwd_fields), ("bwd", bwd_fields)):
        for pattern in map(str, range(PATTERNS)):
            found = [r[2:] for r in rows(out.stdout, "field") if r[:2] == [what, pattern]]
            assert [r[0] for r in found] == fields, (what, pattern)
            wrong = {name: raw for name, ok, raw in found if ok != "1"}
            assert not wrong, (
                f"{what} helper, garbage {pattern}: fields left wrong (their bytes): {wrong}"
            )
            bytes_same = [r[2] for r in rows(out.stdout, "bytes") if r[:2] == [what, pattern]]
            assert bytes_same == ["1"], f"{what}, pattern {pattern}: garbage bytes left"
    assert rows(out.stdout, "workspace") == [["bwd", str(p), "1"] for p in range(PATTERNS)]

    runs = [("fwd", symbol(s), s.name) for s in FWD_RUNS]
    runs += [("bwd", bwd_symbol(s), f"{s.name}_post") for s in BWD_RUNS]
    checks, ran = rows(out.stdout, "check"), rows(out.stdout, "run")
    for pattern in map(str, range(PATTERNS)):
        for what, sym, last in runs:
            assert [what, pattern, sym, "0", "NULL"] in checks, (what, sym, pattern, checks)
            assert [what, pattern, sym, "0", last] in ran, (what, sym, pattern, ran)
    assert len(checks) == len(ran) == PATTERNS * len(runs)


def test_header_and_readme_say_the_helpers_set_every_field() -> None:
    """The header and the bundle's README show the helpers on a struct that is not zeroed and
    say they set every field, with the defaults."""
    files = bundle_files(STAND_IN)
    h, readme = prose(files[HEADER]), words(files["README.md"])
    for helper in ("flashgen_fwd_params_contiguous", "flashgen_bwd_params_contiguous"):
        at = h.index(f"static inline void {helper}(")
        comment = h[h.rindex("Fill `p`", 0, at) : at]
        assert "Sets EVERY field of `p`, whatever it held before" in comment, helper
        assert "zeroes the whole struct first, padding included" in comment, helper
        assert f"`{helper}` sets every field" in readme, helper
    for default in (
        "H_kv = H (multi-head attention), dv = d, no sliding window (use_window = 0, "
        "window_left = window_right = -1), softcap = 0 and alibi_slopes = NULL (off)",
        "workspace = NULL, workspace_bytes = 0",
    ):
        assert default in h, default
    assert "flashgen_fwd_params p; /* no need to zero it: the helper sets every field */" in readme
    assert "flashgen_bwd_params p; /* no need to zero it: the helper sets every field */" in readme
