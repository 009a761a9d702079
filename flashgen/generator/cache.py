"""Content-addressed on-disk cache for cubins: atomic writes, per-key locks, checksummed reads.

Every folder flashgen writes into is private: created `0700` by this user, and when it already
exists, checked to be a real directory (not a symlink) owned by this user that nobody else can
write. A folder in a shared place (the system temp folder) must be private outright; the
user's own cache directory may be readable by others but not writable. A folder flashgen did
not create is never changed (no chmod): one that fails the check is refused with the fix. Files
inside follow the umask (0644 under the usual 022), like any tool's output.

`flashgen cache clear` may run while other processes build: it removes only entries whose lock
is free, and builders recreate any folder it removed (locks, buckets, the cache folder) instead
of failing or moving to a temporary cache.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
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
        verb, fix = ("use", "700") if private else ("write", "go-w")
        # never chmod it ourselves: a folder the user made (a shared 1777 or setgid 2775 one)
        # keeps its mode and group; the user decides
        return (
            f"has mode {mode:04o}, so others may {verb} it (flashgen changes no folder it did "
            f"not create: run `chmod {fix} {path}` or choose another folder)"
        )
    return None


def ensure_private_dir(path: Path, *, private: bool = True, parents: bool = False) -> Path:
    """Create `path` with mode 0700, or accept the existing one when it is safe; return it.

    Safe means: a real directory (an `lstat`, so a symlink is never followed), owned by this
    user, with no group/other access (`private=True`, for folders in shared places) or at least
    no group/other write access (`private=False`, the user's own cache folder). An existing
    folder is never changed: one that is not safe raises UnsafeDirectory, whose message says
    how to fix it. `parents=True` creates missing parents with the default mode first.
    """
    if parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    why = _why_unsafe(path, os.lstat(path), private=private)
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


def atomic_write(path: Path, data: bytes, *, make_parents: bool = True) -> None:
    """Write `data` to `path` so that readers see the old file or the whole new one.

    The new file gets the mode any tool's output gets, 0666 minus the umask (0644 under 022);
    the temporary file is created with O_EXCL (mkstemp) and renamed over `path`, so a symlink
    planted at `path` is replaced, never followed. `make_parents=False` leaves a missing folder
    missing (FileNotFoundError): the cache makes its folders private itself.
    """
    if make_parents:
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


def holds_bytes(path: Path, data: bytes) -> bool:
    """True when `path` is a regular file (not a symlink) whose content is exactly `data`.

    Reads at most len(data) + 1 bytes, and only from a regular file: a FIFO, a device or a
    symlink (to /dev/zero, say) at `path` is simply "different", never opened for reading, so
    this neither hangs nor reads without end. Any error reading also counts as "different".
    """
    try:
        if not _regular_of_size(os.lstat(path), len(data)):
            return False
        # O_NONBLOCK: should a FIFO have replaced the file since the lstat, open does not wait
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not _regular_of_size(os.fstat(fd), len(data)):
            return False
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(len(data) + 1) == data
    except OSError:
        return False
    finally:
        os.close(fd)


def _regular_of_size(st: os.stat_result, size: int) -> bool:
    return stat.S_ISREG(st.st_mode) and st.st_size == size


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
        shared = fallback_cache_dir()
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


# A concurrent `cache clear` can remove a folder between our creating and using it: that is
# worth a few retries, never a move to a temporary cache.
_VANISH_RETRIES = 5


def usable_cache_dir(path: Path) -> Path:
    """`path`, created private when missing and checked to be writable; else a temporary
    private fallback, with one warning that says why and how to fix it.

    Checked on every call: a folder that was unusable for a moment (removed by a concurrent
    `cache clear`, a full disk since freed) is used again as soon as it works.
    """
    for attempt in range(_VANISH_RETRIES):
        try:
            ensure_private_dir(path, private=False, parents=True)
            with tempfile.NamedTemporaryFile(dir=path, prefix=".probe"):
                pass
            return path
        except FileNotFoundError as exc:  # removed between the mkdir and the probe: again
            if attempt == _VANISH_RETRIES - 1:
                return _fallback_for(path, _reason(exc))
        except OSError as exc:
            return _fallback_for(path, _reason(exc))
    raise AssertionError("unreachable")  # pragma: no cover


def fallback_cache_dir() -> Path:
    """`<temp>/flashgen-cache-<uid>`: where the cache goes when the configured folder is
    unusable (not created here)."""
    return shared_temp_dir("flashgen-cache")


def clear_fallback_cache() -> int:
    """Clear the fallback cache folder like `CubinCache.clear` when it is ours and private
    (a folder someone else planted at that guessable path is left alone); the cubins removed."""
    root = fallback_cache_dir()
    try:
        if _why_unsafe(root, os.lstat(root), private=True) is not None:
            return 0
    except OSError:
        return 0
    return CubinCache(root).clear()


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


# ---- locks ------------------------------------------------------------------------------------
LOCK_NOTE_AFTER_S = 2.0  # a wait longer than this is announced (one warning), then blocks
_LOCK_POLL_S = 0.05
_LOCK_ATTEMPTS = 100  # a lock file removed under us (by `cache clear`) this often: give up


@contextlib.contextmanager
def locked(
    lock_path: Path,
    *,
    make_parent: Callable[[], object] | None = None,
    waiting_for: str | None = None,
    remove_when_done: bool = False,
) -> Iterator[float]:
    """Hold an exclusive lock on the file `lock_path`; yield the seconds spent waiting for it.

    The lock file is opened without following a symlink and without truncating anything. When
    its folder is missing (a concurrent `cache clear` removed it), `make_parent()` recreates it.
    The lock held is always the file now at `lock_path`: one unlinked (by a `cache clear`, or
    by `remove_when_done`) while we waited for it is dropped and the new one taken, so two
    holders never coexist. That makes `remove_when_done=True` safe: the file is unlinked while
    still held, so locks of one-off names do not pile up. A wait longer than LOCK_NOTE_AFTER_S
    is announced by one FlashgenWarning naming `waiting_for`.
    """
    fd, waited = _acquire(lock_path, make_parent, waiting_for)
    try:
        yield waited
    finally:
        if remove_when_done:
            with contextlib.suppress(OSError):
                lock_path.unlink()  # still ours (held and linked): nobody else's to lose
        os.close(fd)  # closing the only descriptor releases the lock


def _acquire(
    lock_path: Path, make_parent: Callable[[], object] | None, waiting_for: str | None
) -> tuple[int, float]:
    """(descriptor holding the lock, seconds waited)."""
    start = time.monotonic()
    for _ in range(_LOCK_ATTEMPTS):
        fd = _open_lock(lock_path, make_parent)
        try:
            _flock_announcing(fd, lock_path, start, waiting_for)
            if _still_linked(fd, lock_path):
                return fd, time.monotonic() - start
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # removed while we waited: lock the file that is there now
    raise OSError(
        errno.EAGAIN,
        f"the lock file {lock_path} was removed {_LOCK_ATTEMPTS} times while flashgen waited "
        "for it; stop the loop that runs `flashgen cache clear` and try again",
    )


def _open_lock(lock_path: Path, make_parent: Callable[[], object] | None) -> int:
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    for attempt in range(_VANISH_RETRIES):
        try:
            return os.open(lock_path, flags, 0o600)
        except FileNotFoundError:
            if make_parent is None or attempt == _VANISH_RETRIES - 1:
                raise
            make_parent()
    raise AssertionError("unreachable")  # pragma: no cover


def _flock_announcing(fd: int, lock_path: Path, start: float, waiting_for: str | None) -> None:
    """flock(fd): polls first, then, past LOCK_NOTE_AFTER_S, warns once and blocks."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() - start >= LOCK_NOTE_AFTER_S:
                break
            time.sleep(_LOCK_POLL_S)
    if waiting_for is not None:
        warnings.warn(
            f"waiting for {waiting_for} (another flashgen process holds {lock_path}); this "
            "build goes on when that one ends",
            FlashgenWarning,
            stacklevel=5,
        )
    fcntl.flock(fd, fcntl.LOCK_EX)


def _still_linked(fd: int, lock_path: Path) -> bool:
    """True when `lock_path` still names the file `fd` has open (not unlinked or replaced)."""
    try:
        now = os.lstat(lock_path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)


def try_lock(lock_path: Path) -> int | None:
    """A descriptor holding the lock `lock_path` (created when missing) when it is free now,
    else None; never waits. For `cache clear`: what is locked is in use and stays, and what it
    removes it removes under the lock, so a builder that waited notices (`_still_linked`)."""
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


# ---- the cache --------------------------------------------------------------------------------
ENTRY_SUM = "entry_sha256"  # metadata field: checksum of every other field and the key
_KEY_FILE = re.compile(r"^\.?([0-9a-f]{64})\.(cubin|json|lock)(\.[A-Za-z0-9_]+)?$")


def _entry_sum(key: str, meta: dict[str, Any]) -> str:
    """The checksum of an entry's metadata: the key and every field but the checksum itself
    (canonical JSON), so an edited register count or a renamed entry is noticed."""
    rest = {k: v for k, v in meta.items() if k != ENTRY_SUM}
    return cache_key(key, json.dumps(rest, sort_keys=True))


class CubinCache:
    """Entries `<key>.cubin` + `<key>.json` (metadata with the cubin's sha256) in `root`/<xx>/.

    The metadata also carries ENTRY_SUM, a checksum over itself and the key: an entry whose
    cubin or metadata does not match is a miss, removed, and rebuilt. Constructing one creates
    nothing: the folder is made (private) on the first write or lock. With no `root`, the
    configured folder is used, or a temporary one when that is unusable.
    """

    def __init__(self, root: Path | None = None) -> None:
        self._explicit = root is not None
        self.root = root if root is not None else default_cache_dir()
        self._ready = False

    def _prepare(self) -> None:
        if self._ready:
            return
        if not self._explicit:
            self.root = usable_cache_dir(self.root)
        self._ready = True

    def paths(self, key: str) -> tuple[Path, Path]:
        """The cubin and metadata paths of `key`."""
        d = self.root / key[:2]
        return d / f"{key}.cubin", d / f"{key}.json"

    def _bucket(self, key: str) -> Path:
        """The folder of `key`'s entry, created (private) with the cache folder when missing:
        on every call, since a concurrent `cache clear` removes empty folders."""
        self._prepare()
        for attempt in range(_VANISH_RETRIES):
            try:
                ensure_private_dir(self.root, private=False, parents=True)
                return ensure_private_dir(self.root / key[:2], private=False)
            except FileNotFoundError:  # the cache folder went between the two: again
                if attempt == _VANISH_RETRIES - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def get(self, key: str) -> tuple[bytes, dict[str, Any]] | None:
        """The entry, or None when it is missing, truncated or corrupted (then it is removed)."""
        cubin_p, meta_p = self.paths(key)
        try:
            meta = json.loads(meta_p.read_text())
            data = cubin_p.read_bytes()
        except (OSError, ValueError):
            return None
        if not (
            isinstance(meta, dict)
            and meta.get(ENTRY_SUM) == _entry_sum(key, meta)
            and meta.get("sha256") == hashlib.sha256(data).hexdigest()
        ):
            self.discard(key)
            return None
        return data, meta

    def discard(self, key: str) -> None:
        """Remove `key`'s entry (an entry found wanting), if there is one."""
        for p in self.paths(key):
            with contextlib.suppress(OSError):
                p.unlink()

    def put(self, key: str, data: bytes, meta: dict[str, Any]) -> None:
        """Store an entry: cubin first, then the metadata that vouches for it. A failed cubin
        write leaves the old entry as it was; a failed metadata write removes the entry whole
        (its cubin is new, the metadata that would vouch for it is not)."""
        full = dict(meta, sha256=hashlib.sha256(data).hexdigest())
        full[ENTRY_SUM] = _entry_sum(key, full)
        cubin_p, meta_p = self.paths(key)
        self._write(key, cubin_p, data)
        try:
            self._write(key, meta_p, json.dumps(full, sort_keys=True).encode())
        except BaseException:
            self.discard(key)
            raise

    def _write(self, key: str, path: Path, data: bytes) -> None:
        """atomic_write into `key`'s folder, recreated when a concurrent `cache clear` removed
        it (or the temporary file) before the rename."""
        for attempt in range(_VANISH_RETRIES):
            self._bucket(key)
            try:
                atomic_write(path, data, make_parents=False)
                return
            except FileNotFoundError:
                if attempt == _VANISH_RETRIES - 1:
                    raise

    def lock(self, key: str) -> contextlib.AbstractContextManager[float]:
        """The build lock of one key (`<key>.lock` next to the entry); entering it yields the
        seconds spent waiting for another process that holds it."""
        bucket = self._bucket(key)
        return locked(
            bucket / f"{key}.lock",
            make_parent=lambda: self._bucket(key),
            waiting_for=f"another build of the same kernel into {self.root}",
        )

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
        leaves it empty; return how many cubins were removed.

        Touches only the cache's own layout (`<xx>/<key>.*` and their temporary files), never
        other files someone put there. An entry whose lock is held is being built right now:
        it stays, so a clear never fails a concurrent build.
        """
        if not self.root.is_dir() or self.root.is_symlink():
            return 0
        n = 0
        for bucket in sorted(self.root.iterdir()):
            if bucket.is_symlink() or not bucket.is_dir() or len(bucket.name) != 2:
                continue
            n += _clear_bucket(bucket)
            with contextlib.suppress(OSError):
                bucket.rmdir()  # only when empty
        with contextlib.suppress(OSError):
            self.root.rmdir()  # only when empty
        return n


def _clear_bucket(bucket: Path) -> int:
    """Remove the entries of one bucket whose lock is free; the cubins removed."""
    files: dict[str, list[Path]] = {}
    for p in bucket.iterdir():
        m = _KEY_FILE.match(p.name)
        if m and m.group(1).startswith(bucket.name):
            files.setdefault(m.group(1), []).append(p)
    return sum(_clear_key(bucket, key, paths) for key, paths in sorted(files.items()))


def _clear_key(bucket: Path, key: str, paths: list[Path]) -> int:
    """Remove one key's files unless a build holds its lock; 1 when a cubin went."""
    lock_p = bucket / f"{key}.lock"
    fd = try_lock(lock_p)
    if fd is None:
        return 0  # held: a build of this key is running (or the lock is not a plain file)
    try:
        n = 0
        for p in paths:
            if p != lock_p:
                with contextlib.suppress(OSError):
                    p.unlink()
                    n += p.name == f"{key}.cubin"
        with contextlib.suppress(OSError):
            lock_p.unlink()  # last, under the lock: a waiter notices and takes a new one
        return n
    finally:
        os.close(fd)
