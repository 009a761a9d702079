/* The header's params helpers set EVERY field: each struct is first filled with garbage bytes
   (0xAB, 0xFF, pseudo-random), as a struct on the stack may hold, then given to
   flashgen_fwd_params_contiguous / flashgen_bwd_params_contiguous. Each field must then hold
   its value (the shape, the contiguous strides, 1/sqrt(d), the defaults: H_kv = H, dv = d,
   the features off), no byte of the struct may be left over from the garbage (padding
   included: it equals a struct zeroed and then set field by field), and the variants' checks
   and the dispatch (run by the CPU stand-ins) must accept the call as it is (the backward
   after its workspace is set). C99 and C++11, linked with the stand-in bundle's launcher.

   Placeholders: FWD_FIELDS and BWD_FIELDS hold one FIELD(name, value) line per field of each
   struct (the test builds them from the header's struct, so a new field without a value
   here fails it); FWD_RUNS one FWD_RUN(symbol, dtype, causal) line per forward variant to
   call, BWD_RUNS one BWD_RUN(symbol, dtype, causal) line per backward one. Prints
   `kind|...` lines for the test to check. */
#include "flashgen_attention.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif
const char* stand_in_last_kernel(void);
void stand_in_reset(void);
#ifdef __cplusplus
}
#endif

enum { B = 2, H = 3, TQ = 5, TK = 7, D = 32, SLOT = 1 << 14, SLOTS = 12 };

static const char* text(const char* s) { return s != NULL ? s : "NULL"; }

static unsigned char* arena;
/* zeroed host memory the stand-ins read as device memory: 16 KiB slots, 256-byte aligned,
   each more than any tensor here needs (B*H*TK*D fp32 elements: 5,376 bytes) */
static void* slot(int i) { return arena + (size_t)i * SLOT; }

/* the garbage a struct on the stack might hold */
static void garbage(void* p, size_t n, int pattern) {
  unsigned char* b = (unsigned char*)p;
  size_t i;
  unsigned x = 12345u;
  for (i = 0; i < n; ++i) {
    x = x * 1103515245u + 12345u;
    b[i] = pattern == 0 ? 0xAB : pattern == 1 ? 0xFF : (unsigned char)(x >> 16);
  }
}

static void show_bytes(const void* at, size_t n) {
  const unsigned char* b = (const unsigned char*)at;
  size_t i;
  for (i = 0; i < n; ++i) printf("%02x", b[i]);
}

/* the tensors of the calls below (slots of the arena); grad_v is the backward's dv */
static const void *q, *k, *v, *dout;
static void *o, *dq, *dk, *grad_v;
static float* lse;

#define CHECK_FIELD(name, value)                                              \
  printf("field|%s|%d|%s|%d|", what, pattern, #name, (p.name == (value)) ? 1 : 0); \
  show_bytes(&p.name, sizeof p.name);                                         \
  printf("\n");
#define SET_FIELD(name, value) want.name = (value);

static void fwd(int pattern) {
  const char* what = "fwd";
  const char* why = "unset";
  flashgen_fwd_params p, want;
  cudaError_t rc;
  garbage(&p, sizeof p, pattern);
  flashgen_fwd_params_contiguous(&p, q, k, v, o, lse, B, H, TQ, TK, D);
#define FIELD CHECK_FIELD
  @FWD_FIELDS@
#undef FIELD
  memset(&want, 0, sizeof want);
#define FIELD SET_FIELD
  @FWD_FIELDS@
#undef FIELD
  printf("bytes|%s|%d|%d\n", what, pattern, memcmp(&p, &want, sizeof p) == 0 ? 1 : 0);
#define FWD_RUN(SYM, DTYPE, CAUSAL)                                                    \
  rc = SYM##_check(&p, &why);                                                          \
  printf("check|%s|%d|%s|%d|%s\n", what, pattern, #SYM, (int)rc, text(why));          \
  stand_in_reset();                                                                    \
  rc = flashgen_fwd(&p, DTYPE, CAUSAL, (cudaStream_t)0);                               \
  printf("run|%s|%d|%s|%d|%s\n", what, pattern, #SYM, (int)rc, stand_in_last_kernel());
  @FWD_RUNS@
#undef FWD_RUN
}

static void bwd(int pattern) {
  const char* what = "bwd";
  const char* why = "unset";
  flashgen_bwd_params p, want;
  cudaError_t rc;
  garbage(&p, sizeof p, pattern);
  flashgen_bwd_params_contiguous(&p, q, k, v, o, dout, lse, dq, dk, grad_v, B, H, TQ, TK, D);
#define FIELD CHECK_FIELD
  @BWD_FIELDS@
#undef FIELD
  memset(&want, 0, sizeof want);
#define FIELD SET_FIELD
  @BWD_FIELDS@
#undef FIELD
  printf("bytes|%s|%d|%d\n", what, pattern, memcmp(&p, &want, sizeof p) == 0 ? 1 : 0);
  /* the one field a call must add: the workspace (the helper leaves it NULL and 0) */
  p.workspace = (float*)slot(9);
  p.workspace_bytes = flashgen_bwd_workspace_bytes(&p);
  printf("workspace|%s|%d|%d\n", what, pattern,
         p.workspace_bytes > 0 && p.workspace_bytes <= 3 * (size_t)SLOT ? 1 : 0);
#define BWD_RUN(SYM, DTYPE, CAUSAL)                                                    \
  rc = SYM##_bwd_check(&p, &why);                                                      \
  printf("check|%s|%d|%s|%d|%s\n", what, pattern, #SYM, (int)rc, text(why));          \
  stand_in_reset();                                                                    \
  rc = flashgen_bwd(&p, DTYPE, CAUSAL, (cudaStream_t)0);                               \
  printf("run|%s|%d|%s|%d|%s\n", what, pattern, #SYM, (int)rc, stand_in_last_kernel());
  @BWD_RUNS@
#undef BWD_RUN
}

int main(void) {
  int pattern;
  unsigned char* raw = (unsigned char*)malloc((size_t)SLOTS * SLOT + 256);
  if (raw == NULL) return 2;
  arena = raw + (256 - (uintptr_t)raw % 256) % 256;
  memset(arena, 0, (size_t)SLOTS * SLOT);
  q = slot(0), k = slot(1), v = slot(2), o = slot(3), lse = (float*)slot(4);
  dout = slot(5), dq = slot(6), dk = slot(7), grad_v = slot(8);
  for (pattern = 0; pattern < 3; ++pattern) {
    fwd(pattern);
    bwd(pattern);
  }
  free(raw);
  return 0;
}
