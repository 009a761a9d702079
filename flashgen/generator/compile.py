"""Compile rendered kernels with nvcc (a subprocess: works on machines with no GPU), cached."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from flashgen._version import __version__
from flashgen.generator.arch import DEFAULT_ARCH, arch_number, check_target, runs_on
from flashgen.generator.cache import (
    CubinCache,
    FlashgenWarning,
    UnsafeDirectory,
    cache_key,
    ensure_private_dir,
    locked,
    shared_temp_dir,
)
from flashgen.generator.nvcc import TIMEOUT_ENV, find_nvcc, nvcc_timeout, nvcc_version
from flashgen.generator.render import RenderedKernel, render
from flashgen.generator.report import PARSER_VERSION, ResourceReport, parse_ptxas
from flashgen.generator.spec import KernelSpec

BASE_FLAGS: tuple[str, ...] = ("-std=c++17", "-O3", "-lineinfo", "-Xptxas=-v")

# nvcc reads these from the environment and adds them to every command line it runs
NVCC_ENV_FLAGS: tuple[str, ...] = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS")


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

    @property
    def name(self) -> str:
        """The kernel symbol inside the cubin."""
        return self.spec.name


def _first_errors(text: str, n: int = 12) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    errs = [ln for ln in lines if "error" in ln.lower()]
    return "\n".join((errs or lines)[:n])


def nvcc_flags_seen(args: list[str] | tuple[str, ...]) -> str:
    """Every flag nvcc will see: its command line plus NVCC_PREPEND_FLAGS / NVCC_APPEND_FLAGS."""
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
_work_root_lock = threading.Lock()
_work_fallback: Path | None = None  # set once the shared work root proved unsafe


def nvcc_work_root() -> Path:
    """The private parent of nvcc's work folders: `<temp>/flashgen-nvcc-<uid>` (0700, ours).

    A fixed path so that a cubin is reproducible (-lineinfo records the folder nvcc ran in).
    When that path is not safe (someone else's folder, a symlink), a fresh mkdtemp folder is used
    instead, with a one-line warning: still private, but cubins then record a random folder.
    """
    global _work_fallback
    with _work_root_lock:
        if _work_fallback is not None:
            return _work_fallback
        shared = shared_temp_dir("flashgen-nvcc")
        try:
            return ensure_private_dir(shared)  # checked on every compile: cheap, and current
        except OSError as exc:
            import atexit
            import warnings

            _work_fallback = Path(tempfile.mkdtemp(prefix="flashgen-nvcc-"))
            atexit.register(shutil.rmtree, _work_fallback, ignore_errors=True)
            why = exc.why if isinstance(exc, UnsafeDirectory) else (exc.strerror or str(exc))
            warnings.warn(
                f"nvcc work folder {shared} is not safe to use (it {why}); using "
                f"{_work_fallback} instead (cubins built there are not byte-reproducible); "
                "remove that folder",
                FlashgenWarning,
                stacklevel=3,
            )
            return _work_fallback


def clear_work_root() -> int:
    """Remove nvcc's shared work folder (its lock files and any folder a killed run left) when
    it is ours; return how many entries were removed. Used by `flashgen cache clear`.

    Another flashgen process may be compiling right now: a folder (or lock file) whose content
    lock is held is in use and stays, so a `cache clear` never pulls a folder from under nvcc.
    """
    import fcntl

    root = shared_temp_dir("flashgen-nvcc")
    try:
        st = os.lstat(root)
    except OSError:
        return 0
    if (
        not os.path.isdir(root) or os.path.islink(root) or st.st_uid != os.getuid()
    ):  # not ours: leave it alone
        return 0
    n = 0
    for entry in sorted(root.iterdir()):
        lock = entry if entry.name.startswith("lock-") else root / f"lock-{entry.name[:2]}"
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # a compile holds it: in use, leave it
                continue
            n += 1
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    entry.unlink()
        finally:
            os.close(fd)
    for entry in sorted(root.glob("lock-*")):  # locks recreated above for removed folders
        with contextlib.suppress(OSError):
            fd = os.open(entry, os.O_RDWR | os.O_NOFOLLOW)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                entry.unlink()
            finally:
                os.close(fd)
    with contextlib.suppress(OSError):
        root.rmdir()  # only when empty: nothing in use was left
    return n


@contextlib.contextmanager
def _work_folder(digest: str) -> Iterator[Path]:
    """A fresh folder `<work root>/<digest>` for one nvcc run, removed afterwards.

    Runs of the same content take turns (a lock per content, hashed into 256 lock files); the
    folder is created with O_EXCL semantics (mkdir) inside the private root, so nothing
    planted can be in it.
    """
    root = nvcc_work_root()
    if not root.is_dir():  # removed by a concurrent `cache clear` since it was checked
        root = nvcc_work_root()
    with locked(root / f"lock-{digest[:2]}"):  # digest is hex: at most 256 lock files
        work = root / digest
        if work.is_symlink() or work.exists():  # left by a killed run of ours: start clean
            if work.is_symlink() or not work.is_dir():
                work.unlink()
            else:
                shutil.rmtree(work)
        os.mkdir(work, 0o700)
        try:
            yield work
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_nvcc(
    args: list[str], source: str, suffix: str = ".cu", *, what: str = "kernel"
) -> tuple[bytes, str]:
    """Compile `source` with nvcc and `args` (output to the file `-o` names); return (out, log).

    nvcc runs in a fresh private folder named after the content (source and flags), on a
    source file with a fixed mtime: with -lineinfo the cubin records the folder and the file's
    mtime, so a random folder or a fresh timestamp would make the same source give new bytes.
    The folder is removed afterwards. A run longer than FLASHGEN_NVCC_TIMEOUT seconds (default
    600) is killed, with everything it started, and reported as a CompileError.
    """
    nvcc = find_nvcc()
    timeout = nvcc_timeout()
    digest = cache_key(source, nvcc_flags_seen(args), suffix)[:20]
    with _work_folder(digest) as work:
        src = work / f"kernel{suffix}"
        out = work / "kernel.out"
        fd = os.open(src, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(source)
        # the line table also records the source file's mtime: pin it for identical bytes
        os.utime(src, (0, 0))
        cmd = [str(nvcc), *args, "-o", out.name, src.name]
        # a session of its own: on a timeout, nvcc's children (cicc, ptxas) are killed too
        proc = subprocess.Popen(
            cmd,
            cwd=work,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            raise CompileError(
                f"nvcc did not finish {what} within {timeout:g} s and was stopped; set "
                f"{TIMEOUT_ENV} to allow longer (seconds); command: {' '.join(cmd)}"
            ) from None
        except BaseException:  # Ctrl-C: do not leave nvcc running
            _kill_group(proc)
            proc.wait()
            raise
        log = stdout + stderr
        if proc.returncode != 0 or not out.exists():
            raise CompileError(
                f"nvcc failed (exit {proc.returncode}): {' '.join(cmd)}\n{_first_errors(log)}"
            )
        return out.read_bytes(), log


def compile_key(rendered: RenderedKernel, arch: str, flags: list[str], nvcc: Path) -> str:
    """The cache key of one compile: everything that changes the cubin or its report.

    The source (the template text as rendered for this spec), every flag nvcc sees (its command
    line and NVCC_PREPEND_FLAGS / NVCC_APPEND_FLAGS), the arch, nvcc's version, the ptxas report
    parser's version and flashgen's own (code digest) version.
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
    if arch is None:
        local = local_arch()
        arch = local or DEFAULT_ARCH
        # an arch-specific family (wgmma: sm_90a) takes the `a` twin of the GPU's arch; with no
        # GPU to ask, a family that cannot run on the default arch gets its own first arch
        twin = [a for a in spec.archs if a.endswith("a") and arch_number(a) == arch_number(arch)]
        if twin:
            arch = twin[0]
        elif local is None and not runs_on(spec.archs, arch):
            arch = spec.archs[0]
    info = check_target(spec.name, spec.family, spec.archs, spec.smem_bytes, arch)
    flags = cubin_flags(info.gencode, extra_flags)
    nvcc = find_nvcc()
    key = compile_key(rendered, arch, flags, nvcc)
    store = cache if cache is not None else CubinCache()
    with store.lock(key):
        hit = store.get(key)
        if hit is not None:
            data, meta = hit
            return CompiledKernel(spec, arch, data, ResourceReport(**meta["report"]), True)
        data, log = run_nvcc(flags, rendered.source, what=f"{rendered.name} for {arch}")
        report = parse_ptxas(log, rendered.name, arch)
        store.put(key, data, {"report": report.to_dict(), "name": rendered.name, "flags": flags})
    return CompiledKernel(spec, arch, data, report, False)


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
