// A variant's device check against the GPU's shared memory per block (MOCK_SMEM plays it in the
// CPU stand-in). Linked with the stand-in bundle's launcher. Placeholders: SYM, the C symbol
// prefix of a forward variant; D, DTYPE, CAUSAL its dispatch key. Prints
// `check|status|why` and `supported|status|why`.
#include "flashgen_attention.h"

#include <cstdio>

int main(void) {
  const char* why = "unset";
  const cudaError_t c = @SYM@_device_check(0, &why);
  std::printf("check|%d|%s\n", (int)c, why ? why : "NULL");
  why = "unset";
  const cudaError_t s = flashgen_fwd_supported(@D@, @DTYPE@, @CAUSAL@, 0, &why);
  std::printf("supported|%d|%s\n", (int)s, why ? why : "NULL");
  return 0;
}
