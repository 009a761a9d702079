// Calls two decode variants' launchers (workspace size, then the launch) step by step on the
// devices the steps name, against the CPU stand-ins run with MOCK_GRID_ONLY (filled by
// tests/bundle/test_seq.py). After each step it prints the step, the launch's status and how
// many times the launchers have asked cudaFuncGetAttributes so far: the kernel's code decides
// whether it is a programmatic dependent and whether its splits merge in the merge kernel, and
// each variant asks once per device.
#include "flashgen_attention.h"

#include <cstdio>
#include <cstdlib>

extern "C" int stand_in_func_attributes(void);  // cudaFuncGetAttributes calls so far
extern "C" void stand_in_set_device(int device);  // what cudaGetDevice says from now on

// 'd': switch to device n; 'a' / 'f': call the first / second variant with n splits forced
struct Step {
  char what;
  int n;
};
static const Step kSteps[] = {
@STEPS@
};

static void* device(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) std::exit(3);
  return p;
}

// one call of a variant of head dim `d` (B 1, Tq 1, H 4, Tk 256), softcap 30 for the second
static cudaError_t call(bool second, int splits) {
  const int d = second ? @D_F@ : @D@, B = 1, Tq = 1, H = 4, Tk = 256;
  const size_t q = static_cast<size_t>(B) * Tq * H * d * 2, kv = static_cast<size_t>(B) * Tk * H * d * 2;
  flashgen_decode_params p;
  flashgen_decode_params_contiguous(&p, device(q), device(kv), device(kv), device(q),
                                    static_cast<float*>(device(q)), nullptr, B, Tq, H, H, Tk, d);
  p.num_splits = splits;
  if (second) p.softcap = 30.0f;
  size_t bytes = 0;
  cudaError_t err = second ? @SYMBOL_F@_decode_workspace_bytes(&p, &bytes)
                           : @SYMBOL@_decode_workspace_bytes(&p, &bytes);
  if (err == cudaSuccess && bytes > 0) {
    p.workspace = device(bytes);
    p.workspace_bytes = bytes;
  }
  if (err == cudaSuccess) err = second ? @SYMBOL_F@_decode(&p, nullptr) : @SYMBOL@_decode(&p, nullptr);
  return err;
}

int main() {
  for (const Step& s : kSteps) {
    cudaError_t err = cudaSuccess;
    if (s.what == 'd') {
      stand_in_set_device(s.n);
    } else {
      err = call(s.what == 'f', s.n);
    }
    std::printf("%c%d|%d|%d\n", s.what, s.n, static_cast<int>(err), stand_in_func_attributes());
  }
  return 0;
}
