// The forward launchers' checks, called from a host-only program linked with the CMake-built
// library: no kernel runs and, since every call is refused before any CUDA API call, the
// driver is never touched (none is installed). Placeholders SIMT, MMA and WGMMA: the three
// variants' C symbol prefixes; SIMT_EB, MMA_EB and WGMMA_EB: their element bytes. Prints
// `variant|label|check|fwd|why` and `dispatch|...` lines.
#include "flashgen_attention.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef cudaError_t (*check_fn)(const flashgen_fwd_params*, const char**);
typedef cudaError_t (*fwd_fn)(const flashgen_fwd_params*, cudaStream_t);

static void base(flashgen_fwd_params* p, int d) {
  // fake device addresses, 256-byte aligned and 16 MiB apart (the outputs may not overlap an
  // input): only compared, never dereferenced
  flashgen_fwd_params_contiguous(p, (const void*)0x1000000, (const void*)0x2000000,
                                 (const void*)0x3000000, (void*)0x4000000, (float*)0x5000000,
                                 2, 3, 77, 131, d);
}

static void report(const char* variant, const char* label, check_fn check, fwd_fn fwd,
                   const flashgen_fwd_params* p) {
  const char* why = "unset";
  const cudaError_t c = check(p, &why);
  // the launcher must refuse exactly what the check refuses, before any CUDA call
  const cudaError_t f = c == cudaSuccess ? cudaSuccess : fwd(p, 0);
  printf("%s|%s|%d|%d|%s\n", variant, label, (int)c, (int)f, why ? why : "NULL");
}

#define CASE(label, stmt) \
  do { flashgen_fwd_params p = {}; base(&p, d); stmt; report(v, label, check, fwd, &p); } while (0)

// eb: the variant's element bytes (q is 2 * 3 * 77 * d * eb bytes long)
static void cases(const char* v, int d, long long eb, check_fn check, fwd_fn fwd) {
  CASE("ok", (void)0);
  CASE("null_q", p.q = NULL);
  CASE("null_k", p.k = NULL);
  CASE("null_v", p.v = NULL);
  CASE("null_o", p.o = NULL);
  CASE("null_lse", p.lse = NULL);
  CASE("B0", p.B = 0);
  CASE("Tk0", p.Tk = 0);
  CASE("B_grid", p.B = 65536);
  CASE("H_grid", p.H = 65536);
  CASE("d", p.d = d + 16);
  CASE("scale0", p.scale = 0.0f);
  CASE("scale_neg", p.scale = -1.0f);
  CASE("scale_nan", p.scale = NAN);
  CASE("scale_inf", p.scale = INFINITY);
  CASE("scale_huge", p.scale = 3.0e38f);
  CASE("scale_subnormal_product", p.scale = 5.0e-39f);
  CASE("scale_small_normal_product", p.scale = 1.0e-38f);
  CASE("lse_misaligned", p.lse = (float*)0x5000002);
  CASE("q_plus_1_byte", p.q = (const void*)0x1000001);
  CASE("q_plus_4_bytes", p.q = (const void*)0x1000004);
  CASE("k_plus_2_bytes", p.k = (const void*)0x2000002);
  CASE("k_plus_4_bytes", p.k = (const void*)0x2000004);
  CASE("v_plus_4_bytes", p.v = (const void*)0x3000004);
  CASE("o_plus_2_bytes", p.o = (void*)0x4000002);
  CASE("o_plus_4_bytes", p.o = (void*)0x4000004);
  CASE("alibi_misaligned", p.alibi_slopes = (const float*)0x6000002);
  CASE("v_token_stride_odd", p.v_token_stride = d + 1);
  CASE("o_token_stride_zero", p.o_token_stride = 0);
  CASE("o_head_stride_zero", p.o_head_stride = 0);
  CASE("o_batch_stride_zero", p.o_batch_stride = 0);
  CASE("o_batch_stride_zero_B1", (p.o_batch_stride = 0, p.B = 1));
  CASE("o_rows_overlap", p.o_token_stride = d / 2);
  CASE("o_heads_interleaved_with_tokens", p.o_head_stride = d);
  CASE("o_model_layout", (p.o_token_stride = 3LL * d, p.o_head_stride = d));
  CASE("o_equals_q", p.o = (void*)p.q);
  CASE("o_equals_k", p.o = (void*)p.k);
  CASE("o_inside_v", p.o = (void*)((const char*)p.v + 4096));
  CASE("lse_inside_k", p.lse = (float*)((const char*)p.k + 4096));
  CASE("lse_on_q_last_bytes", p.lse = (float*)((const char*)p.q + 2 * 3 * 77 * d * eb - 64));
  CASE("lse_inside_o", p.lse = (float*)((char*)p.o + 256));
  CASE("o_after_q", p.o = (void*)((const char*)p.q + 2 * 3 * 77 * d * eb));
  CASE("alibi_on_lse", p.alibi_slopes = p.lse);
  CASE("alibi_on_o_last_row", p.alibi_slopes = (const float*)((char*)p.o + 4096));
  CASE("k_equals_v", p.v = p.k);
  CASE("k_batch_stride_4", p.k_batch_stride = 4);
  CASE("negative_q_stride_8", p.q_token_stride = -8);
  CASE("odd_token_strides_Tq1", (p.Tq = 1, p.q_token_stride = 3, p.o_token_stride = 5));
  CASE("k_head_stride_zero", p.k_head_stride = 0);
  // (v and k moved past o and lse: their byte ranges reach 2^40 bytes and more)
  CASE("v_batch_stride_2_40_bytes", (p.v = (const void*)0x7000000, p.v_batch_stride = 1LL << 39));
  // (the helper set H_kv = H: a case that changes H changes H_kv with it)
  CASE("q_strides_zero_B1_H1",
       (p.B = 1, p.H = p.H_kv = 1, p.q_batch_stride = 0, p.q_head_stride = 0));
  CASE("k_token_stride_zero_Tk1", (p.Tk = 1, p.k_token_stride = 0, p.v_token_stride = 0));
  CASE("q_head_stride_2_40_bytes_H1", (p.H = p.H_kv = 1, p.q_head_stride = 1LL << 39));
  CASE("packed_k_batch_stride_too_big_B1_H1",
       (p.k = (const void*)0x7000000, p.B = 1, p.H = p.H_kv = 1, p.k_token_stride = 1LL << 30,
        p.Tk = 1024));
}

int main(void) {
  cases("simt", 32, @SIMT_EB@, @SIMT@_check, @SIMT@_fwd);
  cases("mma", 32, @MMA_EB@, @MMA@_check, @MMA@_fwd);
  cases("wgmma", 64, @WGMMA_EB@, @WGMMA@_check, @WGMMA@_fwd);
  flashgen_fwd_params p = {};
  base(&p, 32);
  printf("dispatch|null|%d\n", (int)flashgen_fwd(NULL, FLASHGEN_FP32, 0, 0));
  printf("dispatch|d64|%d\n", (int)flashgen_fwd((base(&p, 64), &p), FLASHGEN_FP32, 0, 0));
  base(&p, 32);
  printf("dispatch|fp16|%d\n", (int)flashgen_fwd(&p, FLASHGEN_FP16, 0, 0));
  printf("dispatch|simt_causal|%d\n", (int)flashgen_fwd(&p, FLASHGEN_FP32, 1, 0));
  p.q = NULL;
  printf("dispatch|simt_bad|%d\n", (int)flashgen_fwd(&p, FLASHGEN_FP32, 0, 0));
  printf("dispatch|mma_bad|%d\n", (int)flashgen_fwd(&p, FLASHGEN_BF16, 7, 0));
  const char* a = flashgen_fwd_variant(32, FLASHGEN_FP32, 0);
  const char* b = flashgen_fwd_variant(32, FLASHGEN_BF16, 1);
  const char* c = flashgen_fwd_variant(32, FLASHGEN_BF16, 0);
  printf("variant|%s|%s|%s\n", a ? a : "NULL", b ? b : "NULL", c ? c : "NULL");
  return 0;
}
