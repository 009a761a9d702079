// CPU stand-ins for the CUDA runtime calls a bundle's example and launchers make, and for the
// kernels' host stubs (read by tests/bundle/_support.py, which fills the two placeholders:
// DTYPES with the dtype table's headers and CONVERSION lines, STAND_INS with one STAND_IN*
// line per kernel of the bundle).
//
// The launcher's `k<<<grid, block, smem, stream>>>(args)` becomes
// `__cudaPushCallConfiguration(grid, block, smem, stream)` then a call of the C symbol `k`,
// which here computes the kernel's contract on the CPU in fp32 from the very arguments the
// launcher passes (pointers, lengths, twelve strides, scale*log2(e)) and the grid (B, H).
// Environment:
//   MOCK_BUG=skip|perturb|lse|dk|dv  breaks one output, so that the example must say FAIL
//   MOCK_CC=86                       plays an sm_86 GPU (default: 90, an H100/H200)
//   MOCK_BINARY=80, MOCK_PTX=80      the kernels' code as cudaFuncGetAttributes reports it: SASS
//                                    arch and the PTX arch it came from (__CUDA_ARCH__ / 10;
//                                    default MOCK_BINARY, whose default is MOCK_CC): 90/80 plays
//                                    sm_80 PTX JIT-compiled for an H100
//   MOCK_ENCODE=fail|missing         the driver refuses every tensor map / has no encoder
//   MOCK_ENTRY_API=legacy            the launcher must look the encoder up with
//                                    cudaGetDriverEntryPoint (CUDA < 12.5), not ...ByVersion
//   MOCK_LAUNCH_LOG=path             each forward launch appends its arguments to that file
//   MOCK_MAP_LOG=path                each wgmma backward main kernel appends its four maps
//   MOCK_OCCUPANCY=n                 blocks one SM holds (cudaOccupancy...; default 3)
//   MOCK_GRID_ONLY=path              varlen and decode kernels append their grid (and decode
//                                    its arguments, and 1 when launched as a programmatic
//                                    dependent, else 0) to that file and compute nothing; so
//                                    does the decode merge kernel (<name>_combine)
// The counters and switches below (stand_in_*) are for test programs linked with this file.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>

// one line of the dtype table: the host conversions of the storage type T (empty: none)
template <class T> static T from_f32(float x);
#define CONVERSION(T, TO_FLOAT, FROM_FLOAT)                         \
  static float to_f32(T x) { return TO_FLOAT(x); }                 \
  template <> T from_f32<T>(float x) { return FROM_FLOAT(x); }
@DTYPES@

static dim3 g_grid, g_block;
static size_t g_smem;
static bool g_configured;
static void* g_stream;
static bool g_dependent;  // whether the last launch allowed programmatic stream serialization
static std::map<const void*, int> g_smem_attr;
// what the launchers did: launches (pushed configurations), shared-memory opt-ins, tensor
// maps encoded, and the last kernel that ran; a refused call must make none of them
static int g_launches, g_opt_ins, g_encoded;
static const char* g_last_kernel = "";
// the launch that fails (counted from the call of stand_in_fail_launch) and its status
static int g_fail_in, g_fail_code;
static cudaError_t g_pending = cudaSuccess;
static int g_bwd_phase;
static int g_memsets_async;  // cudaMemsetAsync calls (the decode launcher zeroes its counters)
static int g_func_attributes;  // cudaFuncGetAttributes calls (the decode launcher asks once a device)
static int g_device;  // what cudaGetDevice says (stand_in_set_device)
// the window sides the last forward kernel was launched with
static int g_window[2] = {-9, -9};

extern "C" {
int stand_in_calls(void) { return g_launches + g_opt_ins; }
int stand_in_launches(void) { return g_launches; }
int stand_in_opt_ins(void) { return g_opt_ins; }
int stand_in_encodes(void) { return g_encoded; }
int stand_in_memsets_async(void) { return g_memsets_async; }
int stand_in_func_attributes(void) { return g_func_attributes; }
void stand_in_set_device(int device) { g_device = device; }  // the current device from now on
void stand_in_grid(unsigned* x, unsigned* y, unsigned* z) { *x = g_grid.x, *y = g_grid.y, *z = g_grid.z; }
const char* stand_in_last_kernel(void) { return g_last_kernel; }
void stand_in_window(int* left, int* right) { *left = g_window[0], *right = g_window[1]; }
// the n-th launch from now is refused with `code` (cudaGetLastError returns it once, the
// kernel does not run); the backward sequence starts afresh
void stand_in_fail_launch(int n, int code) { g_fail_in = n, g_fail_code = code; }
void stand_in_reset(void) {
  g_fail_in = 0, g_pending = cudaSuccess, g_bwd_phase = 0, g_configured = false;
  g_last_kernel = "", g_window[0] = g_window[1] = -9;
}
}

static void die(const char* what) {
  std::fprintf(stderr, "stand-in: %s\n", what);
  std::exit(9);
}

static bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && !std::strcmp(v, value);
}

extern "C" {
void** __cudaRegisterFatBinary(void*) { static void* handle; return &handle; }
void __cudaRegisterFatBinaryEnd(void**) {}
void __cudaUnregisterFatBinary(void**) {}
char __cudaInitModule(void**) { return 0; }
unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t smem, void* stream) {
  g_grid = grid, g_block = block, g_smem = smem, g_stream = stream, g_configured = true;
  g_dependent = false;  // a <<<...>>> launch has no attributes
  ++g_launches;
  if (g_fail_in > 0 && --g_fail_in == 0) {  // a refused launch: the kernel is not called
    g_pending = static_cast<cudaError_t>(g_fail_code);
    g_configured = false;
    return 1;
  }
  return 0;
}
}
// every cudaMalloc'ed block by its address: the backward stand-ins check that the workspace
// they use lies inside the caller's allocation
static std::map<uintptr_t, size_t> g_allocs;
cudaError_t cudaMalloc(void** p, size_t n) {
  *p = std::malloc(n);
  g_allocs[reinterpret_cast<uintptr_t>(*p)] = n;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  g_allocs.erase(reinterpret_cast<uintptr_t>(p));
  std::free(p);
  return cudaSuccess;
}
// [at, at + bytes) must lie in the cudaMalloc'ed block `at` starts in (memory from elsewhere,
// e.g. a test's own arena, is not checked)
static void within_allocation(const void* at, size_t bytes, const char* what);
cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) {
  std::memcpy(d, s, n);
  return cudaSuccess;
}
// stream-ordered allocations (the varlen launcher's scheduler counters): filled with garbage, so
// a launcher that does not zero them makes the kernel stand-in fail; g_async_live counts those
// not freed yet (a call must free what it took)
static std::map<uintptr_t, size_t> g_async;
static int g_async_allocs;
cudaError_t cudaMallocAsync(void** p, size_t n, cudaStream_t) {
  *p = std::malloc(n);
  std::memset(*p, 0xab, n);
  g_async[reinterpret_cast<uintptr_t>(*p)] = n;
  ++g_async_allocs;
  return cudaSuccess;
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t) {
  if (g_async.erase(reinterpret_cast<uintptr_t>(p)) != 1) die("cudaFreeAsync of memory cudaMallocAsync did not give");
  std::free(p);
  return cudaSuccess;
}
extern "C" int stand_in_async_allocs(void) { return g_async_allocs; }
extern "C" int stand_in_async_live(void) { return static_cast<int>(g_async.size()); }
cudaError_t cudaMemset(void* d, int v, size_t n) { std::memset(d, v, n); return cudaSuccess; }
cudaError_t cudaMemsetAsync(void* d, int v, size_t n, cudaStream_t) {
  ++g_memsets_async;
  std::memset(d, v, n);
  return cudaSuccess;
}
// (cuda_runtime.h's template for a kernel pointer calls the ...WithFlags entry point)
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* n, const void* f, int threads,
                                                                   size_t smem, unsigned) {
  if (f == nullptr || threads < 1) die("occupancy asked for no kernel");
  if (smem > 48 * 1024 && g_smem_attr[f] < (int)smem) die("occupancy asked before the opt-in above 48 KiB");
  const char* occ = std::getenv("MOCK_OCCUPANCY");
  *n = occ ? std::atoi(occ) : 3;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int* n) { *n = 1; return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  std::memset(p, 0, sizeof *p);
  std::strcpy(p->name, "CPU stand-in");
  p->major = 9;
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
  const cudaError_t e = g_pending;
  g_pending = cudaSuccess;
  return e;
}
const char* cudaGetErrorString(cudaError_t e) {
  static char buf[32];
  std::snprintf(buf, sizeof buf, "stand-in error %d", (int)e);
  return buf;
}
const char* cudaGetErrorName(cudaError_t e) {
  static char buf[32];
  std::snprintf(buf, sizeof buf, "error %d", (int)e);
  return buf;
}
cudaError_t cudaFuncSetAttribute(const void* f, cudaFuncAttribute a, int value) {
  ++g_opt_ins;
  if (a == cudaFuncAttributeMaxDynamicSharedMemorySize) g_smem_attr[f] = value;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) { *device = g_device; return cudaSuccess; }
// The kernels' code (every kernel alike): SASS for MOCK_BINARY, from PTX for MOCK_PTX (see top)
static int kernel_arch(bool ptx) {
  const char* v = ptx ? std::getenv("MOCK_PTX") : nullptr;
  if (v == nullptr) v = std::getenv("MOCK_BINARY");
  if (v == nullptr) v = std::getenv("MOCK_CC");
  return v ? std::atoi(v) : 90;
}
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void* f) {
  if (attr == nullptr || f == nullptr) die("cudaFuncGetAttributes of no kernel");
  ++g_func_attributes;
  std::memset(attr, 0, sizeof *attr);
  attr->binaryVersion = kernel_arch(false);
  attr->ptxVersion = kernel_arch(true);
  attr->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}
// cudaLaunchKernelEx (the decode kernel's and its merge kernel's launches): the kernel stand-ins
// it may launch register how to call them from its argument array; it sets `g_dependent` when
// the launch allows programmatic stream serialization. A refused launch (stand_in_fail_launch)
// returns its code and runs nothing.
using ExInvoker = void (*)(void** args);
static std::map<const void*, ExInvoker>& ex_kernels() {
  static std::map<const void*, ExInvoker> kernels;
  return kernels;
}
static bool register_ex(const void* f, ExInvoker call) {
  ex_kernels()[f] = call;
  return true;
}
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* f, void** args) {
  const auto it = ex_kernels().find(f);
  if (config == nullptr || it == ex_kernels().end()) die("cudaLaunchKernelEx of no known kernel");
  ++g_launches;
  if (g_fail_in > 0 && --g_fail_in == 0) return static_cast<cudaError_t>(g_fail_code);
  g_grid = config->gridDim, g_block = config->blockDim, g_smem = config->dynamicSmemBytes;
  g_stream = config->stream, g_configured = true, g_dependent = false;
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    const cudaLaunchAttribute& a = config->attrs[i];
    if (a.id == cudaLaunchAttributeProgrammaticStreamSerialization) {
      g_dependent = a.val.programmaticStreamSerializationAllowed == 1;
    }
  }
  it->second(args);
  return cudaSuccess;
}
// MOCK_CC=86 plays an sm_86 GPU (default: 90, an H100/H200)
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  const char* cc = std::getenv("MOCK_CC");
  const int n = cc ? std::atoi(cc) : 90;
  if (attr == cudaDevAttrComputeCapabilityMajor) *value = n / 10;
  else if (attr == cudaDevAttrComputeCapabilityMinor) *value = n % 10;
  else if (attr == cudaDevAttrMultiProcessorCount) *value = 132;  // an H200's
  else if (attr == cudaDevAttrMaxSharedMemoryPerBlockOptin) {  // MOCK_SMEM, else an H200's
    const char* smem = std::getenv("MOCK_SMEM");
    *value = smem ? std::atoi(smem) : 232448;
  }
  else return cudaErrorInvalidValue;
  return cudaSuccess;
}

// ---- the driver's cuTensorMapEncodeTiled, played on the CPU: it checks its arguments the way
// the driver documents them and records them in the map's 128 bytes, so that the kernel
// stand-in can read Q, K and V through the maps alone. MOCK_ENCODE=fail refuses every map;
// MOCK_ENCODE=missing plays a driver without the entry point.
struct FakeMap {
  const void* addr;
  cuuint64_t dims[4];
  cuuint64_t strides[3];
  cuuint32_t box[4];
  int dtype, swizzle, l2, oob, interleave;
  cuuint32_t rank;
  cuuint32_t estrides[4];
};
static_assert(sizeof(FakeMap) <= sizeof(CUtensorMap), "the record fits in a map");

static CUresult fake_encode(CUtensorMap* map, CUtensorMapDataType dtype, cuuint32_t rank,
                            void* addr, const cuuint64_t* dims, const cuuint64_t* strides,
                            const cuuint32_t* box, const cuuint32_t* estrides,
                            CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                            CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  ++g_encoded;
  if (env_is("MOCK_ENCODE", "fail")) return CUDA_ERROR_INVALID_VALUE;
  if (rank < 1 || rank > 5 || (reinterpret_cast<uintptr_t>(addr) % 16) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  for (cuuint32_t i = 0; i + 1 < rank; ++i)
    if (strides[i] == 0 || strides[i] % 16 || strides[i] >= (1ull << 40))
      return CUDA_ERROR_INVALID_VALUE;
  FakeMap m{};
  m.addr = addr;
  m.rank = rank;
  for (cuuint32_t i = 0; i < rank; ++i)
    m.dims[i] = dims[i], m.box[i] = box[i], m.estrides[i] = estrides[i];
  for (cuuint32_t i = 0; i + 1 < rank; ++i) m.strides[i] = strides[i];
  m.dtype = dtype, m.swizzle = swizzle, m.l2 = l2, m.oob = oob, m.interleave = interleave;
  std::memset(map, 0, sizeof *map);
  std::memcpy(map, &m, sizeof m);
  return CUDA_SUCCESS;
}

static cudaError_t entry_point(const char* symbol, void** fn,
                               cudaDriverEntryPointQueryResult* status) {
  const bool found = !env_is("MOCK_ENCODE", "missing") && !std::strcmp(symbol, "cuTensorMapEncodeTiled");
  *fn = found ? reinterpret_cast<void*>(&fake_encode) : nullptr;
  if (status) *status = found ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}
cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int version,
                                             unsigned long long,
                                             cudaDriverEntryPointQueryResult* status) {
  if (version < 12000) die("cuTensorMapEncodeTiled asked for a CUDA version before 12.0");
  if (env_is("MOCK_ENTRY_API", "legacy")) die("cudaGetDriverEntryPointByVersion: expected the legacy look-up");
  return entry_point(symbol, fn, status);
}
cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** fn, unsigned long long,
                                    cudaDriverEntryPointQueryResult* status) {
  // CUDA 12.5+ deprecates this look-up: the launcher must use ...ByVersion there
  if (!env_is("MOCK_ENTRY_API", "legacy")) die("cudaGetDriverEntryPoint with CUDA 12.5 or newer");
  return entry_point(symbol, fn, status);
}

// A hooked kernel's hooks, bound to the aux block it was launched with (tests/bundle/_support.py
// writes such a kernel's stand-in): the score_mod on scale * q.k in natural log, and the
// mask_mod, both at (b, h, q_idx, kv_idx, Tq, Tk). MOCK_HOOK=ignore drops them (a kernel that
// forgot its hooks: the example must say FAIL).
struct HookFns {
  std::function<float(float, int, int, int, int, int, int)> score;
  std::function<bool(int, int, int, int, int, int)> keep;
};

template <class T, int D, int DV, int BR, int THREADS, int SMEM, bool CAUSAL>
static void attend(const char* name, const void* self, const T* q, const T* k, const T* v, T* o, float* lse,
                   int tq, int tk, long long q_sb, long long q_sh, long long q_st,
                   long long k_sb, long long k_sh, long long k_st, long long v_sb,
                   long long v_sh, long long v_st, long long o_sb, long long o_sh,
                   long long o_st, float scale_log2, int kv_group, int wl, int wr, float cap,
                   const float* slopes, int H, int B, bool persistent,
                   const HookFns* hooks = nullptr) {
  if (hooks != nullptr && env_is("MOCK_HOOK", "ignore")) hooks = nullptr;
  if (!g_configured) die("kernel called without a launch configuration");
  g_last_kernel = name;
  // what the kernel was given: problem, window sides, softcap, the first ALiBi slope (0: none)
  if (const char* path = std::getenv("MOCK_LAUNCH_LOG")) {
    FILE* f = std::fopen(path, "a");
    if (!f) die("MOCK_LAUNCH_LOG: cannot open");
    std::fprintf(f, "%s|%d|%d|%d|%d|%d|%d|%d|%.9g|%.9g|%.9g\n", name, B, H, tq, tk, kv_group, wl,
                 wr, cap, slopes ? slopes[0] : 0.0f, scale_log2);
    std::fclose(f);
  }
  if (kv_group < 1) die("kv_group < 1");
  // a side reaching every key (left >= Tk, right >= Tq) comes as -1 (unbounded)
  if (wl < -1 || wr < -1 || wl >= tk || wr >= tq) die("window sides out of range");
  g_window[0] = wl, g_window[1] = wr;
  if (!(cap >= 0.0f)) die("softcap < 0");
  // a block per (query tile, head, batch), or for wgmma one-dimensional: a block per tile or,
  // with more tiles than the 132 SMs, persistent blocks (one per SM)
  const long long tiles = (long long)((tq + BR - 1) / BR) * H * B;
  const unsigned one_d = tiles > 132 && g_grid.x == 132 ? 132u : (unsigned)tiles;
  const dim3 want = persistent ? dim3(one_d, 1, 1)
                               : dim3((unsigned)((tq + BR - 1) / BR), (unsigned)H, (unsigned)B);
  if (g_grid.x != want.x || g_grid.y != want.y || g_grid.z != want.z || g_block.x != THREADS)
    die("grid or block");
  if (g_smem != SMEM) die("dynamic shared memory");
  if (SMEM > 48 * 1024 && g_smem_attr[self] < SMEM) die("no opt-in above 48 KiB");
  g_configured = false;
  const char* bug = std::getenv("MOCK_BUG");
  const bool skip = bug && !std::strcmp(bug, "skip"), perturb = bug && !std::strcmp(bug, "perturb");
  const bool bad_lse = bug && !std::strcmp(bug, "lse");
  static float s[1 << 16];
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < tq; ++i) {
        const T* qi = q + b * q_sb + h * q_sh + i * q_st;
        const int pos = i + tk - tq;  // the row's key position (bottom-right alignment)
        int n = 0;
        float m = -INFINITY, l = 0.0f, acc[DV] = {};
        for (int j = 0; j < tk; ++j) {
          const bool hidden =
              (CAUSAL && j > pos) || (wl >= 0 && j < pos - wl) || (wr >= 0 && j > pos + wr);
          const T* kj = k + b * k_sb + (h / kv_group) * k_sh + j * k_st;
          float dot = 0.0f;
          for (int x = 0; x < D; ++x) dot += to_f32(qi[x]) * to_f32(kj[x]);
          float x2 = dot * scale_log2;
          const float log2e = 1.4426950408889634f;
          if (hooks && hooks->score)  // natural log in and out, as the kernels call it
            x2 = hooks->score(x2 * 0.6931471805599453f, b, h, i, j, tq, tk) * log2e;
          const bool dropped = hooks && hooks->keep && !hooks->keep(b, h, i, j, tq, tk);
          if (cap > 0.0f) x2 = cap * log2e * std::tanh(x2 / (cap * log2e));
          if (slopes) x2 -= slopes[h] * log2e * std::fabs((float)(pos - j));
          s[j] = hidden || dropped ? -INFINITY : x2;
          n += s[j] != -INFINITY;
          m = s[j] > m ? s[j] : m;
        }
        for (int j = 0; j < tk && n; ++j) {
          if (s[j] == -INFINITY) continue;
          const float p = std::exp2(s[j] - m);
          const T* vj = v + b * v_sb + (h / kv_group) * v_sh + j * v_st;
          l += p;
          for (int x = 0; x < DV; ++x) acc[x] += p * to_f32(vj[x]);
        }
        T* oi = o + b * o_sb + h * o_sh + i * o_st;
        for (int x = 0; x < DV; ++x) {
          if (skip && b == B - 1 && h == H - 1 && i == tq - 1 && x == DV - 1) continue;
          const float bump = perturb && b == 0 && h == 0 && i == tq - 1 && x == 0 ? 0.5f : 0.0f;
          oi[x] = from_f32<T>((n ? acc[x] / l : 0.0f) + bump);
        }
        const float row_lse = n ? (m + std::log2(l)) * 0.6931471805599453f : -INFINITY;
        lse[((long long)b * H + h) * tq + i] = bad_lse && n == 0 ? 0.0f : row_lse;
      }
}

#define STAND_IN(NAME, T, D, DV, BR, THREADS, SMEM, CAUSAL)                                   \
  extern "C" void NAME(const T* q, const T* k, const T* v, T* o, float* lse, int tq, int tk, \
                       long long a, long long b, long long c, long long d, long long e,       \
                       long long f, long long g, long long h, long long i, long long j,       \
                       long long k2, long long l, float s, int group, int wl, int wr,         \
                       float cap, const float* slopes) {                                      \
    attend<T, D, DV, BR, THREADS, SMEM, CAUSAL>(#NAME, (const void*)&NAME, q, k, v, o, lse, tq, \
                                                tk, a, b, c, d, e, f, g, h, i, j, k2, l, s, group, \
                                                wl, wr, cap, slopes, (int)g_grid.y,              \
                                                (int)g_grid.z, false);                           \
  }

// A wgmma kernel: three tensor maps, heads and batch (its grid is persistent), then the common
// ABI. The maps must be what the launcher documents (4-d over (d, t, head, batch), boxes of
// 64 x BR or BC rows, 128-byte swizzle, L2 promotion 128B, no OOB fill, dense element strides,
// this dtype), and Q, K and V are read through them: the pointer and stride arguments are
// only compared with them.
struct alignas(64) TensorMap { unsigned long long opaque[16]; };

static void check_map(const TensorMap& tm, const void* ptr, int d, int t, int h, int b, int rows,
                      int dtype, long long sb, long long sh, long long st, long long item,
                      long long out[3]) {
  FakeMap m;
  std::memcpy(&m, &tm, sizeof m);
  if (m.addr != ptr || m.rank != 4) die("tensor map: base address or rank");
  const cuuint64_t dims[4] = {(cuuint64_t)d, (cuuint64_t)t, (cuuint64_t)h, (cuuint64_t)b};
  const cuuint32_t box[4] = {64, (cuuint32_t)rows, 1, 1};
  for (int i = 0; i < 4; ++i) {
    if (m.dims[i] != dims[i]) die("tensor map: dims are not (d, t, heads, batch)");
    if (m.box[i] != box[i]) die("tensor map: box is not (64, rows, 1, 1)");
    if (m.estrides[i] != 1) die("tensor map: element strides");
  }
  if (m.dtype != dtype) die("tensor map: data type");
  if (m.swizzle != CU_TENSOR_MAP_SWIZZLE_128B || m.l2 != CU_TENSOR_MAP_L2_PROMOTION_L2_128B ||
      m.oob != CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE || m.interleave != CU_TENSOR_MAP_INTERLEAVE_NONE)
    die("tensor map: swizzle, L2 promotion, OOB fill or interleave");
  const long long given[3] = {st, sh, sb};
  const int extent[3] = {t, h, b};
  for (int i = 0; i < 3; ++i) {
    if (m.strides[i] % item) die("tensor map: a stride is not whole elements");
    out[2 - i] = (long long)(m.strides[i] / item);  // (batch, head, token) in elements
    // an axis longer than 1 keeps the caller's stride; one of extent 1 is never stepped
    if (extent[i] > 1 && out[2 - i] != given[i])
      die("tensor map: a stride differs from the caller's");
  }
}

#define STAND_IN_TMA(NAME, T, D, DV, BR, BC, THREADS, SMEM, CAUSAL, DTYPE)                      \
  extern "C" void NAME(TensorMap tm_q, TensorMap tm_k, TensorMap tm_v, int H, int B,          \
                       const T* q, const T* k, const T* v, T* o, float* lse, int tq, int tk,  \
                       long long a, long long b, long long c, long long d, long long e,       \
                       long long f, long long g, long long h, long long i, long long j,       \
                       long long k2, long long l,                                             \
                       float s, int group, int wl, int wr, float cap, const float* slopes) {    \
    long long sq[3], sk[3], sv[3];                                                               \
    check_map(tm_q, q, D, tq, H, B, BR, DTYPE, a, b, c, sizeof(T), sq);                          \
    check_map(tm_k, k, D, tk, H / group, B, BC, DTYPE, d, e, f, sizeof(T), sk);                  \
    check_map(tm_v, v, DV, tk, H / group, B, BC, DTYPE, g, h, i, sizeof(T), sv);                 \
    attend<T, D, DV, BR, THREADS, SMEM, CAUSAL>(                                                 \
        #NAME, (const void*)&NAME, (const T*)tm_q.opaque[0], (const T*)tm_k.opaque[0],                  \
        (const T*)tm_v.opaque[0], o, lse, tq, tk, sq[0], sq[1], sq[2], sk[0], sk[1], sk[2],      \
        sv[0], sv[1], sv[2], j, k2, l, s, group, wl, wr, cap, slopes, H, B, true);              \
  }
// A wgmma kernel that stores O with the TMA (O_TMA_STORE): a fourth map, O's (64-row boxes,
// DV columns, over (d, tq, heads, batch)), checked as the others and O written through it.
#define STAND_IN_TMA_O(NAME, T, D, DV, BR, BC, THREADS, SMEM, CAUSAL, DTYPE)                    \
  extern "C" void NAME(TensorMap tm_q, TensorMap tm_k, TensorMap tm_v, TensorMap tm_o, int H,  \
                       int B, const T* q, const T* k, const T* v, T* o, float* lse, int tq,    \
                       int tk, long long a, long long b, long long c, long long d,             \
                       long long e, long long f, long long g, long long h, long long i,        \
                       long long j, long long k2, long long l,                                \
                       float s, int group, int wl, int wr, float cap, const float* slopes) {    \
    long long sq[3], sk[3], sv[3], so[3];                                                        \
    check_map(tm_q, q, D, tq, H, B, BR, DTYPE, a, b, c, sizeof(T), sq);                          \
    check_map(tm_k, k, D, tk, H / group, B, BC, DTYPE, d, e, f, sizeof(T), sk);                  \
    check_map(tm_v, v, DV, tk, H / group, B, BC, DTYPE, g, h, i, sizeof(T), sv);                 \
    check_map(tm_o, o, DV, tq, H, B, 64, DTYPE, j, k2, l, sizeof(T), so);                        \
    attend<T, D, DV, BR, THREADS, SMEM, CAUSAL>(                                                 \
        #NAME, (const void*)&NAME, (const T*)tm_q.opaque[0], (const T*)tm_k.opaque[0],                  \
        (const T*)tm_v.opaque[0], (T*)tm_o.opaque[0], lse, tq, tk, sq[0], sq[1], sq[2], sk[0],   \
        sk[1], sk[2], sv[0], sv[1], sv[2], so[0], so[1], so[2], s, group, wl, wr, cap, slopes, H, \
        B, true);                                                                                \
  }
// ---- the backward's three kernels (templates/mma_bwd.cu.j2, wgmma_bwd.cu.j2), in fp32 on the
// CPU. They check the launch contract (the order _pre, main, _post on one stream with one
// argument list; each grid, block and dynamic shared memory; the opt-in above 48 KiB; a
// workspace of d_buf then the dQ accumulator, 16-byte aligned, not overlapping, inside the
// caller's allocation) and share the work as the kernels do: _pre writes D (and for wgmma
// LSE * log2(e)) and zeroes the accumulator over every scratch row, the main one recomputes P
// from them and writes dK and dV and adds dQ into the accumulator, _post converts it; the four
// feature values come last and must be off (-1, -1, 0, NULL: bundled backward variants have no
// features). The scratch has TQP = tq rounded up to ROW_TILE rows per head (mma: 1; wgmma: BR,
// with d_buf two planes, D and LSE * log2(e), +inf past tq: backward.scratch_shapes).
// MOCK_BUG=dk leaves a dK element unwritten, MOCK_BUG=dv moves a dV element by 0.5.
template <class T>
struct BwdArgs {
  const T *q, *k, *v, *o, *dout;
  const float* lse;
  float *d_buf, *dq_accum;
  T *dq, *dk, *dv;
  int tq, tk;
  long long s[24];  // (batch, head, token) of q, k, v, o, dout, dq, dk, dv
  float scale_log2;
  int kv_group;
  int window_left, window_right;
  float softcap;
  const float* alibi_slopes;
};
static unsigned char g_bwd_args[512];
static int g_bwd_h, g_bwd_b;
static void* g_bwd_stream;

static void within_allocation(const void* at, size_t bytes, const char* what) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(at);
  auto it = g_allocs.upper_bound(a);
  if (it == g_allocs.begin()) return;
  --it;
  if (a >= it->first + it->second) return;  // not in a cudaMalloc'ed block
  if (a + bytes > it->first + it->second) die(what);
}

#define BWD_PARAMS(T)                                                                          \
  const T *q, const T *k, const T *v, const T *o, const T *dout, const float *lse,            \
      float *d_buf, float *dq_accum, T *dq, T *dk, T *dv, int tq, int tk, long long s0,        \
      long long s1, long long s2, long long s3, long long s4, long long s5, long long s6,       \
      long long s7, long long s8, long long s9, long long s10, long long s11, long long s12,    \
      long long s13, long long s14, long long s15, long long s16, long long s17, long long s18, \
      long long s19, long long s20, long long s21, long long s22, long long s23,               \
      float scale_log2, int kv_group, int window_left, int window_right, float softcap,        \
      const float *alibi_slopes
#define BWD_FILL(a)                                                                             \
  std::memset(&a, 0, sizeof a);                                                                 \
  a.q = q, a.k = k, a.v = v, a.o = o, a.dout = dout, a.lse = lse, a.d_buf = d_buf;              \
  a.dq_accum = dq_accum, a.dq = dq, a.dk = dk, a.dv = dv, a.tq = tq, a.tk = tk;                 \
  {                                                                                             \
    const long long all[24] = {s0,  s1,  s2,  s3,  s4,  s5,  s6,  s7,  s8,  s9,  s10, s11,     \
                               s12, s13, s14, s15, s16, s17, s18, s19, s20, s21, s22, s23};    \
    std::memcpy(a.s, all, sizeof all);                                                          \
  }                                                                                             \
  a.scale_log2 = scale_log2, a.kv_group = kv_group, a.window_left = window_left;             \
  a.window_right = window_right, a.softcap = softcap, a.alibi_slopes = alibi_slopes

// the launch of one of the three: its configuration, its place in the sequence, the same
// arguments and stream as the first
template <class T>
static void bwd_launch(const BwdArgs<T>& a, int phase, dim3 want, int threads, size_t smem,
                       const void* self) {
  static_assert(sizeof(BwdArgs<T>) <= sizeof g_bwd_args, "args record");
  if (!g_configured) die("backward kernel called without a launch configuration");
  g_configured = false;
  if (g_bwd_phase != phase) die("backward kernels launched out of order (_pre, main, _post)");
  if (phase == 0) {
    std::memcpy(g_bwd_args, &a, sizeof a);
    g_bwd_stream = g_stream;
  } else {
    if (std::memcmp(g_bwd_args, &a, sizeof a)) die("backward kernels given different arguments");
    if (g_stream != g_bwd_stream) die("backward kernels launched on different streams");
  }
  g_bwd_phase = (phase + 1) % 3;
  if (a.window_left != -1 || a.window_right != -1 || a.softcap != 0.0f || a.alibi_slopes)
    die("backward features not passed off (-1, -1, 0, NULL)");
  if (g_grid.x != want.x || g_grid.y != want.y || g_grid.z != want.z ||
      g_block.x != (unsigned)threads || g_block.y != 1 || g_block.z != 1)
    die("backward grid or block");
  if (g_smem != smem) die("backward dynamic shared memory");
  if (smem > 48 * 1024 && g_smem_attr[self] < (int)smem) die("backward: no opt-in above 48 KiB");
}

// rows per head of the scratch, and floats of d_buf per row
static long long scratch_rows(int tq, int row_tile) {
  return ((long long)tq + row_tile - 1) / row_tile * row_tile;
}
static int planes(int row_tile) { return row_tile > 1 ? 2 : 1; }

template <class T, int D, int PRE_ROWS, int THREADS, int ROW_TILE>
static void bwd_pre(const void* self, const BwdArgs<T>& a) {
  const int H = (int)g_grid.y, B = (int)g_grid.z, np = planes(ROW_TILE);
  const long long tqp = scratch_rows(a.tq, ROW_TILE);
  bwd_launch(a, 0, dim3((unsigned)((tqp + PRE_ROWS - 1) / PRE_ROWS), H, B), THREADS, 0, self);
  g_bwd_h = H, g_bwd_b = B;
  const long long rows = (long long)B * H * tqp;
  if ((uintptr_t)a.dq_accum % 16) die("the dQ accumulator is not 16-byte aligned");
  if (a.dq_accum < a.d_buf + rows * np && a.d_buf < a.dq_accum + rows * D)
    die("d_buf overlaps the accumulator");
  within_allocation(a.d_buf, rows * np * sizeof(float), "d_buf runs past the workspace");
  within_allocation(a.dq_accum, rows * D * sizeof(float), "dQ accumulator past the workspace");
  const float log2e = 1.4426950408889634f;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (long long i = 0; i < tqp; ++i) {  // every scratch row, padding included
        float acc = 0.0f;
        if (i < a.tq) {
          const T* oi = a.o + b * a.s[9] + h * a.s[10] + i * a.s[11];
          const T* di = a.dout + b * a.s[12] + h * a.s[13] + i * a.s[14];
          for (int x = 0; x < D; ++x) acc += to_f32(oi[x]) * to_f32(di[x]);
        }
        const long long bh = (long long)b * H + h;
        a.d_buf[bh * np * tqp + i] = acc;
        if (np == 2) {  // LSE * log2(e); +inf (P = 0) where the forward saw no key and past tq
          const float l = i < a.tq ? a.lse[bh * a.tq + i] : -INFINITY;
          a.d_buf[bh * 2 * tqp + tqp + i] = l == -INFINITY ? INFINITY : l * log2e;
        }
        for (int x = 0; x < D; ++x) a.dq_accum[(bh * tqp + i) * D + x] = 0.0f;
      }
}

template <class T, int D, int BC, int THREADS, int SMEM, bool CAUSAL, int ROW_TILE>
static void bwd_main(const void* self, const BwdArgs<T>& a) {
  const int H = g_bwd_h, B = g_bwd_b, group = a.kv_group, np = planes(ROW_TILE);
  if (group < 1 || H % group) die("kv_group does not divide the heads");
  bwd_launch(a, 1, dim3((unsigned)((a.tk + BC - 1) / BC), H / group, B), THREADS, SMEM, self);
  const long long tqp = scratch_rows(a.tq, ROW_TILE);
  const char* bug = std::getenv("MOCK_BUG");
  const float log2e = 1.4426950408889634f, scale = a.scale_log2 / log2e;
  for (int b = 0; b < B; ++b)
    for (int g = 0; g < H / group; ++g)
      for (int j = 0; j < a.tk; ++j) {
        const T* kj = a.k + b * a.s[3] + g * a.s[4] + j * a.s[5];
        const T* vj = a.v + b * a.s[6] + g * a.s[7] + j * a.s[8];
        float dkj[D] = {}, dvj[D] = {};
        for (int h = g * group; h < (g + 1) * group; ++h)
          for (int i = 0; i < a.tq; ++i) {
            const long long bh = (long long)b * H + h, row = bh * tqp + i;
            // the LSE in base 2 as the kernels read it: the forward's (mma), or d_buf's (wgmma)
            const float lse = a.lse[bh * a.tq + i];
            const float l2 = np == 2 ? a.d_buf[bh * 2 * tqp + tqp + i]
                                     : (lse == -INFINITY ? INFINITY : lse * log2e);
            if (l2 == INFINITY || (CAUSAL && j > i + a.tk - a.tq)) continue;
            const T* qi = a.q + b * a.s[0] + h * a.s[1] + i * a.s[2];
            const T* di = a.dout + b * a.s[12] + h * a.s[13] + i * a.s[14];
            float dot = 0.0f, dp = 0.0f;
            for (int x = 0; x < D; ++x) {
              dot += to_f32(qi[x]) * to_f32(kj[x]);
              dp += to_f32(di[x]) * to_f32(vj[x]);
            }
            const float p = std::exp2(dot * a.scale_log2 - l2);
            const float ds = p * (dp - a.d_buf[bh * np * tqp + i]);
            for (int x = 0; x < D; ++x) {
              dvj[x] += p * to_f32(di[x]);
              dkj[x] += ds * to_f32(qi[x]);
              a.dq_accum[row * D + x] += ds * to_f32(kj[x]) * scale;
            }
          }
        T* dk = a.dk + b * a.s[18] + g * a.s[19] + j * a.s[20];
        T* dv = a.dv + b * a.s[21] + g * a.s[22] + j * a.s[23];
        for (int x = 0; x < D; ++x) {
          const bool last = b == B - 1 && g == H / group - 1 && j == a.tk - 1 && x == D - 1;
          if (!(bug && !std::strcmp(bug, "dk") && last)) dk[x] = from_f32<T>(dkj[x] * scale);
          const bool first = b == 0 && g == 0 && j == 0 && x == 0;
          dv[x] = from_f32<T>(dvj[x] + (bug && !std::strcmp(bug, "dv") && first ? 0.5f : 0.0f));
        }
      }
}

template <class T, int D, int PRE_ROWS, int THREADS, int ROW_TILE>
static void bwd_post(const void* self, const BwdArgs<T>& a) {
  const int H = g_bwd_h, B = g_bwd_b;
  bwd_launch(a, 2, dim3((unsigned)((a.tq + PRE_ROWS - 1) / PRE_ROWS), H, B), THREADS, 0, self);
  const long long tqp = scratch_rows(a.tq, ROW_TILE);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < a.tq; ++i) {
        const long long row = ((long long)b * H + h) * tqp + i;
        T* dqi = a.dq + b * a.s[15] + h * a.s[16] + i * a.s[17];
        for (int x = 0; x < D; ++x) dqi[x] = from_f32<T>(a.dq_accum[row * D + x]);
      }
}

#define STAND_IN_BWD(NAME, T, D, BC, PRE_ROWS, THREADS, SMEM, CAUSAL)                          \
  extern "C" void NAME##_pre(BWD_PARAMS(T)) {                                                  \
    BwdArgs<T> a;                                                                               \
    BWD_FILL(a);                                                                                \
    g_last_kernel = #NAME "_pre";                                                               \
    bwd_pre<T, D, PRE_ROWS, THREADS, 1>((const void*)&NAME##_pre, a);                           \
  }                                                                                             \
  extern "C" void NAME(BWD_PARAMS(T)) {                                                         \
    BwdArgs<T> a;                                                                               \
    BWD_FILL(a);                                                                                \
    g_last_kernel = #NAME;                                                                      \
    bwd_main<T, D, BC, THREADS, SMEM, CAUSAL, 1>((const void*)&NAME, a);                        \
  }                                                                                             \
  extern "C" void NAME##_post(BWD_PARAMS(T)) {                                                  \
    BwdArgs<T> a;                                                                               \
    BWD_FILL(a);                                                                                \
    g_last_kernel = #NAME "_post";                                                              \
    bwd_post<T, D, PRE_ROWS, THREADS, 1>((const void*)&NAME##_post, a);                         \
  }

// The wgmma backward's three kernels take four tensor maps ahead of those arguments: each
// checks them (check_map: Q and dO over the H query heads with boxes of BR rows, K and V over
// the K/V heads with boxes of BC rows) and reads Q, K, V and dO through them. With
// MOCK_MAP_LOG set, the main kernel appends the problem and the four maps' fields to that
// file, for the test to compare with what tma.py encodes for the same problem.
static void log_maps(const char* name, const TensorMap* maps, int H, int B, int hkv,
                     const void* const ptrs[4], const long long* s, int tq, int tk) {
  const char* path = std::getenv("MOCK_MAP_LOG");
  if (!path) return;
  FILE* f = std::fopen(path, "a");
  if (!f) die("MOCK_MAP_LOG: cannot open");
  std::fprintf(f, "%s|%d|%d|%d|%d|%d|", name, B, H, hkv, tq, tk);
  for (int i = 0; i < 4; ++i)
    std::fprintf(f, "%llu%s", (unsigned long long)(uintptr_t)ptrs[i], i < 3 ? "," : "|");
  for (int i = 0; i < 24; ++i) std::fprintf(f, "%lld%s", s[i], i < 23 ? "," : "");
  for (int m = 0; m < 4; ++m) {
    FakeMap r;
    std::memcpy(&r, &maps[m], sizeof r);
    std::fprintf(f, "|%llu,%d,%u", (unsigned long long)(uintptr_t)r.addr, r.dtype, r.rank);
    for (int i = 0; i < 4; ++i) std::fprintf(f, ",%llu", (unsigned long long)r.dims[i]);
    for (int i = 0; i < 3; ++i) std::fprintf(f, ",%llu", (unsigned long long)r.strides[i]);
    for (int i = 0; i < 4; ++i) std::fprintf(f, ",%u", r.box[i]);
    for (int i = 0; i < 4; ++i) std::fprintf(f, ",%u", r.estrides[i]);
    std::fprintf(f, ",%d,%d,%d,%d", r.interleave, r.swizzle, r.l2, r.oob);
  }
  std::fprintf(f, "\n");
  std::fclose(f);
}

template <class T>
static void bwd_through_maps(const char* name, const TensorMap* maps, BwdArgs<T>& a, int H, int B,
                             int d, int br, int bc, int dtype, bool log) {
  if (a.kv_group < 1 || H % a.kv_group) die("kv_group does not divide the heads");
  const int hkv = H / a.kv_group;
  const void* ptrs[4] = {a.q, a.k, a.v, a.dout};
  if (log) log_maps(name, maps, H, B, hkv, ptrs, a.s, a.tq, a.tk);
  const struct { const T** ptr; int first, heads, t, rows; } ops[4] = {
      {&a.q, 0, H, a.tq, br}, {&a.k, 3, hkv, a.tk, bc}, {&a.v, 6, hkv, a.tk, bc},
      {&a.dout, 12, H, a.tq, br}};
  for (int m = 0; m < 4; ++m) {
    long long* s = a.s + ops[m].first;
    long long got[3];
    check_map(maps[m], *ops[m].ptr, d, ops[m].t, ops[m].heads, B, ops[m].rows, dtype, s[0], s[1],
              s[2], sizeof(T), got);
    FakeMap r;
    std::memcpy(&r, &maps[m], sizeof r);
    *ops[m].ptr = static_cast<const T*>(r.addr);  // read through the map from here on
    s[0] = got[0], s[1] = got[1], s[2] = got[2];
  }
}

#define BWD_MAPS TensorMap tm_q, TensorMap tm_k, TensorMap tm_v, TensorMap tm_do
#define STAND_IN_BWD_TMA(NAME, T, D, BR, BC, PRE_ROWS, THREADS, SMEM, CAUSAL, DTYPE)            \
  extern "C" void NAME##_pre(BWD_MAPS, BWD_PARAMS(T)) {                                        \
    const TensorMap maps[4] = {tm_q, tm_k, tm_v, tm_do};                                        \
    BwdArgs<T> a;                                                                               \
    BWD_FILL(a);                                                                                \
    bwd_through_maps(#NAME, maps, a, (int)g_grid.y, (int)g_grid.z, D, BR, BC, DTYPE, false);    \
    g_last_kernel = #NAME "_pre";                                                               \
    bwd_pre<T, D, PRE_ROWS, THREADS, BR>((const void*)&NAME##_pre, a);                          \
  }                                                                                             \
  extern "C" void NAME(BWD_MAPS, BWD_PARAMS(T)) {                                               \
    const TensorMap maps[4] = {tm_q, tm_k, tm_v, tm_do};                                        \
    BwdArgs<T> a;                                                                               \
    BWD_FILL(a);                                                                                \
    bwd_through_maps(#NAME, maps, a, (int)g_grid.y * kv_group, (int)g_grid.z, D, BR, BC, DTYPE, \
                     true);                                                                     \
    g_last_kernel = #NAME;                                                                      \
    bwd_main<T, D, BC, THREADS, SMEM, CAUSAL, BR>((const void*)&NAME, a);                       \
  }                                                                                             \
  extern "C" void NAME##_post(BWD_MAPS, BWD_PARAMS(T)) {                                       \
    const TensorMap maps[4] = {tm_q, tm_k, tm_v, tm_do};                                        \
    BwdArgs<T> a;                                                                               \
    BWD_FILL(a);                                                                                \
    bwd_through_maps(#NAME, maps, a, (int)g_grid.y, (int)g_grid.z, D, BR, BC, DTYPE, false);    \
    g_last_kernel = #NAME "_post";                                                              \
    bwd_post<T, D, PRE_ROWS, THREADS, BR>((const void*)&NAME##_post, a);                        \
  }

// ---- the varlen forward (templates/wgmma.cu.j2 with `varlen`) and the decode kernel
// (templates/mma_decode.cu.j2), in fp32 on the CPU, each sequence on its own as the kernels
// attend it. Varlen: three tensor maps over the packed totals as one batch (check_map), n_batch
// 1, a one-dimensional grid of ceil(tq / BR) + n_seqs + 1 query tiles per head (or 132
// persistent blocks); a sequence whose key rows fall outside k gets NaN rows, one whose query
// rows are out of order gets nothing, the rows after the last sequence zeros (LSE -inf).
// Decode: grid (splits, row tiles x K/V heads, B); with several splits the scratch (o_part,
// lse_part, counters) must lie in the caller's allocation, 16-byte aligned and apart, and the
// counters must be zero at launch (the launcher zeroes them: the example hands it garbage).
// Given counters = NULL with several splits (code for sm_90 only: MOCK_PTX/MOCK_BINARY), the
// kernel stores each split's O and base-2 LSE in the scratch -- the keys cut into `splits` runs
// -- and the merge kernel (<name>_combine) must be the next launch, with this launch's o, lse,
// scratch, shape and o strides, on its stream, as a programmatic dependent.
// The decode launch itself must be a programmatic dependent (cudaLaunchKernelEx with the
// attribute) exactly when the code is for sm_90 (it waits at griddepcontrol.wait; older code
// does not, and must get a plain launch), split or not.
// MOCK_BUG=perturb moves the first row's first O element by 0.5.
static bool grid_only(const char* fmt, ...) {
  const char* path = std::getenv("MOCK_GRID_ONLY");
  if (!path) return false;
  FILE* f = std::fopen(path, "a");
  if (!f) die("MOCK_GRID_ONLY: cannot open");
  va_list args;
  va_start(args, fmt);
  std::vfprintf(f, fmt, args);
  va_end(args);
  std::fclose(f);
  g_configured = false;
  return true;
}

// One row of one sequence (keys key(j), values value(j), j < n): O and LSE (natural log).
template <class T, int D, int DV, class Key, class Value>
static int attend_row(const T* qi, int pos, int n, bool causal, int wl, int wr, float scale_log2,
                      float cap, float slope, Key key, Value value, float* out, float* lse) {
  static float s[1 << 16];
  const float log2e = 1.4426950408889634f;
  float m = -INFINITY, l = 0.0f;
  int seen = 0;
  for (int x = 0; x < DV; ++x) out[x] = 0.0f;
  for (int j = 0; j < n; ++j) {
    const bool hidden = (causal && j > pos) || (wl >= 0 && j < pos - wl) || (wr >= 0 && j > pos + wr);
    s[j] = -INFINITY;
    if (hidden) continue;
    const T* kj = key(j);
    float dot = 0.0f;
    for (int x = 0; x < D; ++x) dot += to_f32(qi[x]) * to_f32(kj[x]);
    float x2 = dot * scale_log2;
    if (cap > 0.0f) x2 = cap * log2e * std::tanh(x2 / (cap * log2e));
    x2 -= slope * log2e * std::fabs((float)(pos - j));
    s[j] = x2;
    m = x2 > m ? x2 : m;
    ++seen;
  }
  for (int j = 0; j < n && seen; ++j) {
    if (s[j] == -INFINITY) continue;
    const float p = std::exp2(s[j] - m);
    const T* vj = value(j);
    l += p;
    for (int x = 0; x < DV; ++x) out[x] += p * to_f32(vj[x]);
  }
  for (int x = 0; x < DV && seen; ++x) out[x] /= l;
  *lse = seen ? (m + std::log2(l)) * 0.6931471805599453f : -INFINITY;
  return seen;
}

template <class T, int D, int DV, int BR, int THREADS, int SMEM, bool CAUSAL>
static void varlen(const char* name, const void* self, int H, int n_batch, const T* q, const T* k,
                   const T* v, T* o, float* lse, int tq, int tk, const long long* s, float scale_log2,
                   int group, int wl, int wr, float cap, const float* slopes, const int* cu_q,
                   const int* cu_k, int n_seqs, int* counter) {
  if (!g_configured) die("varlen kernel called without a launch configuration");
  g_last_kernel = name;
  if (n_batch != 1) die("varlen: n_batch is not 1");
  if (!cu_q || !cu_k || n_seqs < 0) die("varlen: no sequences");
  // the tile scheduler's two words: the launch's own (a stream-ordered allocation), zeroed
  const auto held = g_async.find(reinterpret_cast<uintptr_t>(counter));
  if (held == g_async.end() || held->second < 2 * sizeof(int)) die("varlen: the counter is not the launch's own");
  if (counter[0] != 0 || counter[1] != 0) die("varlen: the counter is not zero at launch");
  const long long tiles = ((long long)(tq + BR - 1) / BR + n_seqs + 1) * H;
  const unsigned want = tiles > 132 && g_grid.x == 132 ? 132u : (unsigned)tiles;
  if (g_grid.x != want || g_grid.y != 1 || g_grid.z != 1 || g_block.x != THREADS) die("varlen grid or block");
  if (g_smem != SMEM) die("varlen dynamic shared memory");
  if (SMEM > 48 * 1024 && g_smem_attr[self] < SMEM) die("varlen: no opt-in above 48 KiB");
  if (group < 1 || H % group) die("varlen: kv_group does not divide the heads");
  if (wl < -1 || wr < -1 || wl >= tk || wr >= tq) die("varlen: window sides out of range");
  if (grid_only("%s|%u|%d|%d|%d|%d|%d|%d\n", name, g_grid.x, n_seqs, H, tq, tk, wl, wr)) return;
  g_configured = false;
  const bool perturb = env_is("MOCK_BUG", "perturb");
  float out[DV];
  const long long q_sh = s[1], q_st = s[2], k_sh = s[4], k_st = s[5], v_sh = s[7], v_st = s[8];
  const long long o_sh = s[10], o_st = s[11];
  auto write = [&](int t, int h, const float* vals, float row_lse, bool nan) {
    T* oi = o + h * o_sh + (long long)t * o_st;
    for (int x = 0; x < DV; ++x) oi[x] = from_f32<T>(nan ? NAN : vals[x]);
    lse[(long long)h * tq + t] = nan ? NAN : row_lse;
  };
  for (int b = 0; b <= n_seqs; ++b) {  // b == n_seqs: the rows after the last sequence
    const bool pad = b == n_seqs;
    const int qs = cu_q[b], qe = pad ? tq : cu_q[b + 1];
    if (!(0 <= qs && qs <= qe && qe <= tq)) continue;  // out of order: nothing written
    const int ks = pad ? 0 : cu_k[b], ke = pad ? 0 : cu_k[b + 1];
    const bool k_ok = 0 <= ks && ks <= ke && ke <= tk;
    for (int h = 0; h < H; ++h) {
      const int g = h / group;
      auto key = [&](int j) { return k + g * k_sh + (long long)(ks + j) * k_st; };
      auto value = [&](int j) { return v + g * v_sh + (long long)(ks + j) * v_st; };
      for (int i = 0; i < qe - qs; ++i) {
        float row_lse;
        const int n = k_ok ? ke - ks : 0;
        attend_row<T, D, DV>(q + h * q_sh + (long long)(qs + i) * q_st, i + n - (qe - qs), n, CAUSAL, wl, wr,
                             scale_log2, cap, slopes ? slopes[h] : 0.0f, key, value, out, &row_lse);
        if (perturb && b == 0 && h == 0 && i == 0) out[0] += 0.5f;
        write(qs + i, h, out, row_lse, !k_ok);
      }
    }
  }
}

#define STAND_IN_VARLEN(NAME, T, D, DV, BR, BC, THREADS, SMEM, CAUSAL, DTYPE)                  \
  extern "C" void NAME(TensorMap tm_q, TensorMap tm_k, TensorMap tm_v, int H, int B,          \
                       const T* q, const T* k, const T* v, T* o, float* lse, int tq, int tk,  \
                       long long a, long long b, long long c, long long d, long long e,       \
                       long long f, long long g, long long h, long long i, long long j,       \
                       long long k2, long long l, float sc, int group, int wl, int wr,        \
                       float cap, const float* slopes, const int* cu_q, const int* cu_k,      \
                       int n_seqs, int* counter) {                                            \
    long long s[12] = {a, b, c, d, e, f, g, h, i, j, k2, l};                                  \
    check_map(tm_q, q, D, tq, H, 1, BR, DTYPE, a, b, c, sizeof(T), s);                        \
    check_map(tm_k, k, D, tk, H / group, 1, BC, DTYPE, d, e, f, sizeof(T), s + 3);            \
    check_map(tm_v, v, DV, tk, H / group, 1, BC, DTYPE, g, h, i, sizeof(T), s + 6);           \
    varlen<T, D, DV, BR, THREADS, SMEM, CAUSAL>(#NAME, (const void*)&NAME, H, B,              \
        (const T*)tm_q.opaque[0], (const T*)tm_k.opaque[0], (const T*)tm_v.opaque[0], o, lse,  \
        tq, tk, s, sc, group, wl, wr, cap, slopes, cu_q, cu_k, n_seqs, counter);              \
  }
// A varlen kernel that stores O with the TMA (O_TMA_STORE): a fourth map, O's, over the packed
// rows as Q's (64-row boxes, DV columns, one batch), checked as the others and O written
// through it.
#define STAND_IN_VARLEN_O(NAME, T, D, DV, BR, BC, THREADS, SMEM, CAUSAL, DTYPE)                \
  extern "C" void NAME(TensorMap tm_q, TensorMap tm_k, TensorMap tm_v, TensorMap tm_o, int H, \
                       int B, const T* q, const T* k, const T* v, T* o, float* lse, int tq,   \
                       int tk, long long a, long long b, long long c, long long d,            \
                       long long e, long long f, long long g, long long h, long long i,       \
                       long long j, long long k2, long long l, float sc, int group, int wl,   \
                       int wr, float cap, const float* slopes, const int* cu_q,               \
                       const int* cu_k, int n_seqs, int* counter) {                           \
    long long s[12] = {a, b, c, d, e, f, g, h, i, j, k2, l};                                  \
    check_map(tm_q, q, D, tq, H, 1, BR, DTYPE, a, b, c, sizeof(T), s);                        \
    check_map(tm_k, k, D, tk, H / group, 1, BC, DTYPE, d, e, f, sizeof(T), s + 3);            \
    check_map(tm_v, v, DV, tk, H / group, 1, BC, DTYPE, g, h, i, sizeof(T), s + 6);           \
    check_map(tm_o, o, DV, tq, H, 1, 64, DTYPE, j, k2, l, sizeof(T), s + 9);                  \
    varlen<T, D, DV, BR, THREADS, SMEM, CAUSAL>(#NAME, (const void*)&NAME, H, B,              \
        (const T*)tm_q.opaque[0], (const T*)tm_k.opaque[0], (const T*)tm_v.opaque[0],         \
        (T*)tm_o.opaque[0], lse, tq, tk, s, sc, group, wl, wr, cap, slopes, cu_q, cu_k,       \
        n_seqs, counter);                                                                     \
  }

// The merge a decode launch given counters = NULL left to the merge kernel.
struct PendingMerge {
  bool due;
  const void* o;
  const float *lse, *o_part, *lse_part;
  int splits, tq, group, hkv, B;
  long long o_sb, o_sh, o_st;
  void* stream;
};
static PendingMerge g_merge;

template <class T, int D, int DV, int BR, int THREADS, int SMEM, bool CAUSAL>
static void decode(const char* name, const void* self, const T* q, const T* k, const T* v, T* o,
                   float* lse, float* o_part, float* lse_part, int* counters, const int* seqlens,
                   const int* table, int tq, int tk, int page_size, int bt_stride, int n_pages,
                   const long long* s, float scale_log2, int group, int wl, int wr, float cap,
                   const float* slopes) {
  if (!g_configured) die("decode kernel called without a launch configuration");
  g_last_kernel = name;
  if (g_merge.due) die("decode: the last launch (counters NULL) was not followed by its merge kernel");
  if (group < 1) die("decode: kv_group < 1");
  const int row_tiles = (tq * group + BR - 1) / BR;
  if (g_grid.y % row_tiles) die("decode: grid y is not row tiles x K/V heads");
  const int splits = (int)g_grid.x, hkv = (int)g_grid.y / row_tiles, H = hkv * group, B = (int)g_grid.z;
  if (g_block.x != THREADS || g_block.y != 1 || g_block.z != 1) die("decode block");
  if (g_smem != SMEM) die("decode dynamic shared memory");
  if (SMEM > 48 * 1024 && g_smem_attr[self] < SMEM) die("decode: no opt-in above 48 KiB");
  if (wl < -1 || wr < -1 || wl >= tk || wr >= tq) die("decode: window sides out of range");
  if (table ? (page_size < 1 || n_pages < 1) : page_size != 1) die("decode: page arguments");
  // counters NULL: the merge kernel's way, which only code compiled for sm_90 honours (older
  // code would merge through the NULL counters)
  const bool apart = splits > 1 && counters == nullptr;
  const bool sm90 = kernel_arch(true) >= 90 && kernel_arch(false) >= 90;
  if (apart && !sm90) die("decode: counters NULL on code compiled below sm_90, which merges through them");
  // sm_90 code waits at griddepcontrol.wait: launched as a programmatic dependent, as the Python
  // runtime launches it; older code has no such wait and must not be (it could start early)
  if (g_dependent && !sm90) die("decode: code below sm_90 launched as a programmatic dependent");
  if (!g_dependent && sm90) die("decode: sm_90 code launched without programmatic stream serialization");
  if (splits > 1) {  // the scratch of decode.scratch_sizes in the caller's workspace
    const long long rt = (long long)B * hkv * row_tiles;
    const int G = splits <= 16 ? splits : (int)std::ceil(std::sqrt((double)splits));
    const long long groups = (splits + G - 1) / G;
    if (!o_part || !lse_part) die("decode: split scratch missing");
    if ((uintptr_t)o_part % 16 || (uintptr_t)lse_part % 16 || (uintptr_t)counters % 16)
      die("decode: scratch arrays not 16-byte aligned");
    const size_t ob = rt * splits * BR * DV * 4, lb = rt * splits * BR * 4, cb = rt * (1 + groups) * 4;
    within_allocation(o_part, ob, "decode: o_part past the workspace");
    within_allocation(lse_part, lb, "decode: lse_part past the workspace");
    const char* a = (const char*)o_part;
    const char* b2 = (const char*)lse_part;
    if (!(a + ob <= b2)) die("decode: scratch arrays overlap or out of order");
    if (!apart) {
      within_allocation(counters, cb, "decode: counters past the workspace");
      if (!(b2 + lb <= (const char*)counters)) die("decode: scratch arrays overlap or out of order");
      for (long long i = 0; i < rt * (1 + groups); ++i)
        if (counters[i] != 0) die("decode: counters not zero at launch");
    }
  }
  if (apart) g_merge = {true, o, lse, o_part, lse_part, splits, tq, group, hkv, B, s[9], s[10], s[11], g_stream};
  if (grid_only("%s|%d|%d|%d|%d|%d|%d|%d|%d|%d|%d|%d\n", name, splits, (int)g_grid.y, B, H, tq, tk,
                page_size, bt_stride, n_pages, wl, (int)g_dependent)) return;
  g_configured = false;
  const bool perturb = env_is("MOCK_BUG", "perturb");
  float out[DV];
  for (int b = 0; b < B; ++b) {
    const int L = seqlens ? seqlens[b] : tk;
    bool bad = L < 0 || L > tk;  // that sequence's rows are NaN
    const int n = bad ? 0 : L;
    // key j's (batch or page, token) indices
    auto where = [&](int j, long long* at, long long* t) {
      if (!table) {
        *at = b, *t = j;
        return;
      }
      *at = table[(long long)b * bt_stride + j / page_size], *t = j % page_size;
    };
    for (int j = 0; j < n; ++j) {
      long long at, t;
      where(j, &at, &t);
      if (at < 0 || (table && at >= n_pages)) bad = true;
    }
    for (int h = 0; h < H; ++h) {
      const int g = h / group;
      auto key = [&](int j) {
        long long at, t;
        where(j, &at, &t);
        return k + at * s[3] + g * s[4] + t * s[5];
      };
      auto value = [&](int j) {
        long long at, t;
        where(j, &at, &t);
        return v + at * s[6] + g * s[7] + t * s[8];
      };
      for (int i = 0; i < tq; ++i) {
        float row_lse;
        const T* qi = q + b * s[0] + h * s[1] + (long long)i * s[2];
        const float slope = slopes ? slopes[h] : 0.0f;
        if (apart) {  // split x: keys [n x / splits, n (x + 1) / splits), into its scratch slot
          const long long pr = (long long)i * group + h % group;  // the packed row
          const long long tile = ((long long)b * hkv + g) * row_tiles + pr / BR;
          for (int x = 0; x < splits; ++x) {
            const int lo = (int)((long long)n * x / splits), hi = (int)((long long)n * (x + 1) / splits);
            auto key_x = [&](int j) { return key(j + lo); };
            auto value_x = [&](int j) { return value(j + lo); };
            attend_row<T, D, DV>(qi, i + n - tq - lo, bad ? 0 : hi - lo, CAUSAL, wl, wr, scale_log2, cap,
                                 slope, key_x, value_x, out, &row_lse);
            if (perturb && b == 0 && h == 0 && i == 0) out[0] += 0.5f;
            const long long slot = (tile * splits + x) * BR + pr % BR;
            for (int c = 0; c < DV; ++c) o_part[slot * DV + c] = bad ? NAN : out[c];
            lse_part[slot] = bad ? NAN : row_lse * 1.4426950408889634f;  // base 2 (-inf stays)
          }
          continue;
        }
        attend_row<T, D, DV>(qi, i + n - tq, bad ? 0 : n, CAUSAL, wl, wr, scale_log2, cap, slope, key, value,
                             out, &row_lse);
        if (perturb && b == 0 && h == 0 && i == 0) out[0] += 0.5f;
        T* oi = o + b * s[9] + h * s[10] + (long long)i * s[11];
        for (int x = 0; x < DV; ++x) oi[x] = from_f32<T>(bad ? NAN : out[x]);
        lse[((long long)b * H + h) * tq + i] = bad ? NAN : row_lse;
      }
    }
  }
}

// The decode merge kernel (templates/mma_decode.cu.j2, <name>_combine): grid (tq x group, H_kv,
// B), a block of COMBINE_THREADS, no dynamic shared memory, launched right after the decode
// launch that left it the merge; merges each packed row's splits by their LSE as the kernel
// does (a NaN in any split: NaN row; no key seen: O = 0, LSE = -inf).
template <class T, int DV, int BR, int COMBINE_THREADS>
static void combine(const char* name, T* o, float* lse, const float* o_part, const float* lse_part, int tq,
                    int n_splits, long long o_sb, long long o_sh, long long o_st, int group) {
  if (!g_configured) die("merge kernel called without a launch configuration");
  g_last_kernel = name;
  const PendingMerge m = g_merge;
  g_merge.due = false;
  if (!m.due) die("merge kernel launched after no decode launch given counters = NULL");
  if (!g_dependent) die("merge kernel launched without programmatic stream serialization");
  if (g_stream != m.stream) die("merge kernel launched on another stream than its decode launch");
  if (g_block.x != COMBINE_THREADS || g_block.y != 1 || g_block.z != 1 || g_smem != 0)
    die("merge kernel block or dynamic shared memory");
  if (o != m.o || lse != m.lse || o_part != m.o_part || lse_part != m.lse_part)
    die("merge kernel: o, lse or the scratch differ from the decode launch's");
  if (tq != m.tq || n_splits != m.splits || group != m.group) die("merge kernel: tq, n_splits or kv_group");
  if (o_sb != m.o_sb || o_sh != m.o_sh || o_st != m.o_st) die("merge kernel: o's strides");
  if (g_grid.x != (unsigned)(tq * group) || g_grid.y != (unsigned)m.hkv || g_grid.z != (unsigned)m.B)
    die("merge kernel grid");
  if (grid_only("%s|%u|%u|%u|%d|%d\n", name, g_grid.x, g_grid.y, g_grid.z, tq, n_splits)) return;
  g_configured = false;
  const int row_tiles = (tq * group + BR - 1) / BR, H = m.hkv * group;
  for (int b = 0; b < m.B; ++b)
    for (int g = 0; g < m.hkv; ++g)
      for (int pr = 0; pr < tq * group; ++pr) {
        const long long tile = ((long long)b * m.hkv + g) * row_tiles + pr / BR;
        const int t = pr / group, h = g * group + pr % group;
        bool nan = false;
        float mx = -INFINITY;
        for (int x = 0; x < n_splits; ++x) {
          const float l2 = lse_part[(tile * n_splits + x) * BR + pr % BR];
          nan |= l2 != l2;
          mx = l2 > mx ? l2 : mx;
        }
        float acc[DV] = {}, sum = 0.0f;
        for (int x = 0; x < n_splits && !nan && mx != -INFINITY; ++x) {
          const long long slot = (tile * n_splits + x) * BR + pr % BR;
          const float w = std::exp2(lse_part[slot] - mx);
          sum += w;
          for (int c = 0; c < DV; ++c) acc[c] += w * o_part[slot * DV + c];
        }
        T* orow = o + b * o_sb + h * o_sh + (long long)t * o_st;
        for (int c = 0; c < DV; ++c) orow[c] = from_f32<T>(nan ? NAN : sum > 0.0f ? acc[c] / sum : 0.0f);
        lse[((long long)b * H + h) * tq + t] =
            nan ? NAN : mx == -INFINITY ? -INFINITY : (mx + std::log2(sum)) * 0.6931471805599453f;
      }
}

#define STAND_IN_DECODE(NAME, T, D, DV, BR, THREADS, SMEM, CAUSAL, COMBINE_THREADS)              \
  extern "C" void NAME(const T* q, const T* k, const T* v, T* o, float* lse, float* o_part,     \
                       float* lse_part, int* counters, const int* seqlens, const int* table,    \
                       int tq, int tk, int page_size, int bt_stride, int n_pages, long long a,   \
                       long long b, long long c, long long d, long long e, long long f,          \
                       long long g, long long h, long long i, long long j, long long k2,         \
                       long long l, float sc, int group, int wl, int wr, float cap,             \
                       const float* slopes) {                                                   \
    const long long s[12] = {a, b, c, d, e, f, g, h, i, j, k2, l};                              \
    decode<T, D, DV, BR, THREADS, SMEM, CAUSAL>(#NAME, (const void*)&NAME, q, k, v, o, lse,      \
        o_part, lse_part, counters, seqlens, table, tq, tk, page_size, bt_stride, n_pages, s,    \
        sc, group, wl, wr, cap, slopes);                                                        \
  }                                                                                             \
  [[maybe_unused]] static const bool NAME##_ex =                                                \
      register_ex((const void*)&NAME, [](void** a) {                                            \
        const auto L = [&](int i) { return *(long long*)a[i]; };                                \
        NAME(*(const T**)a[0], *(const T**)a[1], *(const T**)a[2], *(T**)a[3], *(float**)a[4],  \
             *(float**)a[5], *(float**)a[6], *(int**)a[7], *(const int**)a[8],                  \
             *(const int**)a[9], *(int*)a[10], *(int*)a[11], *(int*)a[12], *(int*)a[13],        \
             *(int*)a[14], L(15), L(16), L(17), L(18), L(19), L(20), L(21), L(22), L(23),       \
             L(24), L(25), L(26), *(float*)a[27], *(int*)a[28], *(int*)a[29], *(int*)a[30],     \
             *(float*)a[31], *(const float**)a[32]);                                            \
      });                                                                                       \
  extern "C" void NAME##_combine(T* o, float* lse, const float* o_part, const float* lse_part,  \
                                 int tq, int n_splits, long long o_sb, long long o_sh,          \
                                 long long o_st, int group) {                                   \
    combine<T, DV, BR, COMBINE_THREADS>(#NAME "_combine", o, lse, o_part, lse_part, tq,        \
                                        n_splits, o_sb, o_sh, o_st, group);                     \
  }                                                                                             \
  [[maybe_unused]] static const bool NAME##_combine_ex =                                        \
      register_ex((const void*)&NAME##_combine, [](void** a) {                                  \
        NAME##_combine(*(T**)a[0], *(float**)a[1], *(const float**)a[2], *(const float**)a[3],  \
                       *(int*)a[4], *(int*)a[5], *(long long*)a[6], *(long long*)a[7],          \
                       *(long long*)a[8], *(int*)a[9]);                                         \
      });
@STAND_INS@
