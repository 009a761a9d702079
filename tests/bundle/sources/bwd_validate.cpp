// The backward launcher's checks, with real (host) memory behind the CPU stand-ins (linked
// with stand_in.cpp, which counts launches and opt-ins): every refused parameter set makes no
// launch and no opt-in, the accepted one launches the three kernels (and opts in when the
// variant needs over 48 KiB). The workspace is exactly the variant's own
// (<SYM>_bwd_workspace_bytes). Placeholders: SYM, the variant's C symbol prefix; D, DTYPE,
// CAUSAL, its key; MAX, the length limit.
#include "flashgen_attention.h"
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" int stand_in_calls(void);

static const int B = 2, H = 4, HKV = 2, TQ = 33, TK = 47, D = @D@;
static char* arena;

static void base(flashgen_bwd_params* p) {
  const size_t qn = (size_t)B * H * TQ * D * 2, kn = (size_t)B * HKV * TK * D * 2;
  const size_t sizes[10] = {qn, kn, kn, qn, qn, (size_t)B * H * TQ * 4, qn, kn, kn, 0};
  char* at[10];
  size_t off = 0;
  for (int i = 0; i < 10; ++i) at[i] = arena + off, off += (sizes[i] + 255) / 256 * 256;
  flashgen_bwd_params_contiguous(p, at[0], at[1], at[2], at[3], at[4], (const float*)at[5],
                                 at[6], at[7], at[8], B, H, TQ, TK, D);
  p->H_kv = HKV;
  p->k_head_stride = p->v_head_stride = p->dk_head_stride = p->dv_head_stride = (long long)TK * D;
  p->k_batch_stride = p->v_batch_stride = p->dk_batch_stride = p->dv_batch_stride =
      (long long)HKV * TK * D;
  p->workspace = (float*)at[9];
  p->workspace_bytes = @SYM@_bwd_workspace_bytes(p);
}

static void report(const char* label, const flashgen_bwd_params* p) {
  const char* why = "unset";
  const cudaError_t c = @SYM@_bwd_check(p, &why);
  const int before = stand_in_calls();
  const cudaError_t f = (c != cudaSuccess || !std::strcmp(label, "ok")) ? @SYM@_bwd(p, 0) : c;
  printf("case|%s|%d|%d|%d|%s\n", label, (int)c, (int)f, stand_in_calls() - before,
         why ? why : "NULL");
}

#define CASE(label, stmt) \
  do { flashgen_bwd_params p; base(&p); stmt; report(label, &p); } while (0)

int main(void) {
  arena = (char*)std::aligned_alloc(256, 16 << 20);
  std::memset(arena, 0, 16 << 20);
  CASE("ok", (void)0);
  report("null_params", NULL);
  CASE("null_q", p.q = NULL);
  CASE("null_k", p.k = NULL);
  CASE("null_v", p.v = NULL);
  CASE("null_o", p.o = NULL);
  CASE("null_dout", p.dout = NULL);
  CASE("null_dq", p.dq = NULL);
  CASE("null_dk", p.dk = NULL);
  CASE("null_lse", p.lse = NULL);
  CASE("null_dv", p.dv = NULL);
  CASE("null_workspace", p.workspace = NULL);
  CASE("B0", p.B = 0);
  CASE("Tk0", p.Tk = 0);
  CASE("Tq_over", p.Tq = @MAX@ + 1);
  CASE("H_grid", (p.H = 65536, p.H_kv = 0));
  CASE("H_kv_3", p.H_kv = 3);
  CASE("H_kv_neg", p.H_kv = -1);
  CASE("d", p.d = D + 8);
  CASE("scale0", p.scale = 0.0f);
  CASE("scale_nan", p.scale = NAN);
  CASE("scale_huge", p.scale = 3.0e38f);
  CASE("lse_misaligned", p.lse = (const float*)((const char*)p.lse + 2));
  CASE("q_plus_8_bytes", p.q = (const char*)p.q + 8);
  CASE("dk_plus_2_bytes", p.dk = (char*)p.dk + 2);
  CASE("dout_token_stride_odd", p.dout_token_stride = D + 1);
  CASE("dv_head_stride_4", p.dv_head_stride = 4);
  CASE("o_batch_stride_12", p.o_batch_stride = 12);
  CASE("dq_token_stride_zero", p.dq_token_stride = 0);
  CASE("dk_head_stride_zero", p.dk_head_stride = 0);
  CASE("o_token_stride_zero", p.o_token_stride = 0);
  CASE("dq_batch_stride_zero_B1", (p.B = 1, p.dq_batch_stride = 0));
  CASE("odd_token_strides_Tq1",
       (p.Tq = 1, p.q_token_stride = 3, p.dq_token_stride = 5, p.o_token_stride = 7,
        p.dout_token_stride = 9));
  CASE("negative_q_token_stride_8", p.q_token_stride = -8);
  CASE("dv_equals_dk", p.dv = p.dk);
  CASE("dq_equals_q", p.dq = (void*)p.q);
  CASE("workspace_one_byte_short", p.workspace_bytes -= 1);
  CASE("workspace_plus_4_bytes", p.workspace += 1);
  CASE("workspace_on_dq", (p.workspace = (float*)p.dq, p.workspace_bytes = 1 << 24));
  CASE("workspace_on_lse", (p.workspace = (float*)p.lse, p.workspace_bytes = 1 << 24));
  CASE("workspace_size_overflow", (p.B = 65535, p.H = 65535, p.H_kv = 0, p.Tq = @MAX@));
  flashgen_bwd_params p;
  base(&p);
  // the dispatch's size (the most a variant of head dim D needs), the variant's own, and
  // both for (B, H, Tq) = (1, 1, 1); then NULL, an overflow, and a head dim with no variant
  printf("bytes|%zu|%zu", flashgen_bwd_workspace_bytes(&p), @SYM@_bwd_workspace_bytes(&p));
  p.B = p.H = p.Tq = 1;
  printf("|%zu|%zu", flashgen_bwd_workspace_bytes(&p), @SYM@_bwd_workspace_bytes(&p));
  p.B = 65535, p.H = 65535, p.Tq = @MAX@;
  printf("|%zu|%zu", flashgen_bwd_workspace_bytes(NULL), flashgen_bwd_workspace_bytes(&p));
  base(&p);
  p.d = 3;
  printf("|%zu\n", flashgen_bwd_workspace_bytes(&p));
  base(&p);
  const int before = stand_in_calls();
  const cudaError_t ok = flashgen_bwd(&p, @DTYPE@, @CAUSAL@, 0);
  printf("dispatch|ok|%d|%d\n", (int)ok, stand_in_calls() - before);
  printf("dispatch|null|%d\n", (int)flashgen_bwd(NULL, @DTYPE@, @CAUSAL@, 0));
  printf("dispatch|fp32|%d\n", (int)flashgen_bwd(&p, FLASHGEN_FP32, @CAUSAL@, 0));
  printf("dispatch|mask|%d\n", (int)flashgen_bwd(&p, @DTYPE@, !@CAUSAL@, 0));
  p.dout = NULL;
  printf("dispatch|bad|%d\n", (int)flashgen_bwd(&p, @DTYPE@, @CAUSAL@, 0));
  const char* why = NULL;
  const cudaError_t sup = flashgen_bwd_supported(D, FLASHGEN_FP32, 0, 0, &why);
  const char* a = flashgen_bwd_variant(32, FLASHGEN_BF16, 1);
  const char* b = flashgen_bwd_variant(64, FLASHGEN_BF16, 0);
  const char* c = flashgen_bwd_variant(64, FLASHGEN_BF16, 1);
  printf("variant|%s|%s|%s|%d|%s\n", a ? a : "NULL", b ? b : "NULL", c ? c : "NULL", (int)sup,
         why ? why : "NULL");
  std::free(arena);
  return 0;
}
