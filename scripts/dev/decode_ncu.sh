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
# L2 traffic by outcome: the long row's 34% L2 hits on a pure stream (SDPA: 2%; session 30) --
# which reads hit, and do DRAM bytes exceed K + V?
want="dram__bytes_read lts__t_requests_srcunit_tex_op_read lts__t_sectors_srcunit_tex_op_read
  lts__t_sectors_srcunit_tex_op_read_lookup_hit lts__t_sectors_srcunit_tex_op_read_lookup_miss
  lts__t_sectors_srcunit_tex_op_write l1tex__m_xbar2l1tex_read_sectors"
# shellcheck source=scripts/dev/ncu_metrics.sh
source "$(dirname "$0")/ncu_metrics.sh"
# shellcheck disable=SC2086  # $want: one metric name a word
m=$(known_metrics "$o" $want)
prof() {  # tag impl b tk h h_kv tq
  ncu $sections ${m:+--metrics $m} --nvtx --nvtx-include "timed/" -o "$o/$1" \
    python3 scripts/dev/profile_decode.py "$2" "$3" "$4" "$5" "$6" "$7" > "$o/$1.log" 2>&1
  ncu --import "$o/$1.ncu-rep" --page details > "$o/$1.txt" 2>&1
  ncu --import "$o/$1.ncu-rep" --page raw --csv --metrics \
    gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size,launch__block_size \
    > "$o/$1.csv" 2>&1
  echo "== $1"; cut -c1-400 "$o/$1.csv" | sed -n '1p;3,$p'
  grep -E "^ +(dram__|lts__|l1tex__)" "$o/$1.txt"
  rm -f "$o/$1.ncu-rep"
}
for r in "b32tk32k-32-8 32 32768 32 8 1" "b1tk4k-8-1 1 4096 8 1 1" \
         "b1tk32k-8-1 1 32768 8 1 1" "b8tk4k-32-8 8 4096 32 8 1"; do
  set -- $r
  prof "ours-$1" flashgen "$2" "$3" "$4" "$5" "$6"
  prof "sdpa-$1" sdpa "$2" "$3" "$4" "$5" "$6"
done
