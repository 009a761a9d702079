#!/bin/bash
# bench/experiments/s32-decode-cluster-run.sh: one GPU call (~6-7 min; its timeouts add to 9.75) for
# decode-cluster-merge.patch (issue 26's small decode rows: a fixed ~9 us against cuDNN's ~7 us).
# Session 31's timeline (H100, B1 Tk4k 8/1, 16 blocks w8 s2): of a block's ~16k cycles ~6.3k
# are the split protocol -- fence + counter 1650, then the last block's merge of 16 splits from
# L2 4670. The patch launches a row tile's 2..16 splits as one thread-block cluster on sm_90
# (over 8: the non-portable size, allowed per kernel; only when the GPU holds every cluster of
# the launch at once: cuOccupancyMaxActiveClusters) and merges them through distributed shared
# memory: each block leaves its split's O and LSE in its own shared memory, one cluster barrier,
# then every block merges a slice of the row tile's (row, 8 columns) items reading the others'
# results (mapa + ld.shared::cluster), stores, and waits at a second barrier before it exits.
# No scratch, fence or counter on that path; 17+ splits and GPUs before sm_90 keep the scratch.
#   1. tests/gpu/test_decode.py (with the patch's test_a_cluster_merge_gives_the_scratch_merges_
#      answer: clusters of 2/5/8/16 against the scratch path on NaN, empty, no-key and padded
#      rows), test_api_kvcache.py, test_kvappend.py on the patched tree, 8 shards; a failure
#      stops the script -> $OUT/cl-tests.txt
#   2. memcheck + racecheck (the DSMEM reads against the two cluster barriers) of that test and
#      the CUDA-graph test (clusters of 8 captured and replayed) -> $OUT/cl-tests.txt
#   3. 3 interleaved rounds of scripts/dev/decode_ab.sh on six rows -> $OUT/cl-ab.txt (x =
#      patched / base), then per row the patched tree's launch: variant, grid, cluster size (1:
#      none) and the clusters of grid-x blocks the GPU holds at once. Expected on an H100:
#      clusters on B1 Tk4k 8/1 (one of 16), B1 Tk4k 32/8 (8 of 16 blocks of one SM each: only
#      if every GPC has 16 SMs free) and B8 Tk4k 32/8 (64 of 4, two blocks an SM: if they all
#      fit); none on B1 Tk32k (128 splits), B32 Tk32k (1 split), B8 Tk32k 8/1 Tq4 (30+
#      splits). If the rows of 16-block clusters lose, rerun with DECODE_CLUSTER_MAX = 8.
#   4. the patched kernel's decode timeline (decode-timeline.patch applies over it, its mark 6
#      with fuzz 2 right after the split's result is written, to the scratch or to shared
#      memory; three marks added here in the cluster branch, so its stages read there: wmerge =
#      the split's result into shared memory, count = the first cluster barrier, gmerge = the
#      slice merge from the cluster's shared memory, count2 = the stores and the exit barrier) on
#      B1 Tk4k 8/1, B1 Tk4k 32/8, B8 Tk4k 32/8 -> $OUT/cl-timeline.txt, .json. Main's numbers:
#      bench/results/nvidia-h100-2026-12-06-s31-decode-timeline.txt (count 1654 + gmerge 4670).
#      Mark 6's global stores sit just before the first barrier's release (a MEMBAR.ALL.GPU),
#      so "count" includes their drain: read it as an upper bound.
set -u
mkdir -p /tmp/dab
P=bench/experiments/decode-cluster-merge.patch
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$SECONDS
FLASHGEN_REQUIRE_GPU=1 timeout 170 bash scripts/dev/patch_run.sh cl $P -- bash scripts/dev/pytest_shards.sh 8 /tmp/clt \
  tests/gpu/test_decode.py tests/gpu/test_api_kvcache.py tests/gpu/test_kvappend.py > "$OUT/cl-tests.txt" 2>&1
rc=$?
echo "tests rc=$rc at $((SECONDS - t0)) s"; grep -E "^shard|^(FAILED|ERROR)" "$OUT/cl-tests.txt" | tail -10
[ $rc -eq 0 ] || exit 1
if command -v compute-sanitizer >/dev/null 2>&1; then
  for tool in memcheck racecheck; do
    FLASHGEN_REQUIRE_GPU=1 timeout $([ $tool = memcheck ] && echo 75 || echo 90) bash scripts/dev/patch_run.sh cl $P -- compute-sanitizer --tool $tool \
      --error-exitcode 3 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_decode.py -k "cluster_merge or graph" \
      >> "$OUT/cl-tests.txt" 2>&1
    echo "$tool rc=$? at $((SECONDS - t0)) s"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY| passed| failed" "$OUT/cl-tests.txt" | tail -2
  done
fi
ROWS="1,4096,8,1,1;1,32768,8,1,1;1,4096,32,8,1;8,4096,32,8,1;32,32768,32,8,1;8,32768,8,1,4"
ROWS=$ROWS OUT=/tmp/dab timeout 150 bash scripts/dev/decode_ab.sh 3 $P | tee "$OUT/cl-ab.txt"  # its JSON and logs stay there
echo "A/B at $((SECONDS - t0)) s"
timeout 30 bash scripts/dev/patch_run.sh cl $P -- python3 - "$ROWS" <<'PY' 2>&1 | tee -a "$OUT/cl-ab.txt"
import sys

import torch

from flashgen import kvcache

print("row (B,Tk,H,H_kv,Tq): the patched launch (bf16 d128, cache_seqlens given)")
for row in sys.argv[1].split(";"):
    b, tk, h, h_kv, tq = (int(x) for x in row.split(","))
    q = torch.randn(b, tq, h, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, tk, h_kv, 128, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((b,), tk, device="cuda", dtype=torch.int32)
    kvcache._entries.clear()
    kvcache.attention_with_kvcache(q, k, k, lens)
    (entry,) = kvcache._entries.values()
    launch = entry.launch
    n = launch.grid[0]
    held = launch.plan.active_clusters(launch.grid, n) if 2 <= n <= 16 else "-"
    print(f"{row:<18} {launch.plan.spec.name} grid {launch.grid} cluster {launch.cluster}"
          f" clusters of {n} held at once: {held}")
PY
# the timeline's marks in the cluster branch (after decode-timeline.patch; anchors: the
# patch's comments on its barrier halves)
tl_marks() {
  sed -i -e 's@^    cluster_wait();    // every split.s result is in its block.s shared memory@&\n    TL(7);  // cluster: past the barrier@' \
    -e 's@^    cluster_arrive();  // this thread.s reads of the other blocks are done@    TL(8);  // cluster: the slice merged\n&@' \
    -e 's@^    cluster_wait();  // no block leaves while another may still read its shared memory@&\n    TL(9);  // cluster: stored, past the exit barrier@' \
    flashgen/templates/mma_decode.cu.j2
  [ "$(grep -c 'TL([789]);  // cluster' flashgen/templates/mma_decode.cu.j2)" = 3 ] || { echo "tl_marks: anchors not found"; return 1; }
}
export -f tl_marks
timeout 70 bash scripts/dev/patch_run.sh cltl $P bench/experiments/decode-timeline.patch -- bash -c \
  "tl_marks && python3 scripts/dev/decode_timeline.py $OUT/cl-timeline.json 1,4096,8,1 1,4096,32,8 8,4096,32,8" \
  > "$OUT/cl-timeline.txt" 2>&1
echo "timeline rc=$? at $((SECONDS - t0)) s"; tail -40 "$OUT/cl-timeline.txt"
echo "done at $((SECONDS - t0)) s"
