"""Content-addressed on-disk cache for cubins: atomic writes, a file lock, hash-verified reads."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def default_cache_dir() -> Path:
    """`FLASHGEN_CACHE_DIR`, else `$XDG_CACHE_HOME/flashgen`, else `~/.cache/flashgen`."""
    env = os.environ.get("FLASHGEN_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "flashgen"


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".probe"):
            pass
    except OSError:
        return False
    return True


def cache_dir() -> Path:
    """The cache directory in use; falls back to a temporary one (with a warning) if read-only."""
    path = default_cache_dir()
    if _writable(path):
        return path
    fallback = Path(tempfile.gettempdir()) / f"flashgen-cache-{os.getuid()}"
    warnings.warn(
        f"cache dir {path} is not writable; using {fallback} (set FLASHGEN_CACHE_DIR to choose)",
        stacklevel=2,
    )
    fallback.mkdir(parents=True, exist_ok=True)
    return fallback


def cache_key(*parts: str) -> str:
    """sha256 over the parts, each length-prefixed so no two part lists collide."""
    h = hashlib.sha256()
    for p in parts:
        b = p.encode()
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path`.lock (a process that builds the same key waits)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class CubinCache:
    """Entries `<key>.cubin` + `<key>.json` (metadata with the cubin's sha256) in `root`."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else cache_dir()

    def paths(self, key: str) -> tuple[Path, Path]:
        """The cubin and metadata paths of `key`."""
        d = self.root / key[:2]
        return d / f"{key}.cubin", d / f"{key}.json"

    def get(self, key: str) -> tuple[bytes, dict[str, Any]] | None:
        """The entry, or None when it is missing, truncated or corrupted (then it is removed)."""
        cubin_p, meta_p = self.paths(key)
        try:
            meta = json.loads(meta_p.read_text())
            data = cubin_p.read_bytes()
        except (OSError, ValueError):
            return None
        if not isinstance(meta, dict) or hashlib.sha256(data).hexdigest() != meta.get("sha256"):
            for p in (cubin_p, meta_p):
                with contextlib.suppress(OSError):
                    p.unlink()
            return None
        return data, meta

    def put(self, key: str, data: bytes, meta: dict[str, Any]) -> None:
        """Store an entry: cubin first, then the metadata that vouches for it."""
        cubin_p, meta_p = self.paths(key)
        atomic_write(cubin_p, data)
        full = dict(meta, sha256=hashlib.sha256(data).hexdigest())
        atomic_write(meta_p, json.dumps(full, sort_keys=True).encode())

    def lock(self, key: str) -> contextlib.AbstractContextManager[None]:
        """The build lock of one key."""
        return locked(self.paths(key)[0])

    def entries(self) -> list[Path]:
        """Every cubin in the cache."""
        return sorted(self.root.glob("*/*.cubin")) if self.root.exists() else []

    def clear(self) -> int:
        """Remove every entry; return how many cubins were removed."""
        n = 0
        if not self.root.exists():
            return 0
        for p in sorted(self.root.glob("*/*")):
            if p.suffix == ".cubin":
                n += 1
            with contextlib.suppress(OSError):
                p.unlink()
        return n
