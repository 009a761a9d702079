// The length limit: Tq/Tk reach the kernels as 32-bit ints and their tile loops step one tile
// past the end, so lengths near INT_MAX overflow them (mma: silent zeros; simt: an endless
// loop out of bounds); the launchers refuse what the Python path refuses. Placeholders: MAX, the
// limit; SIMT and MMA, two variants' C symbol prefixes; SIMT_D and MMA_D, their head dims.
#include "flashgen_attention.h"
#include <stdio.h>

typedef cudaError_t (*check_fn)(const flashgen_fwd_params*, const char**);
typedef cudaError_t (*fwd_fn)(const flashgen_fwd_params*, cudaStream_t);

static void one(const char* v, const char* label, check_fn check, fwd_fn fwd, int tq, int tk,
                int d) {
  flashgen_fwd_params p = {};
  // fake addresses 2^40 bytes apart: a tensor of 2^31 rows spans up to 2^38 bytes here, and
  // the outputs may not overlap an input
  flashgen_fwd_params_contiguous(&p, (const void*)(1ULL << 40), (const void*)(2ULL << 40),
                                 (const void*)(3ULL << 40), (void*)(4ULL << 40),
                                 (float*)(5ULL << 40), 1, 1, tq, tk, d);
  const char* why = "unset";
  const cudaError_t c = check(&p, &why);
  // never launch an accepted problem this long: the CPU stand-in would compute it
  const cudaError_t f = c == cudaSuccess ? cudaSuccess : fwd(&p, 0);
  printf("%s|%s|%d|%d|%s\n", v, label, (int)c, (int)f, why ? why : "NULL");
}

static void cases(const char* v, int d, check_fn check, fwd_fn fwd) {
  one(v, "Tq_limit", check, fwd, @MAX@, 77, d);
  one(v, "Tk_limit", check, fwd, 77, @MAX@, d);
  one(v, "Tq_over", check, fwd, @MAX@ + 1, 77, d);
  one(v, "Tk_over", check, fwd, 77, @MAX@ + 1, d);
  one(v, "Tq_int_max", check, fwd, 2147483647, 77, d);
  one(v, "Tk_int_max", check, fwd, 77, 2147483647, d);
}

int main(void) {
  cases("simt", @SIMT_D@, @SIMT@_check, @SIMT@_fwd);
  cases("mma", @MMA_D@, @MMA@_check, @MMA@_fwd);
  return 0;
}
