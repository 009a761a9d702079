#!/bin/bash
# bench/experiments/s33-decode-combine-run.sh (carry .whl; ~5.5 min): decode-combine-kernel.patch --
# on sm_90 a decode call with splits launches the decode kernel with counters = NULL (its blocks
# store their split's O/LSE and leave: no fence, no counter, no last-block serial merge) and then
# the variant's merge kernel <name>_combine (a block per packed row) as a programmatic dependent;
# FLASHGEN_DECODE_COMBINE=0 keeps the in-kernel merge. 1. decode tests (test_decode with the new
# combine-vs-in-kernel tests, test_api_kvcache, test_kvappend), 8 shards; 2. memcheck + racecheck
# on the oracle/graph/out-of-range/combine tests; 3. one tree's eager host cost and graph time per
# call, FLASHGEN_DECODE_COMBINE=0 vs 1; 4. 3 interleaved A/B rounds (base = in-kernel merge).
set -u
P=bench/experiments/decode-combine-kernel.patch
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/comb-tests.txt
FLASHGEN_REQUIRE_GPU=1 timeout 120 bash scripts/dev/patch_run.sh comb $P -- bash scripts/dev/pytest_shards.sh 8 /tmp/comb-t \
  tests/gpu/test_decode.py tests/gpu/test_api_kvcache.py tests/gpu/test_kvappend.py >> $OUT/comb-tests.txt 2>&1
rc=$?; echo "tests rc=$rc at $((SECONDS - t0)) s" | tee -a $OUT/comb-tests.txt
grep -E "^shard|FAILED|ERROR" $OUT/comb-tests.txt | tail -12
[ $rc -eq 0 ] || { tar czf $OUT/comb-raw.tgz /tmp/comb-t* 2>/dev/null; exit 1; }
for tool in memcheck racecheck; do
  FLASHGEN_REQUIRE_GPU=1 timeout 60 bash scripts/dev/patch_run.sh comb $P -- compute-sanitizer --tool $tool \
    --error-exitcode 3 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_decode.py \
    -k "oracle or graph or out_of_range or combine" > /tmp/comb-$tool.txt 2>&1
  echo "$tool rc=$? at $((SECONDS - t0)) s" | tee -a $OUT/comb-tests.txt
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY| passed| failed|Error:" /tmp/comb-$tool.txt | head -4 | tee -a $OUT/comb-tests.txt
done
# one tree, both merges: eager host time of one call (perf_counter around the call, no sync) and
# the GPU time per call in a CUDA graph of 20 calls; B=1, Tk=4096, 8/1 heads, Tq=1 (16 splits)
timeout 40 bash scripts/dev/patch_run.sh comb $P -- python3 - <<'PY' 2>&1 | tee $OUT/comb-host.txt
import os, statistics, time
import torch
from flashgen import kvcache
from flashgen.kvcache import attention_with_kvcache
q = torch.randn(1, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, 4096, 1, 128, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
lens = torch.full((1,), 4096, device="cuda", dtype=torch.int32)
res = {}
for rnd in range(3):
    for flag in ("0", "1"):
        os.environ["FLASHGEN_DECODE_COMBINE"] = flag
        kvcache.clear_cache()
        for _ in range(100):
            attention_with_kvcache(q, k, v, lens)
        torch.cuda.synchronize()
        ts = []
        for _ in range(2000):
            t = time.perf_counter()
            attention_with_kvcache(q, k, v, lens)
            ts.append(time.perf_counter() - t)
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
            for _ in range(20):
                attention_with_kvcache(q, k, v, lens)
        for _ in range(20):
            g.replay()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(200):
            g.replay()
        b.record()
        torch.cuda.synchronize()
        res.setdefault(flag, []).append((statistics.median(ts) * 1e6, a.elapsed_time(b) * 1e3 / 4000))
for flag, v in res.items():
    print(f"FLASHGEN_DECODE_COMBINE={flag}: eager host us/call (median) "
          f"{[round(x[0], 2) for x in v]}; graph GPU us/call {[round(x[1], 3) for x in v]}")
PY
echo "host timing at $((SECONDS - t0)) s" | tee -a $OUT/comb-tests.txt
ROWS="1,4096,8,1,1;1,32768,8,1,1;1,4096,32,8,1;8,4096,32,8,1;32,32768,32,8,1;8,32768,8,1,4"
ROWS=$ROWS OUT=/tmp/dab timeout $((330 - (SECONDS - t0))) bash scripts/dev/decode_ab.sh 3 $P | tee $OUT/comb-ab.txt
echo "done at $((SECONDS - t0)) s"
