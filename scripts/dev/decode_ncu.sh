#!/usr/bin/env bash
# GPU host: ncu of flashgen's decode call and torch SDPA's on the same K/V, every kernel of one
# call (split and merge), on four decode_bench rows (bf16, d 128): the long-cache gap (B32
# Tk32k GQA 32/8 Tq1, ~0.92x SDPA) and the small ones (B1 Tk4k 8/1, B1 Tk32k 8/1, B8 Tk4k 32/8).
#   bash scripts/dev/decode_ncu.sh OUT_DIR
# One line per kernel: duration, DRAM throughput (% of peak), achieved occupancy, registers,
# grid; the details pages are OUT_DIR/<impl>-<row>.txt. Why: bench/NOTES.md, fifteenth session
# ("the remaining 7-8% on long caches ... ncu of both is the next measurement").
set -uo pipefail
o=${1:?usage: decode_ncu.sh OUT_DIR}
mkdir -p "$o"
sections="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
  --section WarpStateStats --section LaunchStats --section SchedulerStats"
prof() {  # tag impl b tk h h_kv tq
  ncu $sections --nvtx --nvtx-include "timed/" -o "$o/$1" \
    python3 scripts/dev/profile_decode.py "$2" "$3" "$4" "$5" "$6" "$7" > "$o/$1.log" 2>&1
  ncu --import "$o/$1.ncu-rep" --page details > "$o/$1.txt" 2>&1
  ncu --import "$o/$1.ncu-rep" --page raw --csv --metrics \
    gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size,launch__block_size \
    > "$o/$1.csv" 2>&1
  echo "== $1"; cut -c1-400 "$o/$1.csv" | sed -n '1p;3,$p'
  rm -f "$o/$1.ncu-rep"
}
for r in "b32tk32k-32-8 32 32768 32 8 1" "b1tk4k-8-1 1 4096 8 1 1" \
         "b1tk32k-8-1 1 32768 8 1 1" "b8tk4k-32-8 8 4096 32 8 1"; do
  set -- $r
  prof "ours-$1" flashgen "$2" "$3" "$4" "$5" "$6"
  prof "sdpa-$1" sdpa "$2" "$3" "$4" "$5" "$6"
done
