/* A C99 program calling a plain bundle (forward variants only: the test's PAIR) through its
   header, linked with its launcher and the CPU stand-ins (stand_in.cpp). Built from two
   translation units of this file (the second with -DSECOND_UNIT), both using the header's
   static inline helpers. Prints `kind|...` lines for the test to check. */
#include "flashgen_attention.h"

#include <stdio.h>
#include <string.h>

const char* stand_in_last_kernel(void);
long long second_unit(void);

#ifdef SECOND_UNIT
long long second_unit(void) {
  flashgen_fwd_params p;
  flashgen_bwd_params b;
  flashgen_fwd_params_contiguous(&p, 0, 0, 0, 0, 0, 1, 1, 3, 5, 8);
  flashgen_bwd_params_contiguous(&b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 3, 5, 8);
  return p.k_head_stride + b.dq_head_stride; /* 5*8 + 3*8 */
}
#else
enum { B = 2, H = 3, TQ = 5, TK = 7, D = 32 };
static float q[B * H * TQ * D], k[B * H * TK * D], v[B * H * TK * D], o[B * H * TQ * D];
static float lse[B * H * TQ];

static const char* text(const char* s) { return s != NULL ? s : "NULL"; }

int main(void) {
  flashgen_fwd_params p;
  flashgen_bwd_params b;
  const char* why = "unset";
  cudaError_t rc;
  int i;
  memset(&p, 0, sizeof p);
  flashgen_fwd_params_contiguous(&p, q, k, v, o, lse, B, H, TQ, TK, D);
  printf("fwd_params|%p|%p|%p|%p|%p|%d|%d|%d|%d|%d|%.9g|%lld|%lld|%lld|%lld|%lld|%lld|%lld|%lld|"
         "%lld|%lld|%lld|%lld\n",
         (void*)p.q, (void*)p.k, (void*)p.v, p.o, (void*)p.lse, p.B, p.H, p.Tq, p.Tk, p.d,
         p.scale, p.q_batch_stride, p.q_head_stride, p.q_token_stride, p.k_batch_stride,
         p.k_head_stride, p.k_token_stride, p.v_batch_stride, p.v_head_stride, p.v_token_stride,
         p.o_batch_stride, p.o_head_stride, p.o_token_stride);
  printf("tensors|%p|%p|%p|%p|%p\n", (void*)q, (void*)k, (void*)v, (void*)o, (void*)lse);
  for (i = 0; i < B * H * TQ * D; ++i) q[i] = (float)(i % 7) * 0.125f;
  for (i = 0; i < B * H * TK * D; ++i) k[i] = v[i] = (float)(i % 5) * 0.25f;
  rc = flashgen_fwd(&p, FLASHGEN_FP32, 0, (cudaStream_t)0);
  printf("fwd|%d|%s|%.9g\n", rc, stand_in_last_kernel(), o[0]);
  printf("fwd_null|%d\n", flashgen_fwd(NULL, FLASHGEN_FP32, 0, (cudaStream_t)0));
  printf("fwd_fp16|%d\n", flashgen_fwd(&p, FLASHGEN_FP16, 0, (cudaStream_t)0));
  printf("fwd_variant|%s|%s|%s\n", text(flashgen_fwd_variant(D, FLASHGEN_FP32, 0)),
         text(flashgen_fwd_variant(D, FLASHGEN_BF16, 1)),
         text(flashgen_fwd_variant(D, FLASHGEN_BF16, 0)));

  memset(&b, 0, sizeof b);
  flashgen_bwd_params_contiguous(&b, q, k, v, o, o, lse, q, k, v, B, H, TQ, TK, D);
  printf("bwd_params|%d|%d|%d|%d|%d|%d|%.9g|%p|%zu", b.B, b.H, b.H_kv, b.Tq, b.Tk, b.d, b.scale,
         (void*)b.workspace, b.workspace_bytes);
  {
    const long long strides[24] = {
        b.q_batch_stride, b.q_head_stride, b.q_token_stride,
        b.k_batch_stride, b.k_head_stride, b.k_token_stride,
        b.v_batch_stride, b.v_head_stride, b.v_token_stride,
        b.o_batch_stride, b.o_head_stride, b.o_token_stride,
        b.dout_batch_stride, b.dout_head_stride, b.dout_token_stride,
        b.dq_batch_stride, b.dq_head_stride, b.dq_token_stride,
        b.dk_batch_stride, b.dk_head_stride, b.dk_token_stride,
        b.dv_batch_stride, b.dv_head_stride, b.dv_token_stride};
    for (i = 0; i < 24; ++i) printf("|%lld", strides[i]);
    printf("\n");
  }
  /* a bundle without backward variants: its backward API refuses every key */
  printf("bwd_workspace|%zu\n", flashgen_bwd_workspace_bytes(&b));
  printf("bwd|%d\n", flashgen_bwd(&b, FLASHGEN_BF16, 1, (cudaStream_t)0));
  rc = flashgen_bwd_supported(D, FLASHGEN_BF16, 1, 0, &why);
  printf("bwd_supported|%d|%s|%s\n", rc, text(why), text(flashgen_bwd_variant(D, FLASHGEN_BF16, 1)));
  printf("second_unit|%lld\n", second_unit());
  return 0;
}
#endif
