#!/bin/bash
# bench/experiments/s33b-combine-host.sh (carry .whl; ~3 min; the combine kernel applied to the
# tree, launches prepared once): 1. decode tests, 8 shards; 2. racecheck on the combine tests
# alone (the s33 run's 60 s limit cut the wider set); 3. eager host cost per call and graph GPU
# time, FLASHGEN_DECODE_COMBINE=0 vs 1, with torch SDPA's eager host cost on the same row.
set -u
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
t0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/combh-tests.txt
FLASHGEN_REQUIRE_GPU=1 timeout 150 bash scripts/dev/pytest_shards.sh 8 /tmp/combh-t \
  tests/gpu/test_decode.py tests/gpu/test_api_kvcache.py tests/gpu/test_kvappend.py >> $OUT/combh-tests.txt 2>&1
echo "tests rc=$? at $((SECONDS - t0)) s" | tee -a $OUT/combh-tests.txt
grep -E "^shard|FAILED|ERROR" $OUT/combh-tests.txt | tail -12
FLASHGEN_REQUIRE_GPU=1 timeout 200 compute-sanitizer --tool racecheck --error-exitcode 3 python3 -m pytest -q -x \
  -p no:cacheprovider tests/gpu/test_decode.py -k "combine" > /tmp/combh-race.txt 2>&1
echo "racecheck rc=$? at $((SECONDS - t0)) s" | tee -a $OUT/combh-tests.txt
grep -E "RACECHECK SUMMARY| passed| failed|Error:" /tmp/combh-race.txt | head -4 | tee -a $OUT/combh-tests.txt
timeout 60 python3 - <<'PY' 2>&1 | tee $OUT/combh-host.txt
import os, statistics, time
import torch
import torch.nn.functional as F
from flashgen import kvcache
from flashgen.kvcache import attention_with_kvcache
q = torch.randn(1, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, 4096, 1, 128, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
lens = torch.full((1,), 4096, device="cuda", dtype=torch.int32)
qs, ks, vs = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
def host(fn):
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(2000):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return statistics.median(ts) * 1e6
def graph(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
        for _ in range(20):
            fn()
    for _ in range(20):
        g.replay()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(200):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / 4000
res = {}
sdpa = lambda: F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)
ours = lambda: attention_with_kvcache(q, k, v, lens)
for rnd in range(3):
    for flag in ("0", "1"):
        os.environ["FLASHGEN_DECODE_COMBINE"] = flag
        kvcache.clear_cache()
        res.setdefault(flag, []).append((host(ours), graph(ours)))
    res.setdefault("sdpa", []).append((host(sdpa), graph(sdpa)))
for flag, v in res.items():
    print(f"{flag}: eager host us/call (median) {[round(x[0], 2) for x in v]}; "
          f"graph GPU us/call {[round(x[1], 3) for x in v]}")
PY
echo "done at $((SECONDS - t0)) s"
