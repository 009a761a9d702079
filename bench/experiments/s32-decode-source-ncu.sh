#!/bin/bash
# bench/experiments/s32-decode-source-ncu.sh: one GPU call (~1.5 min). Our decode kernel reads 1.5x the L2
# sectors SDPA reads for the same K/V (session 31; the extra all L2 hits), and two shared-memory
# layouts (swizzled, 32-byte pad) made it 2.0x -- so which instruction's requests carry the excess
# is not known. ncu's SourceCounters per SASS instruction (sectors, ideal sectors, excessive) of
# main's decode kernel on B8 Tk4k 32/8 and B1 Tk4k 8/1 -> $OUT/dsrc-*.txt
#   the details page (its "uncoalesced" tables name instructions and excess %), and the source
#   page as CSV (per-SASS-instruction counters), rows for LDGSTS / LDG / STG kept
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/dsrc-summary.txt"
for r in "b8tk4k 8 4096 32 8 1" "b1tk4k 1 4096 8 1 1"; do
  set -- $r
  timeout 150 ncu --section SourceCounters --section MemoryWorkloadAnalysis_Tables --nvtx --nvtx-include "timed/" \
    -o /tmp/dsrc-$1 python3 scripts/dev/profile_decode.py flashgen "$2" "$3" "$4" "$5" "$6" > /tmp/dsrc-$1.log 2>&1
  echo "ncu $1 rc=$?" | tee -a "$OUT/dsrc-summary.txt"
  ncu --import /tmp/dsrc-$1.ncu-rep --page details > "$OUT/dsrc-$1-details.txt" 2>&1
  ncu --import /tmp/dsrc-$1.ncu-rep --page source --csv --print-source sass > /tmp/dsrc-$1-source.csv 2>&1
  head -2 /tmp/dsrc-$1-source.csv > "$OUT/dsrc-$1-source.txt"
  grep -E "LDGSTS|LDG|STG|ATOM|RED" /tmp/dsrc-$1-source.csv >> "$OUT/dsrc-$1-source.txt"
  grep -i -E "excessive|uncoalesced|sectors" "$OUT/dsrc-$1-details.txt" | head -20 | tee -a "$OUT/dsrc-summary.txt"
done
