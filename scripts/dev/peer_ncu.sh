#!/usr/bin/env bash
# GPU host: ncu (locked base clock) of our wgmma forward and FA4's sm90 forward on the same
# (B, T, H, d) memory, on five bf16 bench cases, with L2 and L1 traffic counters.
#   bash scripts/dev/peer_ncu.sh OUT_DIR   (after scripts/fa4_install.sh part2 and source /tmp/fa4/env.sh)
# Prints one line per kernel (duration, SM and L2 throughput, L2 sectors); the details pages are
# OUT_DIR/<impl>-<case>.txt. Why: ours moved 1.5x FA4's L2 sectors at d = 128 non-causal for the
# same nominal K/V reads (bench/NOTES.md, ninth session).
set -uo pipefail
o=${1:?usage: peer_ncu.sh OUT_DIR}
mkdir -p "$o"
sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
  --section MemoryWorkloadAnalysis --section SchedulerStats --section LaunchStats"
want="lts__t_sectors lts__t_requests lts__t_sectors_srcunit_tex lts__t_sectors_srcunit_ltcfabric
  lts__t_sectors_op_read lts__t_sectors_op_write lts__t_sectors_srcunit_tex_op_read
  lts__t_sectors_srcunit_tex_op_write smsp__inst_executed l1tex__t_requests l1tex__t_sectors
  l1tex__t_sectors_pipe_lsu_mem_global_op_ld l1tex__t_sectors_pipe_lsu_mem_global_op_st
  l1tex__m_xbar2l1tex_read_sectors l1tex__m_l1tex2xbar_write_sectors"
# shellcheck source=scripts/dev/ncu_metrics.sh
source "$(dirname "$0")/ncu_metrics.sh"
# shellcheck disable=SC2086  # $want: one metric name a word
m=$(known_metrics "$o" $want)
prof() {  # tag impl kernel-regex d causal t
  ncu $sections ${m:+--metrics $m} -k regex:"$3" -s 1 -c 1 -o "$o/$1" \
    python3 scripts/dev/profile_impl.py "$2" "$4" "$5" "$6" > "$o/$1.log" 2>&1
  ncu --import "$o/$1.ncu-rep" --page details > "$o/$1.txt" 2>&1
  echo "$1: $(grep -E '^ +Duration ' "$o/$1.txt" | head -1 | awk '{print $NF, $(NF-1)}')," \
    "SM $(grep -E 'Compute \(SM\) Throughput' "$o/$1.txt" | head -1 | awk '{print $NF}')%," \
    "L2 $(grep -E 'L2 Cache Throughput' "$o/$1.txt" | head -1 | awk '{print $NF}')%," \
    "$(grep -E '^ +lts__t_sectors.sum ' "$o/$1.txt" | awk '{print $NF}') L2 sectors"
  rm -f "$o/$1.ncu-rep"
}
W=flash_fwd_wgmma
for c in "d128nc16k 128 0 16384 ${W}_d128_br128_bc128_bf16_noncausal_s2" \
         "d128nc4k 128 0 4096 ${W}_d128_br128_bc128_bf16_noncausal_s2" \
         "d64nc16k 64 0 16384 ${W}_d64_br192_bc128_bf16_noncausal_s2" \
         "d64c4k 64 1 4096 ${W}_d64_br192_bc128_bf16_causal_s2" \
         "d128c4k 128 1 4096 ${W}_d128_br128_bc128_bf16_causal_s2"; do
  set -- $c
  prof "ours-$1" "$5@bshd" flash_fwd_wgmma "$2" "$3" "$4"
  prof "fa4-$1" fa4 "cutlass|Sm90|flash_attn" "$2" "$3" "$4"
done
