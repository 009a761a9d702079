#!/usr/bin/env bash
# GPU host: set FA4's sm90 forward beside ours on bench cases, to find where the gap comes from.
#   bash scripts/dev/peer_compare.sh OUT_DIR  (after scripts/fa4_install.sh part2; FA4 on PYTHONPATH)
# 1. power_probe.py: throughput, SM clock and board power per implementation, interleaved
#    (d128 non-causal and causal, d64 non-causal, T 16384, bf16); FA4's cubin and SASS are kept
#    in OUT/fa4dump (CUTE_DSL_KEEP: PTX and cubin; its SASS dump needs nvdisasm >= 13.4) for reading on the CPU machine.
# 2. ncu at locked base clocks, one launch each of ours and FA4's (d128 non-causal 16k): speed
#    of light, memory workload (L2 sectors by source), warp states, scheduler, instruction mix,
#    per-instruction stall samples (the
#    source page as CSV of SASS).
set -uo pipefail
out=${1:?usage: peer_compare.sh OUT_DIR}
mkdir -p "$out/fa4dump"
export CUTE_DSL_KEEP=ptx,cubin CUTE_DSL_DUMP_DIR="$out/fa4dump"
d128=flash_fwd_wgmma_d128_br128_bc128_bf16_noncausal_s2
d128c=flash_fwd_wgmma_d128_br128_bc128_bf16_causal_s2
d64=flash_fwd_wgmma_d64_br192_bc128_bf16_noncausal_s2
python3 scripts/dev/power_probe.py "$out/power-d128.json" $d128 fa4 --d 128 --rounds 2 2>&1 | grep -v Warning
python3 scripts/dev/power_probe.py "$out/power-d128c.json" $d128c fa4 --d 128 --causal --rounds 2 2>&1 | grep -v Warning
python3 scripts/dev/power_probe.py "$out/power-d64.json" $d64 fa4 --d 64 --rounds 2 2>&1 | grep -v Warning
sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section MemoryWorkloadAnalysis \
  --section SchedulerStats --section InstructionStats --section SourceCounters --section LaunchStats"
# both read the same (B, T, H, d) memory (FA4's layout; ours through a (B, H, T, d) view)
ncu $sections -k regex:flash_fwd_wgmma -s 1 -c 1 -o "$out/ours" \
  python3 scripts/dev/profile_impl.py "$d128@bshd" 128 0 16384 > "$out/ncu-ours.log" 2>&1
ncu $sections -k regex:"cutlass|Sm90|flash_attn" -s 1 -c 1 -o "$out/fa4" \
  python3 scripts/dev/profile_impl.py fa4 128 0 16384 > "$out/ncu-fa4.log" 2>&1
for r in ours fa4; do
  [ -f "$out/$r.ncu-rep" ] || { echo "$r: no report"; tail -5 "$out/ncu-$r.log"; continue; }
  ncu --import "$out/$r.ncu-rep" --page details > "$out/$r-details.txt" 2>&1
  ncu --import "$out/$r.ncu-rep" --page source --csv --print-source sass > "$out/$r-sass.csv" 2>&1 \
    || echo "$r: source page export failed: $(head -3 "$out/$r-sass.csv")"
  grep -E "SM Frequency|Duration|Compute \(SM\) Throughput|Executed Ipc Active|Issue Slots Busy|No Eligible|Registers Per|Warp Cycles Per Issued" \
    "$out/$r-details.txt" | sed "s/^/$r: /"
done
