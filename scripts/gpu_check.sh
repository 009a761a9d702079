#!/usr/bin/env bash
# The one command that reproduces flashgen's GPU evidence, on the GPU host:
#   scripts/gpu_check.sh OUTDIR [tests] [sanitize] [tune] [bench]     (default: all four)
# tests     the GPU tier (every shipped variant through the Hypothesis property suite, plus the
#           API tests), split over $JOBS processes on the one GPU; summary in gpu-suite.json
# sanitize  compute-sanitizer memcheck, racecheck, synccheck and initcheck on ragged problems
#           (one causal and one non-causal variant per family); summary lines in sanitize.txt
# tune      `flashgen tune`: the fastest mma variant per (d, dtype, causal) into the package's
#           tuning table (copied to OUTDIR)
# bench     `flashgen bench --plot` (docs/design.md protocol, torch SDPA peers) into OUTDIR
# The project must be importable (PYTHONPATH=checkout) with PyCUDA; see ../shared/gpu-host.
set -uo pipefail
out=${1:?usage: scripts/gpu_check.sh OUTDIR [tests] [sanitize] [tune] [bench]}
shift
stages=${*:-tests sanitize tune bench}
py=${PYTHON:-python3}
jobs=${JOBS:-8}
mkdir -p "$out"
summary=$out/summary.txt
export FLASHGEN_REQUIRE_GPU=1 FLASHGEN_HYPOTHESIS_PROFILE=${FLASHGEN_HYPOTHESIS_PROFILE:-ci}
status=0
note() { echo "$*" | tee -a "$summary"; }
note "flashgen gpu_check $(date -u +%FT%TZ) commit=${FLASHGEN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
note "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null)"

for stage in $stages; do
  t0=$(date +%s)
  case $stage in
  tests)
    # compile every variant once (in parallel) so the shards start from a warm cache
    $py -c "from flashgen.verify.checks import compile_all; from flashgen.generator.space import shipped; r = compile_all(shipped()); bad = [s.name for s, c in r.items() if isinstance(c, Exception)]; print(len(r), 'compiled;', len(bad), 'failed', bad[:3])" 2>&1 | tee "$out/compile.log"
    pids=()
    for i in $(seq 0 $((jobs - 1))); do
      FLASHGEN_GPU_SHARD=$i/$jobs FLASHGEN_GPU_SUMMARY=$out/gpu-suite-$i.json \
        $py -m pytest -q -p no:cacheprovider tests/gpu >"$out/pytest-gpu-$i.log" 2>&1 &
      pids+=($!)
    done
    rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    # the wgmma variants again on a GPU played as 3 SMs: small problems take the persistent grid
    pids=()
    for i in $(seq 0 $((jobs - 1))); do
      FLASHGEN_SM_LIMIT=3 FLASHGEN_GPU_SHARD=$i/$jobs \
        $py -m pytest -q -p no:cacheprovider tests/gpu/test_property.py -k wgmma >"$out/pytest-gpu-persistent-$i.log" 2>&1 &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    [ $rc = 0 ] || status=1
    $py scripts/merge_gpu_summaries.py "$out" | tee -a "$summary"
    grep -h -E "^(FAILED|ERROR)" "$out"/pytest-gpu-*.log | head -20 | tee -a "$summary"
    tail -qn1 "$out"/pytest-gpu-*.log | tee -a "$summary"
    note "tests: rc=$rc"
    ;;
  sanitize)
    : >"$out/sanitize.txt"
    for tool in memcheck racecheck synccheck initcheck; do
      compute-sanitizer --tool $tool --error-exitcode 3 $py scripts/sanitize_cases.py >"$out/sanitize-$tool.log" 2>&1
      rc=$?
      [ $rc = 0 ] || status=1
      line=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/sanitize-$tool.log" | tail -n1)
      fails=$(grep -c FAIL "$out/sanitize-$tool.log")
      note "sanitize $tool: rc=$rc ${line:-no summary line} (check failures: $fails)" | tee -a "$out/sanitize.txt" >/dev/null
    done
    ;;
  tune)
    $py -m flashgen tune 2>&1 | tee "$out/tune.log" || status=1
    cp flashgen/tuning/*.json "$out/" 2>/dev/null
    ;;
  bench)
    $py -m flashgen bench --plot --out "$out" 2>&1 | tee "$out/bench.log" || status=1
    ;;
  *)
    echo "unknown stage $stage (tests, sanitize, tune, bench)" >&2
    exit 2
    ;;
  esac
  note "stage $stage: $(( $(date +%s) - t0 )) s"
done
note "gpu_check status=$status"
exit $status
