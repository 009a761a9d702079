// Calls flashgen_varlen_fwd (dispatch) and one decode variant's launcher on the problems of the two tables
// (filled by tests/bundle/test_seq.py) against the CPU stand-ins run with MOCK_GRID_ONLY, which
// record each launch's grid instead of computing it. Prints per decode problem the workspace
// flashgen_decode_workspace_bytes asks for, then calls flashgen_decode with it.
#include "flashgen_attention.h"

#include <cstdio>
#include <cstdlib>

extern "C" int stand_in_async_live(void);  // stream-ordered allocations not freed yet

struct VarlenProblem {
  int d, dv;
  flashgen_dtype dtype;
  int causal;
  float softcap;
  int n_seqs, total_q, total_k, max_q, max_k, H, use_window, left, right;
};
struct DecodeProblem {
  int B, Tq, H, H_kv, Tk, num_splits;
};
static const VarlenProblem kVarlen[] = {
@VARLEN_PROBLEMS@
};
static const DecodeProblem kDecode[] = {
@DECODE_PROBLEMS@
};

static void* device(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) std::exit(3);
  return p;
}

int main() {
  for (const VarlenProblem& c : kVarlen) {
    const int d = c.d;
    const size_t rows = static_cast<size_t>(c.total_q > c.total_k ? c.total_q : c.total_k);
    int* cu = static_cast<int*>(device((c.n_seqs + 1) * sizeof(int)));
    for (int i = 0; i <= c.n_seqs; ++i) cu[i] = 0;
    flashgen_varlen_params p;
    flashgen_varlen_params_packed(&p, device(rows * c.H * d * 2), device(rows * c.H * d * 2),
                                  device(rows * c.H * d * 2), device(rows * c.H * d * 2),
                                  static_cast<float*>(device(rows * c.H * 4)), cu, cu, c.n_seqs,
                                  c.total_q, c.total_k, c.max_q, c.max_k, c.H, c.H, d);
    p.dv = c.dv, p.v_head_stride = p.o_head_stride = c.dv;
    p.v_token_stride = p.o_token_stride = static_cast<long long>(c.H) * c.dv;
    p.use_window = c.use_window, p.window_left = c.left, p.window_right = c.right;
    p.softcap = c.softcap;
    const cudaError_t err = flashgen_varlen_fwd(&p, c.dtype, c.causal, nullptr);
    std::printf("varlen|%d|%d\n", stand_in_async_live(), static_cast<int>(err));
  }
  for (const DecodeProblem& c : kDecode) {
    const int d = @DECODE_D@;
    const size_t q = static_cast<size_t>(c.B) * c.Tq * c.H * d * 2;
    const size_t kv = static_cast<size_t>(c.B) * c.Tk * c.H_kv * d * 2;
    flashgen_decode_params p;
    flashgen_decode_params_contiguous(&p, device(q), device(kv), device(kv), device(q),
                                      static_cast<float*>(device(q)), nullptr, c.B, c.Tq, c.H,
                                      c.H_kv, c.Tk, d);
    p.num_splits = c.num_splits;
    size_t bytes = 0;
    cudaError_t err = @DECODE_SYMBOL@_decode_workspace_bytes(&p, &bytes);
    if (err == cudaSuccess && bytes > 0) {
      p.workspace = device(bytes);
      p.workspace_bytes = bytes;
    }
    if (err == cudaSuccess) err = @DECODE_SYMBOL@_decode(&p, nullptr);
    std::printf("decode|%zu|%d\n", bytes, static_cast<int>(err));
  }
  return 0;
}
