/* A C99 program using the varlen and decode parts of a bundle's header (the test's SEQ bundle):
   the helpers fill every field, and the dispatchers refuse a NULL or unknown call without
   launching. Linked with the launcher and the CPU stand-ins. Prints `kind|...` lines. */
#include "flashgen_attention.h"

#include <stdio.h>

int main(void) {
  flashgen_varlen_params v;
  flashgen_decode_params d;
  size_t bytes = 7;
  memset(&v, 0xAB, sizeof v);
  memset(&d, 0xAB, sizeof d);
  flashgen_varlen_params_packed(&v, 0, 0, 0, 0, 0, 0, 0, 3, 100, 90, 50, 40, 8, 2, 64);
  printf("varlen|%lld|%lld|%lld|%lld|%d|%d|%d|%g\n", v.q_head_stride, v.q_token_stride,
         v.k_token_stride, v.o_token_stride, v.dv, v.window_left, v.use_window, (double)v.softcap);
  flashgen_decode_params_paged(&d, 0, 0, 0, 0, 0, 0, 0, 4, 2, 8, 2, 33, 16, 5, 128);
  printf("decode|%d|%d|%lld|%lld|%lld|%d|%d|%p\n", d.Tk, d.block_table_stride, d.k_batch_stride,
         d.q_token_stride, d.o_batch_stride, d.num_splits, d.window_right, d.workspace);
  {
    const int a = (int)flashgen_varlen_fwd(NULL, FLASHGEN_FP16, 1, 0);
    const int b = (int)flashgen_decode(NULL, FLASHGEN_BF16, 0, 0);
    const int c = (int)flashgen_decode_workspace_bytes(&d, FLASHGEN_FP32, 0, &bytes);
    printf("refused|%d|%d|%d|%d\n", a, b, c, (int)bytes);
  }
  return 0;
}
