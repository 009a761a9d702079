#!/bin/bash
# bench/experiments/s33c-decode-host-profile.sh (carry .whl; ~1 min): where an eager decode call's
# ~30 us of host time goes (cProfile, B=1 Tk=4096 8/1 heads), and why it grew ~17 us after torch
# SDPA ran in session 33's host check: ours, then after eager SDPA calls, then after an SDPA
# graph capture.
set -u
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
timeout 120 python3 - <<'PY' 2>&1 | tee $OUT/hostprof.txt
import cProfile, io, pstats, statistics, time
import torch
import torch.nn.functional as F
from flashgen.kvcache import attention_with_kvcache
q = torch.randn(1, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, 4096, 1, 128, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
lens = torch.full((1,), 4096, device="cuda", dtype=torch.int32)
qs, ks, vs = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
ours = lambda: attention_with_kvcache(q, k, v, lens)
sdpa = lambda: F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)
def host(fn, n=2000):
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return round(statistics.median(ts) * 1e6, 2)
def prof(tag):
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(2000):
        ours()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
    print(f"==== profile {tag}\n" + s.getvalue()[-5000:])
def graph(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
        for _ in range(20):
            fn()
    g.replay()
    torch.cuda.synchronize()
    return g
print("ours fresh", host(ours), host(ours))
prof("fresh")
print("sdpa eager", host(sdpa))
print("ours after eager sdpa", host(ours), host(ours))
g1 = graph(ours)
print("ours after our own graph", host(ours), host(ours))
g2 = graph(sdpa)
print("ours after an sdpa graph", host(ours), host(ours))
prof("after an sdpa graph")
del g1, g2
torch.cuda.synchronize()
print("ours after the graphs are freed", host(ours), host(ours))
PY
