"""Content-addressed on-disk cache for cubins: atomic writes, a file lock, hash-verified reads.

Every folder flashgen writes into is private: created `0700` by this user, and when it already
exists, checked to be a real directory (not a symlink) owned by this user that nobody else can
write. A folder in a shared place (the system temp folder) must be private outright; the
user's own cache directory may be readable by others but not writable. Files inside follow the
umask (0644 under the usual 022), like any tool's output.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CACHE_ENV = "FLASHGEN_CACHE_DIR"


class FlashgenWarning(UserWarning):
    """A one-line note from flashgen (the CLI prints it as `warning: ...`)."""


class UnsafeDirectory(OSError):
    """A folder flashgen would write into is not private to this user (the message says why)."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path} {why}; flashgen writes only into folders private to this user")
        self.path = path
        self.why = why


# ---- private folders ---------------------------------------------------------------------------
def _my_uid() -> int:
    return os.getuid()


def _why_unsafe(path: Path, st: os.stat_result, *, private: bool) -> str | None:
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != _my_uid():
        return f"belongs to uid {st.st_uid}, not to this user (uid {_my_uid()})"
    mode = stat.S_IMODE(st.st_mode)
    if mode & (0o077 if private else 0o022):
        return f"has mode {mode:04o}; others may {'use' if private else 'write'} it"
    return None


def ensure_private_dir(path: Path, *, private: bool = True, parents: bool = False) -> Path:
    """Create `path` with mode 0700, or accept the existing one when it is safe; return it.

    Safe means: a real directory (an `lstat`, so a symlink is never followed), owned by this
    user, with no group/other access (`private=True`, for folders in shared places) or at least
    no group/other write access (`private=False`, the user's own cache folder). A folder we own
    whose mode is merely too open is tightened to 0700; anything else raises UnsafeDirectory.
    `parents=True` creates missing parents with the default mode first.
    """
    if parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    why = _why_unsafe(path, st, private=private)
    if why is not None and why.startswith("has mode"):
        os.chmod(path, 0o700, follow_symlinks=False)  # ours, a real directory: just tighten it
        st = os.lstat(path)
        why = _why_unsafe(path, st, private=private)
    if why is not None:
        raise UnsafeDirectory(path, why)
    return path


# ---- file modes --------------------------------------------------------------------------------
def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux /proc)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # portable fallback: read by setting, then restore at once
    os.umask(mask)
    return mask


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the whole new one.

    The new file gets the mode any tool's output gets, 0666 minus the umask (0644 under 022);
    the temporary file is created with O_EXCL (mkstemp) and renamed over `path`, so a symlink
    planted at `path` is replaced, never followed.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ---- where the cache lives ---------------------------------------------------------------------
def default_cache_dir() -> Path:
    """`FLASHGEN_CACHE_DIR`, else `$XDG_CACHE_HOME/flashgen`, else `~/.cache/flashgen`.

    Only computes the path: nothing is created.
    """
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "flashgen"


def shared_temp_dir(name: str) -> Path:
    """`<system temp>/<name>-<uid>`: a per-user folder in the shared temp folder (not created)."""
    return Path(tempfile.gettempdir()) / f"{name}-{os.getuid()}"


_fallbacks: dict[Path, Path] = {}
_fallback_lock = threading.Lock()


def _fresh_private_dir(prefix: str) -> Path:
    """A new mkdtemp folder (0700, unguessable), removed when the process exits."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _fallback_for(wanted: Path, reason: str) -> Path:
    """The temporary cache used instead of `wanted` (one warning per folder and process)."""
    with _fallback_lock:
        if wanted in _fallbacks:
            return _fallbacks[wanted]
        shared = shared_temp_dir("flashgen-cache")
        try:
            fallback = ensure_private_dir(shared)
            note = ""
        except OSError as exc:  # someone else's folder, or a symlink: never use it
            fallback = _fresh_private_dir("flashgen-cache-")
            note = f" ({shared} is not safe to use: {_reason(exc)}; this one is removed at exit)"
        how = (
            f"point {CACHE_ENV} at a folder you own and can write"
            if os.environ.get(CACHE_ENV)
            else f"make it writable or set {CACHE_ENV} to a folder you own"
        )
        warnings.warn(
            f"cache folder {wanted} cannot be used ({reason}); caching in {fallback} for now"
            f"{note}; {how}",
            FlashgenWarning,
            stacklevel=3,
        )
        _fallbacks[wanted] = fallback
        return fallback


def _reason(exc: OSError) -> str:
    if isinstance(exc, UnsafeDirectory):
        return f"it {exc.why}"
    if isinstance(exc, (FileExistsError, NotADirectoryError)):
        return "a part of its path is a file, not a folder"
    if isinstance(exc, PermissionError) or exc.errno == errno.EROFS:
        return "this user cannot write there"
    return (exc.strerror or str(exc)).lower()


def usable_cache_dir(path: Path) -> Path:
    """`path`, created private when missing and checked to be writable; else a temporary
    private fallback, with one warning that says why and how to fix it."""
    try:
        ensure_private_dir(path, private=False, parents=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".probe"):
            pass
    except OSError as exc:
        return _fallback_for(path, _reason(exc))
    return path


def cache_dir() -> Path:
    """The cache directory in use (created if needed); a private temporary one, with a
    warning, when the configured one is unwritable or not this user's."""
    return usable_cache_dir(default_cache_dir())


def cache_key(*parts: str) -> str:
    """sha256 over the parts, each length-prefixed so no two part lists collide."""
    h = hashlib.sha256()
    for p in parts:
        b = p.encode()
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


@contextlib.contextmanager
def locked(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file `lock_path` (a process that wants it too waits).

    The lock file is opened without following a symlink and without truncating anything.
    """
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class CubinCache:
    """Entries `<key>.cubin` + `<key>.json` (metadata with the cubin's sha256) in `root`/<xx>/.

    Constructing one creates nothing: the folder is made (private) on the first write or lock.
    With no `root`, the configured folder is used, or a temporary one when that is unusable.
    """

    def __init__(self, root: Path | None = None) -> None:
        self._explicit = root is not None
        self.root = root if root is not None else default_cache_dir()
        self._ready = False

    def _prepare(self) -> None:
        if self._ready:
            return
        if self._explicit:
            ensure_private_dir(self.root, private=False, parents=True)
        else:
            self.root = usable_cache_dir(self.root)
        self._ready = True

    def paths(self, key: str) -> tuple[Path, Path]:
        """The cubin and metadata paths of `key`."""
        d = self.root / key[:2]
        return d / f"{key}.cubin", d / f"{key}.json"

    def _bucket(self, key: str) -> Path:
        self._prepare()
        return ensure_private_dir(self.root / key[:2], private=False)

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
        self._bucket(key)
        cubin_p, meta_p = self.paths(key)
        atomic_write(cubin_p, data)
        full = dict(meta, sha256=hashlib.sha256(data).hexdigest())
        atomic_write(meta_p, json.dumps(full, sort_keys=True).encode())

    def lock(self, key: str) -> contextlib.AbstractContextManager[None]:
        """The build lock of one key (`<key>.lock` next to the entry)."""
        bucket = self._bucket(key)
        return locked(bucket / f"{key}.lock")

    def entries(self) -> list[Path]:
        """Every cubin in the cache (reads only; creates nothing)."""
        return sorted(self.root.glob("*/*.cubin")) if self.root.is_dir() else []

    def size(self) -> int:
        """Bytes of every file under the cache folder (reads only; creates nothing)."""
        if not self.root.is_dir():
            return 0
        return sum(p.lstat().st_size for p in self.root.rglob("*") if p.is_file())

    def clear(self) -> int:
        """Remove every entry, lock and bucket folder, and the cache folder itself when that
        leaves it empty; return how many cubins were removed. Touches only the cache's own
        layout (`<xx>/<key>.*`), never other files someone put there."""
        if not self.root.is_dir() or self.root.is_symlink():
            return 0
        n = 0
        for bucket in sorted(self.root.iterdir()):
            if bucket.is_symlink() or not bucket.is_dir() or len(bucket.name) != 2:
                continue
            for p in sorted(bucket.iterdir()):
                if p.suffix == ".cubin":
                    n += 1
                with contextlib.suppress(OSError):
                    p.unlink()
            with contextlib.suppress(OSError):
                bucket.rmdir()
        with contextlib.suppress(OSError):
            self.root.rmdir()  # only when empty
        return n
