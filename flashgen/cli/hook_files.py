"""`--score-mod FILE:NAME` / `--mask-mod FILE:NAME`: a user hook read from a Python file.

NAME in FILE is either a traced hook (`hk.trace_score_mod(fn, hk.Aux(...), ...)`, needed when
the hook reads aux tensors or scalars) or a plain function of the hook's arguments with no aux,
which is traced here. The file runs as a fresh module (like `python FILE`, without `__main__`),
so it may import flashgen and define helpers. Every failure is one `HookFileError` naming the
value, the rule and the fix.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from flashgen.generator.features.hook import token_of
from flashgen.generator.hooks import Hook
from flashgen.generator.hooks.trace import as_hook

OPTION = {"score_mod": "--score-mod", "mask_mod": "--mask-mod"}


class HookFileError(ValueError):
    """A --score-mod / --mask-mod value that does not name a usable hook."""


def _split(text: str, option: str) -> tuple[Path, str]:
    path, sep, name = text.rpartition(":")
    if not sep or not path or not name.isidentifier():
        raise HookFileError(
            f"{option} {text}: expected FILE:NAME (a Python file and the hook or function "
            f"in it), e.g. {option} hooks.py:doc_mask"
        )
    return Path(path), name


def _module(path: Path, option: str, text: str) -> Any:
    if not path.is_file():
        raise HookFileError(
            f"{option} {text}: {path} is not a file; name the Python file that defines the hook"
        )
    spec = importlib.util.spec_from_file_location(f"flashgen_user_hook_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise HookFileError(f"{option} {text}: {path} cannot be loaded as Python; name a .py file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's file: whatever it raises is reported in one line
        raise HookFileError(
            f"{option} {text}: running {path} raised {type(exc).__name__}: {exc}; fix the file"
        ) from exc
    return module


def load_hook(text: str, kind: str) -> Hook:
    """The hook `text` (FILE:NAME) names, traced if it is a plain function; its kind must be
    `kind` ("score_mod" or "mask_mod")."""
    option = OPTION[kind]
    path, name = _split(text, option)
    value = getattr(_module(path, option, text), name, None)
    if value is None:
        raise HookFileError(f"{option} {text}: {path} defines no {name}; check the name")
    if not isinstance(value, Hook) and not callable(value):
        raise HookFileError(
            f"{option} {text}: {name} is a {type(value).__name__}; it must be a traced hook or "
            "a function"
        )
    try:
        hook = as_hook(value, kind)
    except Exception as exc:  # tracing errors say what the expression may not do
        raise HookFileError(
            f"{option} {text}: tracing {name} failed ({type(exc).__name__}: {exc}); a hook "
            f"that reads aux values must be traced in the file: NAME = "
            f"hk.trace_{kind}(fn, hk.Aux(...)) (docs/hooks.md)"
        ) from exc
    if hook.kind != kind:
        raise HookFileError(
            f"{option} {text}: {name} is a {hook.kind} hook; pass it with {OPTION[hook.kind]}"
        )
    return hook


def hook_tokens_of(score_mod: str | None, mask_mod: str | None) -> tuple[str, ...]:
    """The feature tokens of the hooks the options name (each hook registered in this
    process, so that a spec carrying its token renders)."""
    tokens = []
    for kind, text in (("score_mod", score_mod), ("mask_mod", mask_mod)):
        if text is not None:
            tokens.append(token_of(load_hook(text, kind)))
    return tuple(tokens)
