/* Every declaration of a bundle's header, checked by the compiler: this file compiles as C99
   and as C++11 under -Wall -Wextra -Werror only if each function has the signature below, each
   params field the type below, and the enum and counts the values the test fills in.

   Placeholders: NUM_VARIANTS, NUM_FWD, NUM_BWD; DTYPES holds one DTYPE(NAME, value) line per
   storage type, FWD one FWD(symbol) line per forward variant, BWD one BWD(symbol) line per
   backward variant. */
#include "flashgen_attention.h"
#include "flashgen_attention.h" /* twice: the include guard */

#if FLASHGEN_NUM_VARIANTS != @NUM_VARIANTS@ || FLASHGEN_NUM_FWD_VARIANTS != @NUM_FWD@ || \
    FLASHGEN_NUM_BWD_VARIANTS != @NUM_BWD@
#error "FLASHGEN_NUM_VARIANTS, FLASHGEN_NUM_FWD_VARIANTS or FLASHGEN_NUM_BWD_VARIANTS"
#endif

/* a compile-time check in C99 and C++11: an array of negative size when `cond` fails */
#define STATIC_CHECK(name, cond) typedef char name[(cond) ? 1 : -1]
#define DTYPE(NAME, VALUE) STATIC_CHECK(dtype_##NAME, FLASHGEN_##NAME == (VALUE));
@DTYPES@

/* `name` has type T: taking its address into a T* is an error otherwise */
#define HAS_TYPE(T, name) \
  do {                    \
    T* at_ = &(name);     \
    (void)at_;            \
  } while (0)

typedef cudaError_t (*fwd_fn)(const flashgen_fwd_params*, cudaStream_t);
typedef cudaError_t (*fwd_check_fn)(const flashgen_fwd_params*, const char**);
typedef cudaError_t (*device_check_fn)(int, const char**);
typedef cudaError_t (*bwd_fn)(const flashgen_bwd_params*, cudaStream_t);
typedef cudaError_t (*bwd_check_fn)(const flashgen_bwd_params*, const char**);
typedef size_t (*workspace_fn)(const flashgen_bwd_params*);
typedef cudaError_t (*dispatch_fwd_fn)(const flashgen_fwd_params*, flashgen_dtype, int,
                                       cudaStream_t);
typedef cudaError_t (*dispatch_bwd_fn)(const flashgen_bwd_params*, flashgen_dtype, int,
                                       cudaStream_t);
typedef cudaError_t (*supported_fn)(int, flashgen_dtype, int, int, const char**);
typedef const char* (*variant_fn)(int, flashgen_dtype, int);

#define FWD(SYM)                                \
  do {                                          \
    fwd_fn run = SYM##_fwd;                     \
    fwd_check_fn check = SYM##_check;           \
    device_check_fn device = SYM##_device_check; \
    (void)run, (void)check, (void)device;       \
  } while (0);
#define BWD(SYM)                                    \
  do {                                              \
    bwd_fn run = SYM##_bwd;                         \
    bwd_check_fn check = SYM##_bwd_check;           \
    device_check_fn device = SYM##_bwd_device_check; \
    workspace_fn workspace = SYM##_bwd_workspace_bytes; \
    (void)run, (void)check, (void)device, (void)workspace; \
  } while (0);

int main(void) {
  flashgen_fwd_params p;
  flashgen_bwd_params b;
  flashgen_dtype dtype = FLASHGEN_BF16;
  dispatch_fwd_fn fwd = flashgen_fwd;
  supported_fn fwd_supported = flashgen_fwd_supported;
  variant_fn fwd_variant = flashgen_fwd_variant;
  dispatch_bwd_fn bwd = flashgen_bwd;
  supported_fn bwd_supported = flashgen_bwd_supported;
  variant_fn bwd_variant = flashgen_bwd_variant;
  workspace_fn bwd_workspace = flashgen_bwd_workspace_bytes;
  (void)dtype, (void)fwd, (void)fwd_supported, (void)fwd_variant;
  (void)bwd, (void)bwd_supported, (void)bwd_variant, (void)bwd_workspace;

  HAS_TYPE(const void*, p.q);
  HAS_TYPE(const void*, p.k);
  HAS_TYPE(const void*, p.v);
  HAS_TYPE(void*, p.o);
  HAS_TYPE(float*, p.lse);
  HAS_TYPE(int, p.B);
  HAS_TYPE(int, p.H);
  HAS_TYPE(int, p.Tq);
  HAS_TYPE(int, p.Tk);
  HAS_TYPE(int, p.d);
  HAS_TYPE(long long, p.q_batch_stride);
  HAS_TYPE(long long, p.q_head_stride);
  HAS_TYPE(long long, p.q_token_stride);
  HAS_TYPE(long long, p.k_batch_stride);
  HAS_TYPE(long long, p.k_head_stride);
  HAS_TYPE(long long, p.k_token_stride);
  HAS_TYPE(long long, p.v_batch_stride);
  HAS_TYPE(long long, p.v_head_stride);
  HAS_TYPE(long long, p.v_token_stride);
  HAS_TYPE(long long, p.o_batch_stride);
  HAS_TYPE(long long, p.o_head_stride);
  HAS_TYPE(long long, p.o_token_stride);
  HAS_TYPE(float, p.scale);
  HAS_TYPE(int, p.H_kv);
  HAS_TYPE(int, p.use_window);
  HAS_TYPE(int, p.window_left);
  HAS_TYPE(int, p.window_right);
  HAS_TYPE(float, p.softcap);
  HAS_TYPE(const float*, p.alibi_slopes);
  HAS_TYPE(int, p.dv);

  HAS_TYPE(const void*, b.q);
  HAS_TYPE(const void*, b.k);
  HAS_TYPE(const void*, b.v);
  HAS_TYPE(const void*, b.o);
  HAS_TYPE(const void*, b.dout);
  HAS_TYPE(const float*, b.lse);
  HAS_TYPE(void*, b.dq);
  HAS_TYPE(void*, b.dk);
  HAS_TYPE(void*, b.dv);
  HAS_TYPE(int, b.B);
  HAS_TYPE(int, b.H);
  HAS_TYPE(int, b.H_kv);
  HAS_TYPE(int, b.Tq);
  HAS_TYPE(int, b.Tk);
  HAS_TYPE(int, b.d);
  HAS_TYPE(long long, b.q_batch_stride);
  HAS_TYPE(long long, b.q_head_stride);
  HAS_TYPE(long long, b.q_token_stride);
  HAS_TYPE(long long, b.k_batch_stride);
  HAS_TYPE(long long, b.k_head_stride);
  HAS_TYPE(long long, b.k_token_stride);
  HAS_TYPE(long long, b.v_batch_stride);
  HAS_TYPE(long long, b.v_head_stride);
  HAS_TYPE(long long, b.v_token_stride);
  HAS_TYPE(long long, b.o_batch_stride);
  HAS_TYPE(long long, b.o_head_stride);
  HAS_TYPE(long long, b.o_token_stride);
  HAS_TYPE(long long, b.dout_batch_stride);
  HAS_TYPE(long long, b.dout_head_stride);
  HAS_TYPE(long long, b.dout_token_stride);
  HAS_TYPE(long long, b.dq_batch_stride);
  HAS_TYPE(long long, b.dq_head_stride);
  HAS_TYPE(long long, b.dq_token_stride);
  HAS_TYPE(long long, b.dk_batch_stride);
  HAS_TYPE(long long, b.dk_head_stride);
  HAS_TYPE(long long, b.dk_token_stride);
  HAS_TYPE(long long, b.dv_batch_stride);
  HAS_TYPE(long long, b.dv_head_stride);
  HAS_TYPE(long long, b.dv_token_stride);
  HAS_TYPE(float, b.scale);
  HAS_TYPE(float*, b.workspace);
  HAS_TYPE(size_t, b.workspace_bytes);

  /* the helpers, with the argument types they document */
  flashgen_fwd_params_contiguous(&p, (const void*)0, (const void*)0, (const void*)0, (void*)0,
                                 (float*)0, 1, 1, 1, 1, 32);
  flashgen_bwd_params_contiguous(&b, (const void*)0, (const void*)0, (const void*)0,
                                 (const void*)0, (const void*)0, (const float*)0, (void*)0,
                                 (void*)0, (void*)0, 1, 1, 1, 1, 32);

  @FWD@
  @BWD@
  return 0;
}
