// The window sides a forward launcher passes its kernel, observed through the CPU stand-ins
// (stand_in.cpp records the last forward launch's): a side reaching every key of every row
// (left >= Tk, right >= Tq) must come as -1. Linked with the stand-in bundle's launcher.
// Placeholders: SYM, a windowed variant's C symbol prefix; D, its head dim; EB, its element
// bytes; SOFTCAP, the softcap to pass (0: off; a softcap variant needs one). Prints
// `side|Tq|Tk|left|right|status|left passed|right passed` lines.
#include "flashgen_attention.h"

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" {
void stand_in_window(int* left, int* right);
void stand_in_reset(void);
}

static const int D = @D@, EB = @EB@;

static void* zeros(size_t bytes) {
  void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  std::memset(p, 0, (bytes + 255) / 256 * 256);
  return p;
}

static void problem(int tq, int tk) {
  // zeros: any storage dtype reads them as 0.0; k and v share memory (inputs may)
  void* q = zeros((size_t)tq * D * EB);
  void* kv = zeros((size_t)tk * D * EB);
  void* o = zeros((size_t)tq * D * EB);
  float* lse = (float*)zeros((size_t)tq * sizeof(float));
  const int sides[][2] = {{-1, -1}, {tk - 1, tq - 1}, {tk, tq - 1}, {tk - 1, tq}, {tk, tq},
                          {1000, 1000}, {INT_MAX, INT_MAX}, {0, 0}, {-1, tq - 1}, {tk - 1, -1}};
  for (const auto& side : sides) {
    flashgen_fwd_params p = {};
    flashgen_fwd_params_contiguous(&p, q, kv, kv, o, lse, 1, 1, tq, tk, D);
    p.use_window = 1, p.window_left = side[0], p.window_right = side[1];
    p.softcap = @SOFTCAP@f;
    int left = -9, right = -9;
    stand_in_reset();  // -9 if the call launches nothing
    const cudaError_t err = @SYM@_fwd(&p, 0);
    stand_in_window(&left, &right);
    std::printf("side|%d|%d|%d|%d|%d|%d|%d\n", tq, tk, side[0], side[1], (int)err, left, right);
  }
  std::free(q), std::free(kv), std::free(o), std::free(lse);
}

int main(void) {
  problem(5, 7);  // more keys than queries: the left side reaches every key from Tk on
  problem(7, 5);  // more queries: the right side from Tq on
  return 0;
}
