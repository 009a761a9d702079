// The launchers' contract, observed through the CPU stand-ins (stand_in.cpp): what each call
// returns, and what it did before returning: launches, shared-memory opt-ins, tensor maps
// encoded, the kernel that ran. Linked with the stand-in bundle's launcher; prints one
// `kind|...` line per observation for the test to compare with what the specs say.
//
// Placeholders: FWD holds one FWD(symbol, "kernel", d, dv, dtype, causal, features) line per
// forward variant, BWD one BWD(symbol, "kernel", d, dtype, causal) line per backward one.
// Features here are bits: 1 window, 2 softcap, 4 ALiBi.
#include "flashgen_attention.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" {
int stand_in_launches(void);
int stand_in_opt_ins(void);
int stand_in_encodes(void);
const char* stand_in_last_kernel(void);
void stand_in_fail_launch(int n, int code);
void stand_in_reset(void);
}

namespace {

constexpr int kLaunchFailure = 719;  // cudaErrorLaunchFailure
constexpr int kCcs[] = {75, 80, 86, 90, 100};
constexpr int B = 1, H = 2, T = 8;  // small: the stand-in kernels run every accepted call

struct Fwd {
  const char* kernel;
  cudaError_t (*check)(const flashgen_fwd_params*, const char**);
  cudaError_t (*fwd)(const flashgen_fwd_params*, cudaStream_t);
  cudaError_t (*device_check)(int, const char**);
  int d, dv;
  flashgen_dtype dtype;
  int causal, features;
};
#define FWD(SYM, KERNEL, D, DV, DTYPE, CAUSAL, FEATURES) \
  {KERNEL, SYM##_check, SYM##_fwd, SYM##_device_check, D, DV, DTYPE, CAUSAL, FEATURES},
const Fwd kFwd[] = {@FWD@};

struct Bwd {
  const char* kernel;
  cudaError_t (*bwd)(const flashgen_bwd_params*, cudaStream_t);
  size_t (*workspace_bytes)(const flashgen_bwd_params*);
  cudaError_t (*device_check)(int, const char**);
  int d;
  flashgen_dtype dtype;
  int causal;
};
#define BWD(SYM, KERNEL, D, DTYPE, CAUSAL) \
  {KERNEL, SYM##_bwd, SYM##_bwd_workspace_bytes, SYM##_bwd_device_check, D, DTYPE, CAUSAL},
const Bwd kBwd[] = {@BWD@};

// host memory for every tensor of a call: 12 slots of 64 KiB, 256-byte aligned
char* arena;
char* slot(int i) { return arena + (static_cast<size_t>(i) << 16); }

struct Counts {
  int launches, opt_ins, encodes;
};
Counts counts() { return {stand_in_launches(), stand_in_opt_ins(), stand_in_encodes()}; }
Counts since(const Counts& c) {
  const Counts now = counts();
  return {now.launches - c.launches, now.opt_ins - c.opt_ins, now.encodes - c.encodes};
}

void set_cc(int cc) {
  char text[16];
  std::snprintf(text, sizeof text, "%d", cc);
  setenv("MOCK_CC", text, 1);
}

// a valid forward call of head dims (d, dv) using `features`
flashgen_fwd_params fwd_params(int d, int dv, int features) {
  flashgen_fwd_params p = {};
  flashgen_fwd_params_contiguous(&p, slot(0), slot(1), slot(2), slot(3),
                                 reinterpret_cast<float*>(slot(4)), B, H, T, T, d);
  p.dv = dv;
  p.v_token_stride = p.o_token_stride = dv;
  p.v_head_stride = p.o_head_stride = static_cast<long long>(T) * dv;
  p.v_batch_stride = p.o_batch_stride = static_cast<long long>(H) * T * dv;
  if (features & 1) p.use_window = 1, p.window_left = 2, p.window_right = 1;
  if (features & 2) p.softcap = 5.0f;
  if (features & 4) {
    float* slopes = reinterpret_cast<float*>(slot(5));
    for (int h = 0; h < H; ++h) slopes[h] = 0.5f;
    p.alibi_slopes = slopes;
  }
  return p;
}

// a valid backward call: H query heads on one K/V head, the variant's own workspace
flashgen_bwd_params bwd_params(const Bwd& v) {
  flashgen_bwd_params p = {};
  flashgen_bwd_params_contiguous(&p, slot(0), slot(1), slot(2), slot(3), slot(4),
                                 reinterpret_cast<const float*>(slot(5)), slot(6), slot(7),
                                 slot(8), B, H, T, T, v.d);
  p.H_kv = 1;
  p.k_batch_stride = p.v_batch_stride = p.dk_batch_stride = p.dv_batch_stride =
      static_cast<long long>(T) * v.d;
  p.workspace = reinterpret_cast<float*>(slot(9));
  p.workspace_bytes = v.workspace_bytes(&p);
  if (p.workspace_bytes > (3u << 16)) std::abort();  // slots 9 to 11
  return p;
}

const char* text(const char* why) { return why != nullptr ? why : "NULL"; }

void forward(const Fwd& v) {
  const int causal = v.causal ? 7 : 0;  // any nonzero value means causal
  flashgen_fwd_params p = fwd_params(v.d, v.dv, v.features);
  stand_in_reset();
  Counts c = counts();
  cudaError_t rc = v.fwd(&p, 0);
  Counts n = since(c);
  std::printf("accepted|%s|%d|%d|%d|%d|%s\n", v.kernel, rc, n.launches, n.opt_ins, n.encodes,
              stand_in_last_kernel());

  flashgen_fwd_params bad = p;
  bad.scale = 0.0f;  // refused by every variant
  stand_in_reset();
  c = counts();
  rc = v.fwd(&bad, 0);
  n = since(c);
  std::printf("refused|%s|%d|%d|%d|%d\n", v.kernel, rc, n.launches, n.opt_ins, n.encodes);

  stand_in_reset();
  stand_in_fail_launch(1, kLaunchFailure);
  c = counts();
  rc = v.fwd(&p, 0);
  std::printf("failed|%s|%d|%d\n", v.kernel, rc, since(c).launches);

  set_cc(86);
  stand_in_reset();
  c = counts();
  rc = v.fwd(&p, 0);
  n = since(c);
  const cudaError_t rc_bad = v.fwd(&bad, 0);
  std::printf("wrong_gpu|%s|%d|%d|%d|%d|%d\n", v.kernel, rc, rc_bad, n.launches, n.opt_ins,
              n.encodes);
  unsetenv("MOCK_CC");

  setenv("MOCK_ENCODE", "fail", 1);
  stand_in_reset();
  c = counts();
  rc = v.fwd(&p, 0);
  n = since(c);
  std::printf("map_refused|%s|%d|%d|%d|%d\n", v.kernel, rc, n.launches, n.opt_ins, n.encodes);
  unsetenv("MOCK_ENCODE");

  for (int cc : kCcs) {
    set_cc(cc);
    const char* why = "unset";
    rc = v.device_check(0, &why);
    const char* why_supported = "unset";
    const cudaError_t supported = flashgen_fwd_supported(v.d, v.dtype, causal, 0, &why_supported);
    std::printf("device|%s|%d|%d|%s|%d|%s\n", v.kernel, cc, rc, text(why), supported,
                text(why_supported));
  }
  unsetenv("MOCK_CC");

  // the dispatch, on this variant's key with each set of features (and dv left 0: d)
  for (int features : {0, 1, 2, 4, 7}) {
    for (int dv0 = 0; dv0 < 2; ++dv0) {
      if (dv0 && features) continue;
      flashgen_fwd_params q = fwd_params(v.d, v.dv, features);
      if (dv0) q.dv = 0;
      stand_in_reset();
      rc = flashgen_fwd(&q, v.dtype, causal, 0);
      std::printf("dispatch|%d|%d|%d|%d|%d|%d|%d|%s\n", v.d, v.dv, v.dtype, v.causal, features,
                  dv0, rc, stand_in_last_kernel());
    }
  }
}

void backward(const Bwd& v) {
  const int causal = v.causal ? 7 : 0;
  flashgen_bwd_params p = bwd_params(v);
  stand_in_reset();
  Counts c = counts();
  cudaError_t rc = v.bwd(&p, 0);
  Counts n = since(c);
  std::printf("bwd_accepted|%s|%d|%d|%d|%d|%s\n", v.kernel, rc, n.launches, n.opt_ins,
              n.encodes, stand_in_last_kernel());

  for (int k = 1; k <= 3; ++k) {  // the k-th of the three launches fails
    stand_in_reset();
    stand_in_fail_launch(k, kLaunchFailure);
    c = counts();
    rc = v.bwd(&p, 0);
    std::printf("bwd_failed|%s|%d|%d|%d\n", v.kernel, k, rc, since(c).launches);
  }

  set_cc(86);
  stand_in_reset();
  c = counts();
  rc = v.bwd(&p, 0);
  n = since(c);
  std::printf("bwd_wrong_gpu|%s|%d|%d|%d|%d\n", v.kernel, rc, n.launches, n.opt_ins, n.encodes);
  for (int cc : kCcs) {
    set_cc(cc);
    const char* why = "unset";
    rc = v.device_check(0, &why);
    const char* why_supported = "unset";
    const cudaError_t supported = flashgen_bwd_supported(v.d, v.dtype, causal, 0, &why_supported);
    std::printf("bwd_device|%s|%d|%d|%s|%d|%s\n", v.kernel, cc, rc, text(why), supported,
                text(why_supported));
  }
  unsetenv("MOCK_CC");

  stand_in_reset();
  rc = flashgen_bwd(&p, v.dtype, causal, 0);
  const char* variant = flashgen_bwd_variant(v.d, v.dtype, causal);
  std::printf("bwd_dispatch|%s|%d|%s|%s\n", v.kernel, rc, stand_in_last_kernel(), text(variant));
}

}  // namespace

int main() {
  arena = static_cast<char*>(std::aligned_alloc(256, 12 << 16));
  std::memset(arena, 0, 12 << 16);
  for (const Fwd& v : kFwd) forward(v);
  for (const Bwd& v : kBwd) backward(v);
  std::free(arena);
  return 0;
}
