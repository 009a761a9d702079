"""One launch path for every host: a cached launch plan per (variant, device), `cuLaunchKernel`
through ctypes on libcuda.

NumPy arrays (copied), PyCUDA GPUArrays and torch tensors all reach the GPU here:

- `LaunchPlan` (`plan(spec, cubin, arch, device)`, cached per (variant, arch, device)): the
  module loaded with `cuModuleLoadData` into the device's *primary* context (the context PyCUDA's
  runtime and torch both use; it is pushed for the load and popped again, so the caller's current
  context is left as it was), the `CUfunction`, the block, the dynamic shared memory (the
  per-function limit is raised once, when it exceeds 48 KiB).
- `Bound` (`LaunchPlan.bind(problem, scale_log2)`): one problem signature (sizes, strides,
  scale) bound to a plan: the grid and a `kernelParams` array whose entries point at ctypes
  objects holding each argument. A call writes the five data pointers and calls
  `cuLaunchKernel(f, grid, block, smem, stream, kernelParams, NULL)` on the given stream handle:
  no validation, no allocation, no synchronization. Hosts keep a `Bound` per signature, so a
  repeated call costs a dict lookup, five pointer stores and one driver call.
- `PreparedLaunch` (`LaunchPlan.prepare`, issued by `LaunchPlan.run`): a launch whose
  CUlaunchConfig (grid, block, shared memory, the programmatic-dependent attribute) is built
  once, for hosts that fill their own `kernelParams` (the decode kernel and its merge kernel,
  a sibling in the same module: `LaunchPlan.sibling`); `run` issues several in one context push.

The kernel arguments are the C ABI of templates/_common.cuh.j2: q, k, v, o, lse pointers; int
tq, tk; twelve long long strides (q, k, v, o x batch, head, token); float scale_log2; int
kv_group (query heads per K/V head); the feature values: int window_left, window_right, float
softcap, const float* alibi_slopes (`features.FeatureArgs.kernel_args`); and a variant compiled
with a user hook (`scoremod<digest>` / `maskmod<digest>`) then takes the hooks' aux block
(`features.hook.HOOK_PARAMS`: four pointers, four row strides, four float and four int scalars,
from a `features.hook.HookArgs`).

**Leading by-value arguments (family prefix args).** A family whose kernels take extra by-value
parameters *before* the common ABI (the Hopper `wgmma` family: three 128-byte `CUtensorMap`s as
`const __grid_constant__ CUtensorMap`, which PyCUDA's packed-buffer `prepared_call` cannot pass)
registers a builder (`uses`: the pointers its arguments depend on)::

    from flashgen.runtime import launch

    def wgmma_prefix(spec: KernelSpec, problem: Problem) -> list[Any]:
        return [encode_q_map(spec, problem), ..., ctypes.c_int(problem.h), ...]

    launch.register_prefix_args("wgmma", wgmma_prefix, uses=("q", "k", "v"))

A builder returns ctypes objects of any size (a `c_ubyte * 128` or a 64-byte-aligned
Structure); each becomes one `kernelParams` entry, in order, ahead of q. It receives the problem
*with* its pointers (q_ptr ... lse_ptr) and is called again only when a pointer it `uses`
changes: a `Bound` remembers them and reuses the blobs while they repeat (a loop over one set
of inputs, fresh outputs each call; a CUDA-graph capture). `PREFIX_PROVIDERS` maps a family to
the module that registers its builder, imported on the family's first plan
(`"wgmma": "flashgen.runtime.tma"` is there); a family listed there whose module registers
no builder is refused at plan time rather than launched with missing arguments.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from flashgen.generator import abi
from flashgen.generator.arch import STATIC_SMEM_LIMIT
from flashgen.generator.families import FAMILIES, family_of
from flashgen.generator.features import NO_FEATURES, FeatureArgs, check_fits
from flashgen.generator.features.hook import HOOK_PARAMS, HookArgs, hook_tokens, hooks_of
from flashgen.generator.schedulers import VarlenPersistent
from flashgen.generator.spec import KernelSpec
from flashgen.runtime.prefix import PrefixRegistry
from flashgen.runtime.validate import Problem

# CUDA driver enum values (cuda.h)
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_EVENT_DISABLE_TIMING = 0x2
# The CUstream handles of the default streams, which the CUDA array interface (v3) uses too
CU_STREAM_LEGACY = 0x1
CU_STREAM_PER_THREAD = 0x2
SM_LIMIT_ENV = "FLASHGEN_SM_LIMIT"  # at most this many SMs for grids that size by them
# Number of common ABI arguments: 5 pointers, tq, tk, 12 strides, scale_log2, kv_group, and
# the four feature values (window left/right, softcap, ALiBi slopes pointer).
N_COMMON_ARGS = len(abi.FWD)

INSTALL_HINT = (
    "install PyCUDA (pip install 'flashgen[gpu]') on a machine with an NVIDIA driver and GPU"
)


# Validated signatures a host keeps (flashgen.attention's device path, flashgen.torch's forward
# and backward); past this the dict starts over (a decode loop whose Tk grows every step would
# otherwise keep one entry per step, forever).
MAX_SIGNATURES = 4096
_signatures_lock = threading.Lock()


def remember(cache: dict[Any, Any], key: Any, value: Any) -> None:
    """Keep a validated call signature in a front door's `cache` (its later calls skip
    validation); past MAX_SIGNATURES entries the cache starts over. The one bounded store of
    flashgen.attention's device path and flashgen.torch's forward and backward."""
    with _signatures_lock:
        if len(cache) >= MAX_SIGNATURES:
            cache.clear()
        cache[key] = value


class GpuUnavailable(RuntimeError):
    """PyCUDA, the CUDA driver or a GPU is missing; the message says which and what to do."""


PrefixArgs = Callable[[KernelSpec, Problem], Sequence[Any]]
POINTERS = abi.pointers(abi.FWD)  # q, k, v, o, lse
# family -> module whose import registers that family's prefix builder
PREFIX_PROVIDERS: dict[str, str] = {
    f.name: f.host_provider for f in FAMILIES.values() if f.host_provider
}
_prefixes: PrefixRegistry[PrefixArgs] = PrefixRegistry(POINTERS, PREFIX_PROVIDERS, "kernels")


def register_prefix_args(family: str, builder: PrefixArgs, uses: Sequence[str] = POINTERS) -> None:
    """Make `builder(spec, problem)` supply `family`'s leading by-value kernel arguments.

    `uses` names the pointers the arguments depend on (of q, k, v, o, lse): the builder is
    called again only when one of those changes (tensor maps of q, k and v need not be
    re-encoded for every fresh output buffer).
    """
    _prefixes.register(family, builder, uses)


def prefix_builder(family: str) -> tuple[PrefixArgs, tuple[int, ...]] | None:
    """(the family's prefix builder, indices of the pointers it uses), or None."""
    return _prefixes.get(family)


CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: an id (padded to 8 bytes) and a 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


# the one attribute of a programmatic dependent launch, built once (launches only point at it)
_DEPENDENT = LaunchAttribute(id=CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
_DEPENDENT.value[0] = 1


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig (cuLaunchKernelEx's first argument)."""

    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("smem", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(LaunchAttribute)),
        ("n_attrs", ctypes.c_uint),
    ]


class Driver:
    """The few CUDA driver entry points flashgen calls, through ctypes on libcuda."""

    def __init__(self, lib: Any) -> None:
        c = ctypes
        vp, u, i = c.c_void_p, c.c_uint, c.c_int
        self.lib = lib
        sigs: dict[str, list[Any]] = {
            "cuInit": [u],
            "cuDeviceGet": [c.POINTER(i), i],
            "cuDeviceGetAttribute": [c.POINTER(i), i, i],
            "cuDevicePrimaryCtxRetain": [c.POINTER(vp), i],
            "cuCtxPushCurrent_v2": [vp],
            "cuCtxPopCurrent_v2": [c.POINTER(vp)],
            "cuCtxGetCurrent": [c.POINTER(vp)],
            "cuModuleLoadData": [c.POINTER(vp), c.c_char_p],
            "cuModuleGetFunction": [c.POINTER(vp), vp, c.c_char_p],
            "cuFuncSetAttribute": [vp, i, i],
            "cuGetErrorName": [i, c.POINTER(c.c_char_p)],
            "cuGetErrorString": [i, c.POINTER(c.c_char_p)],
            "cuLaunchKernel": [vp, u, u, u, u, u, u, u, vp, c.POINTER(vp), c.POINTER(vp)],
            "cuEventCreate": [c.POINTER(vp), u],
            "cuEventRecord": [vp, vp],
            "cuStreamWaitEvent": [vp, vp, u],
            "cuEventDestroy_v2": [vp],
            "cuOccupancyMaxActiveBlocksPerMultiprocessor": [c.POINTER(i), vp, i, c.c_size_t],
        }
        for name, argtypes in sigs.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = c.c_int
        self.cuLaunchKernel = lib.cuLaunchKernel
        # CUDA 12.0 and newer (programmatic dependent launches); None on older drivers
        self.cuLaunchKernelEx = getattr(lib, "cuLaunchKernelEx", None)
        if self.cuLaunchKernelEx is not None:
            ex_args = [c.POINTER(LaunchConfig), vp, c.POINTER(vp), c.POINTER(vp)]
            self.cuLaunchKernelEx.argtypes = ex_args
            self.cuLaunchKernelEx.restype = c.c_int
        self.cuCtxGetCurrent = lib.cuCtxGetCurrent
        self.cuCtxPushCurrent = lib.cuCtxPushCurrent_v2
        self.cuCtxPopCurrent = lib.cuCtxPopCurrent_v2
        self._contexts: dict[int, int] = {}
        self._sms: dict[int, int] = {}

    def resident_blocks(self, function: int, threads: int, smem: int) -> int:
        """Blocks of `function` (threads each, `smem` dynamic shared memory) one SM holds at
        once (at least 1)."""
        n = ctypes.c_int()
        occupancy = self.lib.cuOccupancyMaxActiveBlocksPerMultiprocessor
        rc = occupancy(ctypes.byref(n), function, threads, smem)
        self.check(rc, "asking the occupancy")
        return max(1, n.value)

    def error(self, rc: int) -> str:
        """`CUDA_ERROR_NAME: description` for a CUresult."""
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        self.lib.cuGetErrorName(rc, ctypes.byref(name))
        self.lib.cuGetErrorString(rc, ctypes.byref(text))
        n = (name.value or b"CUDA error %d" % rc).decode()
        return f"{n}: {(text.value or b'').decode()}".rstrip(": ")

    def check(self, rc: int, what: str) -> None:
        """Raise RuntimeError naming `what` when `rc` is not CUDA_SUCCESS."""
        if rc:
            raise RuntimeError(f"{what}: {self.error(rc)}")

    def stream_wait(self, producer: int, consumer: int) -> None:
        """Make stream `consumer` wait (on the GPU, the host does not) for the work queued on
        stream `producer` so far: an event recorded there, waited for here, then released
        (the driver keeps it until it completes). Needs a current context."""
        lib, event = self.lib, ctypes.c_void_p()
        self.check(
            lib.cuEventCreate(ctypes.byref(event), CU_EVENT_DISABLE_TIMING),
            "creating an event to wait for the inputs' stream",
        )
        try:
            self.check(
                lib.cuEventRecord(event, producer),
                f"recording an event on the inputs' stream {producer:#x}",
            )
            self.check(
                lib.cuStreamWaitEvent(consumer, event, 0),
                f"making stream {consumer:#x} wait for the inputs' stream {producer:#x}",
            )
        finally:
            lib.cuEventDestroy_v2(event)

    def primary_context(self, device: int) -> int:
        """The primary context of `device` (retained once per process, never released)."""
        ctx = self._contexts.get(device)
        if ctx is None:
            self.check(self.lib.cuInit(0), "cuInit")
            dev, handle = ctypes.c_int(), ctypes.c_void_p()
            self.check(self.lib.cuDeviceGet(ctypes.byref(dev), device), f"device {device}")
            self.check(
                self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(handle), dev),
                f"device {device}: retaining its primary context",
            )
            ctx = self._contexts[device] = int(handle.value or 0)
        return ctx

    def sm_count(self, device: int) -> int:
        """Streaming multiprocessors of `device` (persistent grids size themselves by it)."""
        n = self._sms.get(device)
        if n is None:
            self.primary_context(device)  # cuInit
            out = ctypes.c_int()
            self.check(
                self.lib.cuDeviceGetAttribute(
                    ctypes.byref(out), CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device
                ),
                "reading the SM count",
            )
            n = self._sms[device] = int(out.value)
        # tests play a smaller GPU so small problems take the persistent grid's paths too
        limit = os.environ.get(SM_LIMIT_ENV, "")
        return min(n, int(limit)) if limit.isdigit() and int(limit) > 0 else n

    def _find(self, module: Any, name: str) -> ctypes.c_void_p:
        """cuModuleGetFunction of `name` in `module` (its context current)."""
        func = ctypes.c_void_p()
        self.check(
            self.lib.cuModuleGetFunction(ctypes.byref(func), module, name.encode()),
            f"finding {name} in the cubin",
        )
        return func

    def function(self, context: int, module: int, name: str) -> int:
        """The CUfunction `name` of a loaded `module` (looked up in `context`, pushed for it)."""
        lib = self.lib
        self.check(lib.cuCtxPushCurrent_v2(context), "making the module's context current")
        try:
            func = self._find(module, name)
        finally:
            lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
        return int(func.value or 0)

    def load(self, device: int, cubin: bytes, name: str, smem: int) -> tuple[int, int]:
        """(CUmodule, CUfunction) of kernel `name` from `cubin`, in `device`'s primary context."""
        lib = self.lib
        ctx = self.primary_context(device)
        self.check(lib.cuCtxPushCurrent_v2(ctx), f"device {device}: making its context current")
        try:
            module = ctypes.c_void_p()
            self.check(lib.cuModuleLoadData(ctypes.byref(module), cubin), "loading the cubin")
            func = self._find(module, name)
            if smem > STATIC_SMEM_LIMIT:
                optin = ctypes.c_int()
                self.check(
                    lib.cuDeviceGetAttribute(
                        ctypes.byref(optin), CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                        device,
                    ),
                    "reading the shared-memory limit",
                )  # fmt: skip
                if smem > optin.value:
                    raise RuntimeError(
                        f"needs {smem} B of shared memory, this GPU allows {optin.value} B per "
                        "block; pick a variant with smaller tiles"
                    )
                self.check(
                    lib.cuFuncSetAttribute(func, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                           smem),
                    "raising the dynamic shared-memory limit",
                )  # fmt: skip
        finally:
            lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
        return int(module.value or 0), int(func.value or 0)


_driver: Driver | None = None
_lock = threading.RLock()


def driver() -> Driver:
    """The process's `Driver` (libcuda loaded on first use); GpuUnavailable without a driver."""
    global _driver
    if _driver is None:
        with _lock:
            if _driver is None:
                try:
                    lib = ctypes.CDLL("libcuda.so.1")
                except OSError as exc:
                    raise GpuUnavailable(
                        f"the CUDA driver library is missing ({exc}); {INSTALL_HINT}"
                    ) from exc
                _driver = Driver(lib)
    return _driver


def wait_for_streams(producers: Sequence[int | None], stream: int) -> None:
    """Order a launch on CUstream `stream` (0: the legacy default) after the work its inputs'
    producers queued: for each distinct producer stream (the `stream` of a CUDA array
    interface v3: None, nothing to wait for; 1 the legacy default stream; 2 the per-thread
    default stream; else a CUstream) other than `stream` itself, `stream` waits on an event
    recorded there. Without it a CuPy array filled on a non-blocking stream could be read
    before it is written. Issues nothing when every producer is None or `stream`."""
    same = {stream, CU_STREAM_LEGACY} if stream in (0, CU_STREAM_LEGACY) else {stream}
    waits = [p for p in dict.fromkeys(producers) if p is not None and p not in same]
    if waits:
        drv = driver()
        for producer in waits:
            drv.stream_wait(producer, stream)


def launch_in_context(
    context: int, function: int, grid: tuple[int, int, int], threads: int, smem: int,
    stream: int, params: Any,
) -> int:  # fmt: skip
    """`cuLaunchKernel` of `function` (a 1-D block of `threads`) in `context`, pushed for the
    launch when another is current; the driver's return code (0: launched). (Launches made
    call after call are prepared once instead: `LaunchPlan.prepare`/`run`.)"""
    drv = driver()
    cur = ctypes.c_void_p()
    drv.cuCtxGetCurrent(ctypes.byref(cur))
    pushed = cur.value != context
    if pushed:
        drv.check(drv.cuCtxPushCurrent(context), "making the kernel's context current")
    try:
        gx, gy, gz = grid
        return int(
            drv.cuLaunchKernel(function, gx, gy, gz, threads, 1, 1, smem, stream, params, None)
        )
    finally:
        if pushed:
            drv.cuCtxPopCurrent(ctypes.byref(cur))


@dataclass(eq=False)
class PreparedLaunch:
    """One kernel launch built once and issued call after call (`LaunchPlan.prepare`/`run`):
    its CUlaunchConfig (grid, block, shared memory, the programmatic-dependent attribute or
    none) with only the stream set per call, and the kernelParams array the caller fills in
    place -- a launch's ctypes structures cost microseconds to build, a call's whole budget
    for a short decode."""

    name: str  # the kernel's, for errors
    function: int  # CUfunction
    config: LaunchConfig
    params: Any  # kernelParams: addresses of the argument slots
    attrs: Any = None  # keeps the attribute pointer `config` holds alive

    def issue(self, drv: Driver, stream: int) -> int:
        """cuLaunchKernelEx on `stream` in the current context (cuLaunchKernel when the driver
        lacks it: a plain stream-ordered launch, where griddepcontrol.wait returns at once);
        the driver's return code."""
        cfg = self.config
        if drv.cuLaunchKernelEx is None:
            gx, gy, gz = cfg.grid
            return int(drv.cuLaunchKernel(
                self.function, gx, gy, gz, cfg.block[0], 1, 1, cfg.smem, stream, self.params, None
            ))  # fmt: skip
        cfg.stream = stream
        return int(drv.cuLaunchKernelEx(ctypes.byref(cfg), self.function, self.params, None))


@dataclass(eq=False)
class LaunchPlan:
    """A loaded kernel ready to launch on one device: function, block, shared memory."""

    spec: KernelSpec
    arch: str
    device: int
    context: int  # the device's primary CUcontext: the module's, and current at each launch
    module: int  # CUmodule, kept loaded for the life of the process
    function: int  # CUfunction
    block: tuple[int, int, int]
    smem: int
    prefix: PrefixArgs | None = None
    prefix_uses: tuple[int, ...] = tuple(range(len(POINTERS)))  # the pointers prefix reads

    sms: int = 0  # the device's SM count (persistent families size their grid by it)
    # other kernels of the module, by name (sibling()): looked up once each
    siblings: dict[str, int] = dataclasses.field(default_factory=dict, repr=False)

    def sibling(self, name: str) -> int:
        """The CUfunction of another kernel in this plan's module (the same rendered source:
        the decode variant's split merge, `<name>_combine`), looked up on first use."""
        func = self.siblings.get(name)
        if func is None:
            with _lock:
                func = self.siblings.get(name)
                if func is None:
                    try:
                        func = driver().function(self.context, self.module, name)
                    except RuntimeError as exc:
                        raise RuntimeError(f"kernel {self.spec.name} ({self.arch}): {exc}") from exc
                    self.siblings[name] = func
        return func

    def prepare(
        self, grid: tuple[int, int, int], params: Any, dependent: bool = False,
        sibling: str | None = None, threads: int = 0,
    ) -> PreparedLaunch:  # fmt: skip
        """A launch of this plan's kernel (or of the module's kernel `sibling`, a 1-D block of
        `threads` and static shared memory only) with its CUlaunchConfig built now, for
        `run` to issue call after call (its `params` array filled in place)."""
        if sibling is None:
            name, func, threads, smem = self.spec.name, self.function, self.block[0], self.smem
        else:
            name, func, smem = sibling, self.sibling(sibling), 0
        attrs = ctypes.pointer(_DEPENDENT) if dependent else None
        config = LaunchConfig(grid, (threads, 1, 1), smem, None, attrs, 1 if dependent else 0)
        return PreparedLaunch(name, func, config, params, attrs)

    def run(self, launches: Sequence[PreparedLaunch], stream: int) -> None:
        """Issue `launches` in order on `stream` in the plan's context (pushed once, when
        another is current); RuntimeError naming the kernel the driver refuses (the ones
        after it are not issued)."""
        drv = driver()
        cur = ctypes.c_void_p()
        drv.cuCtxGetCurrent(ctypes.byref(cur))
        pushed = cur.value != self.context
        if pushed:
            drv.check(drv.cuCtxPushCurrent(self.context), "making the kernel's context current")
        try:
            for launch in launches:
                rc = launch.issue(drv, stream)
                if rc:
                    cfg = launch.config
                    raise RuntimeError(
                        f"kernel {launch.name} failed (grid {tuple(cfg.grid)}, block "
                        f"{cfg.block[0]}, {cfg.smem} B shared memory): {drv.error(rc)}"
                    )
        finally:
            if pushed:
                drv.cuCtxPopCurrent(ctypes.byref(cur))

    def grid(
        self, problem: Problem, window: tuple[int, int] = (-1, -1), varlen: Varlen | None = None
    ) -> tuple[int, int, int]:
        """The launch grid for `problem` (the family's tile scheduler's: a block per query tile,
        or persistent) with the kernel's window sides; a varlen variant's from `varlen`."""
        scheduler = family_of(self.spec.family).scheduler(self.spec)
        if isinstance(scheduler, VarlenPersistent):
            assert varlen is not None  # bind() checks it
            return scheduler.varlen_grid(
                self.spec, varlen.n_seqs, problem.h, problem.tq, varlen.max_q, varlen.max_k,
                self.sms, window,
            )  # fmt: skip
        return scheduler.grid(
            self.spec, problem.b, problem.h, problem.tq, problem.tk, self.sms, window,
            problem.kv_group,
        )

    def bind(
        self,
        problem: Problem,
        scale_log2: float,
        features: FeatureArgs = NO_FEATURES,
        hooks: HookArgs | None = None,
        varlen: Varlen | None = None,
    ) -> Bound:
        """The launch of this plan on `problem`'s signature (its pointers are ignored) with
        the call's feature values and, for a hooked variant, its hooks' aux values (`hooks`;
        None for hooks without aux), and for a varlen variant the batch's sizes (`varlen`;
        `problem` is then the packed tensors as one batch); ValueError when the variant lacks
        a feature the call uses, or when hook values and the variant's hooks disagree, or
        `varlen` and the variant do."""
        check_fits(self.spec, features)
        if ("varlen" in self.spec.features) != (varlen is not None):
            raise ValueError(
                f"spec {self.spec.name}: "
                + ("a varlen variant needs the call's sequences (varlen=Varlen(...))"
                   if varlen is None else "sequences given, but the variant is not varlen")
                + "; launch packed sequences with a varlen variant and dense batches without"
            )  # fmt: skip
        if varlen is not None and problem.b != 1:
            raise ValueError(
                f"b={problem.b}: a varlen call sees its packed tensors as one batch; pass "
                "(1, H, total, d) views"
            )
        hooks = check_hook_args(self.spec, hooks)
        features.check()  # each value by its feature's rule (ALiBi: an aligned pointer)
        if "gqapack" in self.spec.features and problem.tq * problem.kv_group >= 2**31:
            raise ValueError(
                f"tq={problem.tq} x kv_group={problem.kv_group}: a gqapack variant packs them "
                "into one row index below 2^31; use the variant without gqapack"
            )
        return Bound(self, problem, scale_log2, features, hooks, varlen)


def check_hook_args(spec: KernelSpec, hooks: HookArgs | None) -> HookArgs | None:
    """The call's hook values checked against the variant's hooks (by identity): None for an
    unhooked variant; for a hooked one, `hooks` (or, when None, empty values: valid only for
    hooks without aux). ValueError otherwise."""
    tokens = hook_tokens(spec.features)
    if not tokens:
        if hooks is not None:
            raise ValueError(
                f"spec {spec.name}: hook aux values given, but the variant has no hook; "
                "compile the hook in (features=(token_of(hook), ...)) or drop the values"
            )
        return None
    want = hooks_of(spec.features)
    if hooks is None:
        return HookArgs(want, {})  # raises, naming the aux values the hooks need
    if hooks.hooks != want:
        raise ValueError(
            f"spec {spec.name}: the hook values are for "
            f"{', '.join(h.digest for h in hooks.hooks) or 'no hook'}, the variant compiles "
            f"{', '.join(t for t in tokens)}; build HookArgs from the variant's hooks"
        )
    return hooks


_plans: dict[tuple[KernelSpec, str, int], LaunchPlan] = {}


def plan(
    spec: KernelSpec, cubin: bytes | Callable[[], bytes], arch: str, device: int
) -> LaunchPlan:
    """The cached plan for (spec, arch, device); `cubin` (or a function returning it) on a miss.

    Loading failures raise RuntimeError naming the kernel and arch.
    """
    key = (spec, arch, device)
    hit = _plans.get(key)
    if hit is not None:
        return hit
    with _lock:
        hit = _plans.get(key)
        if hit is not None:
            return hit
        # a backward variant's leading arguments are backward.py's (its Prepared builds them)
        found = prefix_builder(spec.family) if spec.direction == "fwd" else None
        binary = cubin() if callable(cubin) else cubin
        drv = driver()
        try:
            module, func = drv.load(device, binary, spec.name, spec.smem_bytes)
        except RuntimeError as exc:
            raise RuntimeError(f"kernel {spec.name} ({arch}): loading failed: {exc}") from exc
        prefix, uses = found if found is not None else (None, tuple(range(len(POINTERS))))
        made = LaunchPlan(
            spec, arch, device, drv.primary_context(device), module, func,
            (spec.threads, 1, 1), spec.smem_bytes, prefix, uses, drv.sm_count(device),
        )  # fmt: skip
        _plans[key] = made
        return made


def cached_plan(spec: KernelSpec, arch: str, device: int) -> LaunchPlan | None:
    """The plan already loaded for (spec, arch, device), if any."""
    return _plans.get((spec, arch, device))


def clear() -> None:
    """Forget every plan (modules stay loaded; for tests and process teardown)."""
    with _lock:
        _plans.clear()


@dataclass(frozen=True)
class Varlen:
    """A varlen call's host-side sizes (abi.VARLEN): the sequences, and the longest query and
    key sequence (they size the grid; the lengths themselves stay on the device)."""

    n_seqs: int
    max_q: int
    max_k: int


def set_pointers(slots: Sequence[ctypes.c_void_p], values: Sequence[int], name: str) -> None:
    """Write a hooked launch's aux pointer slots (`HookArgs.pointers()` order). ValueError,
    before anything is written, when the count differs or a pointer is not 4-byte aligned
    where the bound one was set (a call with other aux tensors than its signature's)."""
    if len(values) != len(slots) or any(
        (v == 0) != (not s.value) or v % 4 for s, v in zip(slots, values, strict=True)
    ):
        raise ValueError(
            f"kernel {name}: hook_ptrs={tuple(values)}: {len(slots)} aux pointers, nonzero and "
            "4-byte aligned exactly where the bound ones are; pass HookArgs(...).pointers() of "
            "this call's aux values"
        )
    for s, v in zip(slots, values, strict=True):
        s.value = v or None


class Bound:
    """One plan bound to one problem signature: grid and kernelParams ready, pointers per call.

    A call launches in the plan's context: when another context is current on the calling
    thread (a fresh thread, or torch working on another device), the plan's is pushed for the
    launch and popped after it, so the caller's current context is unchanged.
    Thread-safe: the five pointer slots are shared, so writing them and launching is one locked
    step (cuLaunchKernel copies the arguments before it returns).
    """

    __slots__ = (
        "_args", "_common", "_cu", "_cur", "_cur_ref", "_drv", "_hook_ptrs", "_last_key", "_launch",
        "_lock",
        "_prefix_keep", "_ptrs", "block", "context", "function", "grid", "params", "plan",
        "problem", "smem",
    )  # fmt: skip

    def __init__(
        self,
        plan: LaunchPlan,
        problem: Problem,
        scale_log2: float,
        features: FeatureArgs = NO_FEATURES,
        hooks: HookArgs | None = None,
        varlen: Varlen | None = None,
    ) -> None:
        c = ctypes
        self.plan = plan
        self.problem = problem
        self.function = plan.function
        left, right, cap, slopes = features.kernel_args(problem.tq, problem.tk)
        self.grid = plan.grid(problem, (left, right), varlen)
        self.block = plan.block
        self.smem = plan.smem
        self._drv = driver()
        self._launch = self._drv.cuLaunchKernel
        self.context = plan.context
        self._cur = c.c_void_p()
        self._cur_ref = c.byref(self._cur)
        self._ptrs = (c.c_void_p * 5)()
        scalars: list[Any] = [c.c_int(problem.tq), c.c_int(problem.tk)]
        scalars += [c.c_longlong(s) for s in problem.kernel_strides()]
        scalars.append(c.c_float(scale_log2))
        scalars.append(c.c_int(problem.kv_group))
        scalars += [c.c_int(left), c.c_int(right), c.c_float(cap), c.c_void_p(slopes)]
        # a varlen variant: cu_seqlens_q, cu_seqlens_k (set per call), n_seqs, and the dynamic
        # scheduler's two counter words (set per call) (abi.VARLEN_FWD)
        self._cu: tuple[ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p] | None = None
        if varlen is not None:
            self._cu = (c.c_void_p(0), c.c_void_p(0), c.c_void_p(0))
            scalars += [self._cu[0], self._cu[1], c.c_int(varlen.n_seqs), self._cu[2]]
        # a hooked variant: the aux block after the features; its pointer slots may be set per
        # call (`hook_ptrs`), the rest is bound
        self._hook_ptrs: list[ctypes.c_void_p] = []
        if hooks is not None:
            for p, v in zip(HOOK_PARAMS, hooks.kernel_args(), strict=True):
                if p.code == "f":
                    scalars.append(c.c_float(float(v)))
                elif p.code == "P":
                    self._hook_ptrs.append(c.c_void_p(int(v)))
                    scalars.append(self._hook_ptrs[-1])
                else:
                    scalars.append(c.c_int(int(v)))
        self._args = scalars  # keeps them alive: params holds their addresses
        base = c.addressof(self._ptrs)
        width = c.sizeof(c.c_void_p)
        self._common = [base + width * i for i in range(5)] + [c.addressof(a) for a in scalars]
        self.params = (c.c_void_p * len(self._common))(*self._common)
        self._lock = threading.Lock()
        self._last_key: tuple[int, ...] | None = None
        self._prefix_keep: Sequence[Any] = ()

    def scalar_args(self) -> tuple[int | float, ...]:
        """tq, tk, the twelve strides, scale_log2, kv_group and the feature values as bound."""
        return tuple(a.value for a in self._args)

    def _set_prefix(self, ptrs: tuple[int, int, int, int, int], key: tuple[int, ...]) -> None:
        builder = self.plan.prefix
        assert builder is not None
        q, k, v, o, lse = ptrs
        problem = dataclasses.replace(self.problem, q_ptr=q, k_ptr=k, v_ptr=v, o_ptr=o, lse_ptr=lse)
        blobs = list(builder(self.plan.spec, problem))
        addrs = [ctypes.addressof(b) for b in blobs]
        if len(self.params) == len(addrs) + len(self._common):
            for i, a in enumerate(addrs):
                self.params[i] = a
        else:
            self.params = (ctypes.c_void_p * (len(addrs) + len(self._common)))(
                *addrs, *self._common
            )
        self._prefix_keep = blobs
        self._last_key = key

    def __call__(
        self, q: int, k: int, v: int, o: int, lse: int, stream: int = 0, cu_q: int = 0,
        cu_k: int = 0, hook_ptrs: Sequence[int] | None = None, counter: int = 0,
    ) -> None:  # fmt: skip
        """Launch on `stream` (a CUstream handle; 0 is the legacy default stream); a varlen
        variant with the device pointers of its int32 cu_seqlens_q and cu_seqlens_k and of
        two int32 words for its tile scheduler (`counter`: zero at launch, and used by no
        launch that may run at the same time -- the kernel leaves them zero, so one pair per
        stream serves every launch on it; abi.VARLEN_FWD); a hooked variant with this call's
        aux pointers (`hook_ptrs`: the aux block's pointer slots, `HookArgs.pointers()` of
        values laid out as the bound ones; None: those bound)."""
        with self._lock:
            p = self._ptrs
            p[0], p[1], p[2], p[3], p[4] = q, k, v, o, lse
            if hook_ptrs is not None:
                set_pointers(self._hook_ptrs, hook_ptrs, self.plan.spec.name)
            if self._cu is not None:
                if not (cu_q and cu_k and counter) or counter % 4:
                    raise ValueError(
                        f"kernel {self.plan.spec.name}: a varlen launch needs the cu_seqlens_q "
                        "and cu_seqlens_k device pointers (cu_q=, cu_k=) and two zeroed int32 "
                        f"words for its scheduler (counter=; got {counter:#x})"
                    )
                self._cu[0].value, self._cu[1].value, self._cu[2].value = cu_q, cu_k, counter
            if self.plan.prefix is not None:
                ptrs = (q, k, v, o, lse)
                key = tuple([ptrs[i] for i in self.plan.prefix_uses])
                if key != self._last_key:
                    self._set_prefix(ptrs, key)
            gx, gy, gz = self.grid
            drv = self._drv
            drv.cuCtxGetCurrent(self._cur_ref)
            if self._cur.value == self.context:
                rc = self._launch(
                    self.function, gx, gy, gz, self.block[0], 1, 1, self.smem, stream,
                    self.params, None,
                )  # fmt: skip
            else:
                drv.check(drv.cuCtxPushCurrent(self.context), "making the kernel's context current")
                try:
                    rc = self._launch(
                        self.function, gx, gy, gz, self.block[0], 1, 1, self.smem, stream,
                        self.params, None,
                    )  # fmt: skip
                finally:
                    drv.cuCtxPopCurrent(self._cur_ref)
        if rc:
            spec = self.plan.spec
            raise RuntimeError(
                f"kernel {spec.name} failed (grid {self.grid}, block {self.block[0]}, "
                f"{self.smem} B shared memory): {self._drv.error(rc)}"
            )
