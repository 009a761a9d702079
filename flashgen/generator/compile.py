"""Compile rendered kernels with nvcc (a subprocess: works on machines with no GPU), cached."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any

from flashgen._version import __version__
from flashgen.generator.arch import ARCHS, DEFAULT_ARCH, arch_number, check_target, runs_on
from flashgen.generator.cache import (
    CubinCache,
    FlashgenWarning,
    UnsafeDirectory,
    cache_key,
    ensure_private_dir,
    locked,
    shared_temp_dir,
    try_lock,
)
from flashgen.generator.nvcc import TIMEOUT_ENV, find_nvcc, nvcc_timeout, nvcc_version
from flashgen.generator.render import RenderedKernel, render
from flashgen.generator.report import PARSER_VERSION, ResourceReport, parse_ptxas
from flashgen.generator.spec import KernelSpec

BASE_FLAGS: tuple[str, ...] = ("-std=c++17", "-O3", "-lineinfo", "-Xptxas=-v")

# Environment variables that change what nvcc makes of a source, so part of every cache key:
# nvcc adds NVCC_PREPEND_FLAGS / NVCC_APPEND_FLAGS to its command line and takes its host
# compiler from NVCC_CCBIN; its nvcc.profile appends INCLUDES, SYSTEM_INCLUDES, CUDAFE_FLAGS and
# PTXAS_FLAGS from the environment to the include path, cudafe++'s and ptxas' flags
# (PTXAS_FLAGS=-O0 makes another cubin); the host compiler's preprocessor, which nvcc runs on
# the device code too, reads CPATH and CPLUS_INCLUDE_PATH. (The profile's LIBRARIES,
# LD_LIBRARY_PATH and PATH do not change a cubin: linking is not done, and the profile puts
# CUDA's own folders first on PATH.)
NVCC_ENV_FLAGS: tuple[str, ...] = (
    "NVCC_PREPEND_FLAGS",
    "NVCC_APPEND_FLAGS",
    "NVCC_CCBIN",
    "INCLUDES",
    "SYSTEM_INCLUDES",
    "CUDAFE_FLAGS",
    "PTXAS_FLAGS",
    "CPATH",
    "CPLUS_INCLUDE_PATH",
)


def cubin_flags(gencode: str, extra: tuple[str, ...] = ()) -> list[str]:
    """nvcc's flags for one cubin of `gencode` (arch.check_target's): one place, so a batched
    check (batch_compile) compiles exactly as a launch does."""
    return [*BASE_FLAGS, "-cubin", gencode, *extra]


class CompileError(RuntimeError):
    """nvcc failed; the message carries the command and the first error lines."""


@dataclass(frozen=True)
class CompiledKernel:
    """A cubin for one arch, with its ptxas report."""

    spec: KernelSpec
    arch: str
    cubin: bytes
    report: ResourceReport
    cached: bool  # True when it came from the cache without running nvcc

    # seconds nvcc ran (0 for a cache hit), and seconds spent waiting for another process that
    # was building the same kernel (its lock): apart, so a wait is never reported as compiling
    nvcc_seconds: float = 0.0
    waited_seconds: float = 0.0

    @property
    def name(self) -> str:
        """The kernel symbol inside the cubin."""
        return self.spec.name


def _first_errors(text: str, n: int = 12) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    errs = [ln for ln in lines if "error" in ln.lower()]
    return "\n".join((errs or lines)[:n])


def nvcc_flags_seen(args: list[str] | tuple[str, ...]) -> str:
    """Every flag nvcc will see: its command line plus the environment it reads
    (NVCC_ENV_FLAGS: NVCC_APPEND_FLAGS, nvcc.profile's PTXAS_FLAGS, ...)."""
    env = [f"{var}={os.environ.get(var, '')}" for var in NVCC_ENV_FLAGS]
    return " ".join([*args, *env])


def _tree_digest(root: Path) -> str:
    """sha256 over the relative paths and bytes of every file under `root` (sorted)."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        if "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo"):
            continue
        rel = path.relative_to(root).as_posix().encode()
        data = path.read_bytes()
        for part in (rel, data):
            h.update(len(part).to_bytes(8, "little"))
            h.update(part)
    return h.hexdigest()


@cache
def flashgen_version() -> str:
    """The version of the flashgen code that runs: `__version__` plus a digest of the package's
    files (code, templates, tables), so that any change to flashgen makes new cache keys."""
    return f"{__version__}+{_tree_digest(Path(__file__).resolve().parents[1])[:16]}"


# ---- nvcc's work folder ----------------------------------------------------------------------
# `<temp>/flashgen-work-<uid>`. (Before locks were per content, the root was flashgen-nvcc-<uid>,
# locked by 256 shared `lock-<xx>` files; an older flashgen's `cache clear` would remove this
# layout's folders from under nvcc, so the two layouts live apart.)
WORK_ROOT_NAME = "flashgen-work"
_work_root_lock = threading.Lock()
_work_fallback: Path | None = None  # set once the shared work root proved unsafe
_VANISH_RETRIES = 5  # a concurrent `cache clear` removed the root between mkdir and check


def nvcc_work_root() -> Path:
    """The private parent of nvcc's work folders: `<temp>/flashgen-work-<uid>` (0700, ours).

    A fixed path so that a cubin is reproducible (-lineinfo records the folder nvcc ran in).
    When that path is not safe (someone else's folder, a symlink), a fresh mkdtemp folder is used
    instead, with a one-line warning: still private, but cubins then record a random folder.
    A root removed by a concurrent `cache clear` is simply made again: that is no reason to
    leave the fixed path for the rest of the process.
    """
    global _work_fallback
    with _work_root_lock:
        if _work_fallback is not None:
            return _work_fallback
        shared = shared_temp_dir(WORK_ROOT_NAME)
        for attempt in range(_VANISH_RETRIES):
            try:
                return ensure_private_dir(shared)  # checked on every compile: cheap, current
            except FileNotFoundError:
                if attempt == _VANISH_RETRIES - 1:
                    raise
            except OSError as exc:
                _work_fallback = _unsafe_work_root(shared, exc)
                return _work_fallback
        raise AssertionError("unreachable")  # pragma: no cover


def _unsafe_work_root(shared: Path, exc: OSError) -> Path:
    """A fresh private work root instead of `shared`, which is not safe (one warning)."""
    import atexit
    import warnings

    fallback = Path(tempfile.mkdtemp(prefix=f"{WORK_ROOT_NAME}-"))
    atexit.register(shutil.rmtree, fallback, ignore_errors=True)
    why = exc.why if isinstance(exc, UnsafeDirectory) else (exc.strerror or str(exc))
    warnings.warn(
        f"nvcc work folder {shared} is not safe to use (it {why}); using {fallback} instead "
        "(cubins built there are not byte-reproducible); remove that folder",
        FlashgenWarning,
        stacklevel=4,
    )
    return fallback


def _lock_of(root: Path, entry: Path) -> Path:
    """The lock file that guards `entry` of the work root: itself for a lock file, else
    `<name>.lock` (a work folder's)."""
    return entry if entry.name.endswith(".lock") else root / f"{entry.name}.lock"


def clear_work_root() -> int:
    """Remove nvcc's shared work folder (its lock files and any folder a killed run left) when
    it is ours; return how many entries were removed. Used by `flashgen cache clear`.

    Another flashgen process may be compiling right now: a folder (or lock file) whose lock is
    held is in use and stays, so a `cache clear` never pulls a folder from under nvcc; a lock
    file is removed only while we hold it (a waiter then takes a new one: cache.locked).
    """
    root = shared_temp_dir(WORK_ROOT_NAME)
    try:
        st = os.lstat(root)
    except OSError:
        return 0
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():  # not ours: leave it alone
        return 0
    n = 0
    for entry in sorted(root.iterdir(), key=lambda e: e.name.endswith(".lock")):  # folders first
        if not entry.exists() and not entry.is_symlink():  # a lock removed with its folder
            continue
        lock = _lock_of(root, entry)
        fd = try_lock(lock)
        if fd is None:  # a compile holds it: in use, leave it
            continue
        try:
            n += 1
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            elif entry != lock:
                with contextlib.suppress(OSError):
                    entry.unlink()
            with contextlib.suppress(OSError):
                lock.unlink()  # under the lock: see cache.locked
        finally:
            os.close(fd)
    with contextlib.suppress(OSError):
        root.rmdir()  # only when empty: nothing in use was left
    return n


@contextlib.contextmanager
def _work_folder(digest: str) -> Iterator[tuple[Path, float]]:
    """A fresh folder `<work root>/<digest>` for one nvcc run, removed afterwards; yields it and
    the seconds spent waiting for its lock.

    Runs of the same content take turns on `<digest>.lock` (one lock per digest: a run never
    waits for a run of other content, however long that takes; the lock file is removed when
    the run ends, so they do not pile up); the folder is created with O_EXCL semantics (mkdir)
    inside the private root, so nothing planted can be in it.
    """
    root = nvcc_work_root()
    with locked(
        root / f"{digest}.lock",
        make_parent=nvcc_work_root,  # removed by a concurrent `cache clear`: made again
        waiting_for="another nvcc run of the same source",
        remove_when_done=True,  # one lock per content: leave none behind
    ) as waited:
        work = root / digest
        if work.is_symlink() or work.exists():  # left by a killed run of ours: start clean
            if work.is_symlink() or not work.is_dir():
                work.unlink()
            else:
                shutil.rmtree(work)
        os.mkdir(work, 0o700)
        try:
            yield work, waited
        finally:
            shutil.rmtree(work, ignore_errors=True)


# ---- stopping nvcc with flashgen ---------------------------------------------------------------
# nvcc runs in a session of its own (so a timeout can kill cicc and ptxas with it), which also
# means a signal to flashgen's process group does not reach it. Every running nvcc is recorded
# here, and while `stop_nvcc_on_signals` is active SIGINT, SIGTERM and SIGHUP kill them all
# before flashgen unwinds (work folders removed, locks released).
_live: set[subprocess.Popen[str]] = set()
_live_lock = threading.RLock()  # re-entered by a signal handler interrupting its holder
_stopping = threading.Event()  # set by the handler: no new nvcc starts until the guard ends
_guard_depth = 0
_saved_handlers: dict[int, Any] = {}
_STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)


def _kill_every_nvcc() -> None:
    with _live_lock:
        running = list(_live)
    for proc in running:
        _kill_group(proc)


def _on_stop_signal(signum: int, frame: object) -> None:
    """Kill every running nvcc, then end like the signal would, unwinding: Ctrl-C raises
    KeyboardInterrupt as Python's own handler does; SIGTERM / SIGHUP exit with 128 + signal."""
    _stopping.set()  # first: a worker thread about to start nvcc must not slip in after the kill
    _kill_every_nvcc()
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


def _is_default(signum: int, handler: Any) -> bool:
    """True when `handler` is what Python starts with for `signum`: only then do we take it
    over (a program's own handler, or SIG_IGN as under `nohup`, is left alone)."""
    if signum == signal.SIGINT:
        return handler is signal.default_int_handler
    return bool(handler == signal.SIG_DFL)


def _take_over_signals() -> None:
    for signum in _STOP_SIGNALS:
        current = signal.getsignal(signum)
        if _is_default(signum, current):
            _saved_handlers[signum] = current
            signal.signal(signum, _on_stop_signal)


def _give_back_signals() -> None:
    for signum, previous in _saved_handlers.items():
        if signal.getsignal(signum) is _on_stop_signal:  # not replaced since: ours to restore
            signal.signal(signum, previous)
    _saved_handlers.clear()
    _stopping.clear()  # a program that caught the interrupt and goes on may compile again


@contextlib.contextmanager
def stop_nvcc_on_signals() -> Iterator[None]:
    """While active, SIGINT / SIGTERM / SIGHUP kill every nvcc this process runs (in any
    thread) and unwind with KeyboardInterrupt / SystemExit(128 + signal), so no nvcc is left
    running and no work folder is left behind. Nests; outside the main thread (where Python
    cannot set handlers) it does nothing, and it leaves a signal alone whose handler is not
    Python's default."""
    global _guard_depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _guard_depth == 0:
        _take_over_signals()
    _guard_depth += 1
    try:
        yield
    finally:
        _guard_depth -= 1
        if _guard_depth == 0:
            _give_back_signals()


# ---- running nvcc ------------------------------------------------------------------------------
@dataclass(frozen=True)
class NvccRun:
    """One nvcc run: its output file's bytes, its log, the seconds it ran and the seconds
    spent waiting for a run of the same source in another process."""

    output: bytes
    log: str
    seconds: float
    waited: float


def work_digest(args: list[str] | tuple[str, ...], source: str, suffix: str, nvcc: Path) -> str:
    """The name of a run's work folder and lock: every part of the cache key (compile_key), so
    two runs share a folder, and wait for each other, only when they build the same entry."""
    parts = (nvcc_version(nvcc), PARSER_VERSION, flashgen_version())
    return cache_key(source, nvcc_flags_seen(args), suffix, *parts)[:32]


def run_nvcc(
    args: list[str], source: str, suffix: str = ".cu", *, what: str = "kernel"
) -> tuple[bytes, str]:
    """Compile `source` with nvcc and `args` (output to the file `-o` names); return (out, log).

    See run_nvcc_timed, which also says how long nvcc ran and how long it waited.
    """
    run = run_nvcc_timed(args, source, suffix, what=what)
    return run.output, run.log


def run_nvcc_timed(
    args: list[str], source: str, suffix: str = ".cu", *, what: str = "kernel"
) -> NvccRun:
    """Compile `source` with nvcc and `args` (output to the file `-o` names).

    nvcc runs in a fresh private folder named after the content (source, flags, nvcc), on a
    source file with a fixed mtime: with -lineinfo the cubin records the folder and the file's
    mtime, so a random folder or a fresh timestamp would make the same source give new bytes.
    The folder is removed afterwards. A run longer than FLASHGEN_NVCC_TIMEOUT seconds (default
    600) is killed, with everything it started, and reported as a CompileError. Ctrl-C, SIGTERM
    or SIGHUP kill it the same way (stop_nvcc_on_signals), and the interruption propagates.
    """
    nvcc = find_nvcc()
    timeout = nvcc_timeout()
    digest = work_digest(args, source, suffix, nvcc)
    with stop_nvcc_on_signals(), _work_folder(digest) as (work, waited):
        src = work / f"kernel{suffix}"
        out = work / "kernel.out"
        fd = os.open(src, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(source)
        # the line table also records the source file's mtime: pin it for identical bytes
        os.utime(src, (0, 0))
        cmd = [str(nvcc), *args, "-o", out.name, src.name]
        start = time.perf_counter()
        stdout, stderr, returncode = _run_in_own_session(cmd, work, timeout, what)
        seconds = time.perf_counter() - start
        log = stdout + stderr
        if returncode != 0 or not out.exists():
            raise CompileError(
                f"nvcc failed (exit {returncode}): {' '.join(cmd)}\n{_first_errors(log)}"
            )
        return NvccRun(out.read_bytes(), log, seconds, waited)


def _run_in_own_session(
    cmd: list[str], cwd: Path, timeout: float, what: str
) -> tuple[str, str, int]:
    """Run `cmd` in a session of its own (on a timeout or a signal, nvcc's children, cicc and
    ptxas, are killed too); (stdout, stderr, exit status)."""
    with _live_lock:  # the handler kills what is in _live, or we see _stopping: never neither
        if _stopping.is_set():
            raise CompileError(f"nvcc was not started for {what}: flashgen is being stopped")
        proc = subprocess.Popen(
            cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        _live.add(proc)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.communicate()
        raise CompileError(
            f"nvcc did not finish {what} within {timeout:g} s and was stopped; set "
            f"{TIMEOUT_ENV} to allow longer (seconds); command: {' '.join(cmd)}"
        ) from None
    except BaseException:  # Ctrl-C, SIGTERM, SIGHUP: do not leave nvcc running
        _kill_group(proc)
        proc.wait()
        raise
    finally:
        with _live_lock:
            _live.discard(proc)
    return stdout, stderr, proc.returncode


def compile_key(rendered: RenderedKernel, arch: str, flags: list[str], nvcc: Path) -> str:
    """The cache key of one compile: everything that changes the cubin or its report.

    The source (the template text as rendered for this spec), every flag nvcc sees (its command
    line and the environment it reads: NVCC_ENV_FLAGS, nvcc.profile's PTXAS_FLAGS and the
    like), the arch, nvcc's version, the ptxas report parser's version and flashgen's own (code
    digest) version.
    """
    return cache_key(
        rendered.source,
        nvcc_flags_seen(flags),
        arch,
        nvcc_version(nvcc),
        PARSER_VERSION,
        flashgen_version(),
    )


def compile_kernel(
    kernel: KernelSpec | RenderedKernel,
    arch: str | None = None,
    *,
    extra_flags: tuple[str, ...] = (),
    cache: CubinCache | None = None,
) -> CompiledKernel:
    """Compile to a cubin for `arch` (default: the local GPU's, else sm_90), via the cache.

    Raises ArchError (a ValueError) when the kernel cannot run on `arch`, CompileError when
    nvcc fails or times out, NvccNotFound without nvcc.
    """
    rendered = kernel if isinstance(kernel, RenderedKernel) else render(kernel)
    spec = rendered.spec
    arch = target_arch(spec, arch)
    info = check_target(spec.name, spec.family, spec.archs, spec.smem_bytes, arch)
    flags = cubin_flags(info.gencode, extra_flags)
    key = compile_key(rendered, arch, flags, find_nvcc())
    store = cache if cache is not None else CubinCache()
    with contextlib.ExitStack() as held:
        try:
            waited = held.enter_context(store.lock(key))
        except OSError as exc:  # no folder or lock file can be made there: build uncached
            _warn_uncached(store, exc)
            return _build(rendered, arch, flags, None, key, 0.0)
        hit = store.get(key)
        report = _cached_report(hit[1], rendered.name, arch) if hit is not None else None
        if hit is not None and report is not None:
            return CompiledKernel(spec, arch, hit[0], report, True, 0.0, waited)
        if hit is not None:  # a checksummed entry with a report we cannot read: rebuild it
            store.discard(key)
        return _build(rendered, arch, flags, store, key, waited)
    raise AssertionError("unreachable")  # pragma: no cover


def target_arch(spec: KernelSpec, arch: str | None = None) -> str:
    """The arch `compile_kernel` builds `spec` for: `arch` when given, else FLASHGEN_ARCH or
    the local GPU's (the `a` twin where the family ships one: wgmma on sm_90 takes sm_90a),
    else sm_90, or the family's first arch when it cannot run there. Not checked: an arch
    flashgen does not know comes back as it is, for `check_target` to refuse."""
    if arch is not None:
        return arch
    local = local_arch()
    arch = local or DEFAULT_ARCH
    if arch not in ARCHS:  # FLASHGEN_ARCH=garbage has no arch number
        return arch
    # an arch-specific family (wgmma: sm_90a) takes the `a` twin of the GPU's arch; with no
    # GPU to ask, a family that cannot run on the default arch gets its own first arch
    twin = [a for a in spec.archs if a.endswith("a") and arch_number(a) == arch_number(arch)]
    if twin:
        return twin[0]
    if local is None and not runs_on(spec.archs, arch):
        return spec.archs[0]
    return arch


def _build(
    rendered: RenderedKernel,
    arch: str,
    flags: list[str],
    store: CubinCache | None,
    key: str,
    waited: float,
) -> CompiledKernel:
    """Run nvcc and store the result in `store` (None: uncached). A cubin nvcc made is always
    returned: a cache that cannot take it (a full disk) costs a warning, not the build."""
    run = run_nvcc_timed(flags, rendered.source, what=f"{rendered.name} for {arch}")
    report = parse_ptxas(run.log, rendered.name, arch)
    if store is not None:
        meta = {"report": report.to_dict(), "name": rendered.name, "flags": flags}
        try:
            store.put(key, run.output, meta)
        except OSError as exc:
            _warn_uncached(store, exc)
    return CompiledKernel(
        rendered.spec, arch, run.output, report, False, run.seconds, waited + run.waited
    )


_REPORT_FIELDS = {f.name: f.type for f in fields(ResourceReport)}


def _cached_report(meta: dict[str, Any], name: str, arch: str) -> ResourceReport | None:
    """The report stored with an entry, or None when it is not exactly one for `name` on
    `arch` (any doubt means a rebuild, never a KeyError or a wrong number)."""
    rep = meta.get("report")
    if meta.get("name") != name or not isinstance(rep, dict) or set(rep) != set(_REPORT_FIELDS):
        return None
    if rep["arch"] != arch:
        return None
    counts = [v for k, v in rep.items() if k != "arch"]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts):
        return None
    return ResourceReport(**rep)


_warned_uncached: set[Path] = set()
_warned_lock = threading.Lock()


def _warn_uncached(store: CubinCache, exc: OSError) -> None:
    """One warning per cache folder and process: the cubin is used but not cached, and why."""
    with _warned_lock:
        if store.root in _warned_uncached:
            return
        _warned_uncached.add(store.root)
    where = exc.filename if exc.filename else store.root
    why = exc.strerror.lower() if exc.strerror else str(exc)
    warnings.warn(
        f"cannot write the cubin cache at {where} ({why}); compiled cubins are used without "
        f"being cached; free space there, or point FLASHGEN_CACHE_DIR at another folder",
        FlashgenWarning,
        stacklevel=4,
    )


def local_arch() -> str | None:
    """`sm_XY` of GPU 0 when PyCUDA and a GPU are present (or FLASHGEN_ARCH), else None."""
    env = os.environ.get("FLASHGEN_ARCH")
    if env:
        return env
    try:
        import pycuda.driver as drv

        drv.init()
        major, minor = drv.Device(0).compute_capability()
    except Exception:  # no PyCUDA, no driver or no device: fall back to the default arch
        return None
    return f"sm_{major}{minor}"
