#!/usr/bin/env bash
# flashgen's GPU evidence, in one command on the GPU host:
#   scripts/gpu_check.sh OUTDIR [STAGE ...]
# Without STAGEs it runs the default ones, the standard evidence:  tests sanitize bundles tune bench
# On request (slower, or for one question):                        robustness trust wgmma-bwd sass
#
# tests       the GPU tier (every shipped variant through the Hypothesis property suite, plus the
#             API, backward, torch, CuPy, long-K/V and robustness tests), split over $JOBS processes
#             on the one GPU, then the wgmma property tests again as a 3-SM GPU
#             (FLASHGEN_SM_LIMIT=3: small problems take the persistent grid); gpu-suite.json
# sanitize    compute-sanitizer memcheck, racecheck, synccheck and initcheck on ragged problems
#             (scripts/sanitize_cases.py: 12 variants of every family, causal and not), and
#             memcheck, racecheck and synccheck on the wgmma backward (scripts/bwd_sanitize.py: a
#             short problem, one whose 20 steps per block wrap the Q/dO ring, two feature cases);
#             one line per run in sanitize.txt
# bundles     C bundles written by `flashgen bundle` / `flashgen build --bundle`, configured and
#             built with plain CMake + nvcc for sm_90 (FLASHGEN_CUDA_ARCHITECTURES, default
#             90-real; wgmma kernels always sm_90a), each `example` run against its float64 CPU
#             reference (it also checks that bad parameters are refused), and the multi, wgmma,
#             features, bwd and bwd-wgmma examples under memcheck, bwd-wgmma under racecheck too.
#             BUNDLES picks (default "multi single wgmma features bwd bwd-wgmma"):
#               multi      a simt variant (fp32, non-causal) beside an mma one (bf16, causal)
#               single     `flashgen build --bundle`: one mma variant (fp16, non-causal)
#               wgmma      `--family wgmma`: bf16, d 64 and 128, causal and not (TMA maps built
#                          through the driver entry point at run time)
#               features   wgmma bf16 d 128 causal: plain, window, softcap+alibi (dispatch by the
#                          features the params use)
#               bwd        mma backward bf16 d 64 causal beside its forward partner, mma fp16
#                          d 128 non-causal alone (O, LSE from the CPU), and a one-variant
#                          `flashgen build --direction bwd --bundle`
#               bwd-wgmma  wgmma backward bf16 d 128 non-causal beside its wgmma forward, fp16 d 64
#                          causal alone (Tq 77/131/65: the padded 64-row scratch; Tq > Tk rows
#                          that see no key)
#             Needs nvcc and cmake, not PyCUDA; log in bundles/bundle.txt (last line PASS or FAIL)
# tune        `flashgen tune`: the fastest variant per (d, dtype, causal) into the package's
#             tuning table (copied to OUTDIR)
# bench       `flashgen bench --plot` (docs/design.md protocol, torch SDPA peers; FA4 too when
#             it imports: scripts/fa4_stage.sh) into OUTDIR
# robustness  (issue 6) tests/gpu/test_robustness.py on its own: NaN/inf inputs against the
#             float64 oracle, extreme scales, more than 2**31 elements in one tensor, ten
#             bitwise-equal runs; then scripts/largest_t.py: the longest K/V one launch handles
#             (d 128 bf16, every query row checked; fills the GPU's memory) -> robustness/
# trust       (issue 9) real CuPy arrays (tests/gpu/test_cai.py; skipped without cupy) and 4k-32k
#             keys (tests/gpu/test_long.py), then the property suite under the `thorough` profile
#             on the subset that failed in issue 9 plus a slice of every other family
#             (TRUST_K: the -k filter; TRUST_EXAMPLES: random problems per variant, 40), sharded
#             over $JOBS processes -> trust/ (trust-summary.json, gpu-suite.json, junit XML)
# wgmma-bwd   the wgmma backward on its own: tests/gpu/test_backward.py -k wgmma (the oracle
#             probes), tests/gpu/test_torch_backward.py (autograd, sm_90's default wgmma
#             backward), and scripts/bwd_sweep.py: TFLOP/s of the wgmma backward tiles beside
#             the mma one and SDPA's FA2 (bf16, d 64/128, causal and not, T 4096/16384)
#             -> wgmma-bwd/ (its sanitizer runs are in `sanitize`)
# sass        scripts/sass_compare.py: every shipped variant's SASS (forward and backward, every
#             arch) from the base tree SASS_BASE (a flashgen checkout) and from this one,
#             compared (identical or not); SASS_JOBS compiles at a time (default: nproc),
#             SASS_FAMILY limits it to one family; the dumps are kept in sass/ only with
#             SASS_KEEP=1. Needs nvcc and cuobjdump, no GPU -> sass/
#
# Every stage appends `stage NAME: PASS|FAIL (rc=N), S s` and a few detail lines to
# OUTDIR/summary.txt; the exit status is 0 only when every stage passed (2: a usage error).
# Environment: PYTHON (python3), JOBS (8: pytest processes, build jobs), FLASHGEN_COMMIT,
# FLASHGEN_HYPOTHESIS_PROFILE (ci); per stage as above. Runs from any directory: it works in the
# checkout holding this script and puts it first on PYTHONPATH; PyCUDA must be importable (see
# ../shared/gpu-host), and CuPy for `trust`.
# shellcheck disable=SC2317  # the stage_* functions are called by name
set -uo pipefail
default_stages="tests sanitize bundles tune bench"
all_stages="$default_stages robustness trust wgmma-bwd sass"
usage="usage: scripts/gpu_check.sh OUTDIR [STAGE ...]  (stages: $all_stages)"
if [ $# -lt 1 ]; then
  echo "$usage" >&2
  exit 2
fi
out=$1
shift
stages=${*:-$default_stages}
for stage in $stages; do
  case " $all_stages " in
  *" $stage "*) ;;
  *)
    echo "unknown stage $stage; $usage" >&2
    exit 2
    ;;
  esac
done
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$out" || exit 2
out="$(cd "$out" && pwd)" || exit 2
cd "$root" || exit 2
py=${PYTHON:-python3}
jobs=${JOBS:-8}
summary=$out/summary.txt
tmp="$(mktemp -d "${TMPDIR:-/tmp}/flashgen-gpu-check.XXXXXX")" || exit 2
trap 'rm -rf "$tmp"' EXIT
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export FLASHGEN_REQUIRE_GPU=1 FLASHGEN_HYPOTHESIS_PROFILE=${FLASHGEN_HYPOTHESIS_PROFILE:-ci}
note() { echo "$*" | tee -a "$summary"; }
last() { grep -v '^[[:space:]]*$' "$1" 2>/dev/null | tail -n1; } # a log's last non-blank line
# `wait` for every pid given; 1 when any exited nonzero
wait_all() {
  local p rc=0
  for p in "$@"; do wait "$p" || rc=1; done
  return "$rc"
}
# run CMD under compute-sanitizer TOOL into LOG; print one line: rc, the tool's summary line
sanitized() {
  local tool=$1 log=$2 rc
  shift 2
  compute-sanitizer --tool "$tool" --error-exitcode 3 "$@" >"$log" 2>&1
  rc=$?
  echo "rc=$rc $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -n1)"
  return "$rc"
}

stage_tests() {
  local i rc=0 pids=()
  # compile every variant once (in parallel) so the shards start from a warm cache
  "$py" -c "from flashgen.verify.checks import compile_all; from flashgen.generator.space import shipped; r = compile_all(shipped()); bad = [s.name for s, c in r.items() if isinstance(c, Exception)]; print(len(r), 'compiled;', len(bad), 'failed', bad[:3])" 2>&1 | tee "$out/compile.log"
  for i in $(seq 0 $((jobs - 1))); do
    FLASHGEN_GPU_SHARD=$i/$jobs FLASHGEN_GPU_SUMMARY=$out/gpu-suite-$i.json \
      "$py" -m pytest -q -p no:cacheprovider tests/gpu >"$out/pytest-gpu-$i.log" 2>&1 &
    pids+=($!)
  done
  wait_all "${pids[@]}" || rc=1
  # the wgmma variants again on a GPU played as 3 SMs: small problems take the persistent grid
  pids=()
  for i in $(seq 0 $((jobs - 1))); do
    FLASHGEN_SM_LIMIT=3 FLASHGEN_GPU_SHARD=$i/$jobs \
      "$py" -m pytest -q -p no:cacheprovider tests/gpu/test_property.py -k wgmma >"$out/pytest-gpu-persistent-$i.log" 2>&1 &
    pids+=($!)
  done
  wait_all "${pids[@]}" || rc=1
  "$py" scripts/merge_gpu_summaries.py "$out" | tee -a "$summary"
  grep -h -E "^(FAILED|ERROR)" "$out"/pytest-gpu-*.log | head -20 | tee -a "$summary"
  for i in "$out"/pytest-gpu-*.log; do note "${i##*/}: $(last "$i")"; done
  return "$rc"
}

# the wgmma backward's sanitizer cases (scripts/bwd_sanitize.py patterns): a short problem, one
# whose 20 steps per block wrap the Q/dO ring, two feature cases, d 96 (run at 128), and the
# deterministic mode (its semaphores after the dQ accumulator) at d 128 and d 64
BWD_SANITIZE_CASES=(
  "wgmma_d128_br64_bc128_bf16_noncausal_s2&B2H2kv2q97k131"
  "wgmma_d128_br64_bc128_bf16_noncausal_s2&B1H8kv2q257k129"
  "wgmma_d128&window_softcap&257"
  "wgmma_d64&alibi&257"
  "wgmma_d96_br64_bc128_bf16_causal_s2&B1H8kv2q257k129"
  "wgmma_d128_br64_bc128_bf16_noncausal_deterministic_s2&B1H8kv2q257k129"
  "wgmma_d64_br64_bc128_bf16_causal_deterministic_s3&B1H8kv2q257k129"
)

stage_sanitize() {
  local tool line fails rc=0
  : >"$out/sanitize.txt"
  for tool in memcheck racecheck synccheck initcheck; do
    line=$(sanitized "$tool" "$out/sanitize-$tool.log" "$py" scripts/sanitize_cases.py) || rc=1
    fails=$(grep -c FAIL "$out/sanitize-$tool.log")
    note "sanitize $tool: $line (check failures: $fails)" >>"$out/sanitize.txt"
  done
  # outside pytest: compute-sanitizer crashed on test_backward.py's parallel-compile fixture
  for tool in memcheck racecheck synccheck initcheck; do  # initcheck: every scratch column zeroed
    line=$(sanitized "$tool" "$out/sanitize-bwd-$tool.log" "$py" scripts/bwd_sanitize.py \
      "${BWD_SANITIZE_CASES[@]}") || rc=1
    fails=$(grep -E "^[0-9]+ passed, [0-9]+ failed" "$out/sanitize-bwd-$tool.log" | tail -n1)
    note "sanitize bwd $tool: $line (${fails:-no case summary})" >>"$out/sanitize.txt"
  done
  return "$rc"
}

# ---- bundles ------------------------------------------------------------------------------------
SIMT=flash_fwd_simt_d64_br32_bc32_fp32_noncausal
MMA=flash_fwd_mma_d128_br128_bc64_bf16_causal_w4_s1
# the backward bundle: a backward variant with its forward partner, and one without
BWD=flash_bwd_mma_d64_br64_bc64_bf16_causal_w4_s2
BWD_FWD=flash_fwd_mma_d64_br128_bc64_bf16_causal_w4_s2
BWD_ALONE=flash_bwd_mma_d128_br64_bc64_fp16_noncausal_w4_s1
# the wgmma backward bundle: the same pattern (Tq = 77, 131 and 65 are not multiples of the
# 64-row query tile, so the padded scratch rows are exercised; the causal one has Tq > Tk rows
# that see no key)
BWD_WGMMA=flash_bwd_wgmma_d128_br64_bc128_bf16_noncausal_s2
BWD_WGMMA_FWD=flash_fwd_wgmma_d128_br128_bc128_bf16_noncausal_s2
BWD_WGMMA_ALONE=flash_bwd_wgmma_d64_br64_bc128_fp16_causal_s3

stage_bundles() {
  local dir=$out/bundles work=$tmp/bundles archs=${FLASHGEN_CUDA_ARCHITECTURES:-90-real}
  local bundles=" ${BUNDLES:-multi single wgmma features bwd bwd-wgmma} " log nvcc name
  local failures=()
  mkdir -p "$dir" "$work"
  log=$dir/bundle.txt
  : >"$log"
  want() { [[ "$bundles" == *" $1 "* ]]; }
  say() { echo "$*" | tee -a "$log"; }
  # step NAME CMD...: run CMD with its output in the log; a failure is recorded, not fatal
  step() {
    local name=$1 start=$SECONDS rc=0
    shift
    say "==> $name: $*"
    "$@" >>"$log" 2>&1 || rc=$?
    say "<== $name: rc=$rc, $((SECONDS - start)) s"
    [ "$rc" -eq 0 ] || failures+=("$name (rc=$rc)")
  }
  build_and_run() { # build_and_run NAME DIR: configure, build, run the example
    local name=$1 dir=$2
    step "$name configure" cmake -S "$dir" -B "$dir/build" -DCMAKE_CUDA_COMPILER="$nvcc" \
      -DFLASHGEN_CUDA_ARCHITECTURES="$archs"
    step "$name build" cmake --build "$dir/build" -j "$jobs"
    if [ -x "$dir/build/example" ]; then
      step "$name example" "$dir/build/example"
    else
      say "$name: no example binary"
      failures+=("$name example (not built)")
    fi
  }
  sanitize_example() { # sanitize_example TOOL NAME: the NAME bundle's example under TOOL
    local tool=$1 name=$2
    if command -v compute-sanitizer >/dev/null 2>&1 && [ -x "$work/$name/build/example" ]; then
      step "$name $tool" compute-sanitizer --tool "$tool" --error-exitcode 3 \
        "$work/$name/build/example"
    else
      say "$name $tool: skipped (no compute-sanitizer or no example)"
    fi
  }

  nvcc=$("$py" -c "from flashgen.generator.nvcc import find_nvcc; print(find_nvcc())" 2>>"$log") || {
    note "bundles: flashgen finds no nvcc (see $log)"
    return 1
  }
  say "nvcc: $nvcc ($("$nvcc" --version | grep release || true)); cmake: $(cmake --version | head -n1)"
  if want multi; then
    step "write multi" "$py" -m flashgen bundle "$work/multi" --name "$SIMT" --name "$MMA"
    build_and_run multi "$work/multi"
  fi
  if want single; then
    step "write single" "$py" -m flashgen build --family mma --d 64 --dtype fp16 --no-causal \
      --no-compile --bundle "$work/single"
    build_and_run single "$work/single"
  fi
  if want wgmma; then
    step "write wgmma" "$py" -m flashgen bundle "$work/wgmma" --family wgmma --d 64 --d 128
    if grep -q "add_library(flashgen_kernels_sm90a OBJECT" "$work/wgmma/CMakeLists.txt" 2>/dev/null; then
      build_and_run wgmma "$work/wgmma"
    else
      say "wgmma: the bundle holds no sm_90a object library"
      failures+=("wgmma bundle (no wgmma variant)")
    fi
  fi
  if want features; then
    step "write features" "$py" -m flashgen bundle "$work/features" --family wgmma --d 128 \
      --causal --features window --features softcap,alibi
    build_and_run features "$work/features"
  fi
  if want bwd; then
    step "write bwd" "$py" -m flashgen bundle "$work/bwd" --name "$BWD" --name "$BWD_FWD" \
      --name "$BWD_ALONE"
    build_and_run bwd "$work/bwd"
    step "write bwd-single" "$py" -m flashgen build --family mma --d 64 --dtype fp16 --causal \
      --direction bwd --no-compile --bundle "$work/bwd-single"
    build_and_run bwd-single "$work/bwd-single"
  fi
  if want bwd-wgmma; then
    step "write bwd-wgmma" "$py" -m flashgen bundle "$work/bwd-wgmma" --name "$BWD_WGMMA" \
      --name "$BWD_WGMMA_FWD" --name "$BWD_WGMMA_ALONE"
    build_and_run bwd-wgmma "$work/bwd-wgmma"
  fi
  for name in multi wgmma features bwd bwd-wgmma; do
    want "$name" && sanitize_example memcheck "$name"
  done
  # the wgmma backward's producer/consumer ring and its shared-memory dQ staging: racecheck too
  want bwd-wgmma && sanitize_example racecheck bwd-wgmma

  # the examples' verdict lines, then ours
  grep -E "^(PASS|FAIL)|FAIL$|ERROR SUMMARY" "$log" | sed 's/^/  /' || true
  if [ "${#failures[@]}" -eq 0 ]; then
    say "PASS: bundles (${bundles# }: multi = $SIMT + $MMA; single = mma d64 fp16" \
      "non-causal; wgmma = d64/d128 bf16 causal + non-causal for sm_90a; features = wgmma d128" \
      "bf16 causal plain, window, softcap+alibi; bwd = $BWD + $BWD_FWD + $BWD_ALONE, and" \
      "mma bwd d64 fp16 causal alone; bwd-wgmma = $BWD_WGMMA + $BWD_WGMMA_FWD +" \
      "$BWD_WGMMA_ALONE; archs $archs)"
    note "bundles: PASS (${bundles# }; archs $archs)"
    return 0
  fi
  say "FAIL: bundles: ${failures[*]}"
  note "bundles: FAIL: ${failures[*]}"
  return 1
}

stage_tune() {
  "$py" -m flashgen tune 2>&1 | tee "$out/tune.log"
  local rc=$?
  cp flashgen/tuning/*.json "$out/" 2>/dev/null
  return "$rc"
}

stage_bench() {
  "$py" -m flashgen bench --plot --out "$out" 2>&1 | tee "$out/bench.log"
}

stage_robustness() {
  local dir=$out/robustness t0 rc=0 r
  mkdir -p "$dir"
  t0=$SECONDS
  "$py" -m pytest -q -p no:cacheprovider tests/gpu/test_robustness.py >"$dir/robustness.log" 2>&1
  r=$?
  [ "$r" = 0 ] || rc=1
  grep -E "^(FAILED|ERROR)" "$dir/robustness.log" | head -40 | tee -a "$summary"
  note "robustness tests: rc=$r $(last "$dir/robustness.log") ($((SECONDS - t0)) s)"
  t0=$SECONDS
  "$py" scripts/largest_t.py "$dir/largest-t.json" >"$dir/largest-t.log" 2>&1
  r=$?
  [ "$r" = 0 ] || rc=1
  note "largest T: rc=$r $(last "$dir/largest-t.log") ($((SECONDS - t0)) s)"
  return "$rc"
}

stage_trust() {
  local dir=$out/trust i rc=0 pids=() t0=$SECONDS
  local filter=${TRUST_K:-"(mma and (d256 or (d128 and fp16))) or (simt and d64 and fp32) or (wgmma and d128 and causal)"}
  mkdir -p "$dir"
  if "$py" -c "import cupy; print('cupy', cupy.__version__)" >"$dir/cupy.log" 2>&1; then
    note "trust: $(last "$dir/cupy.log")"
  else
    note "trust: cupy not importable (test_cai will skip)"
  fi
  # compile what the runs need once, in parallel, so the shards start from a warm cache
  "$py" - "$filter" >"$dir/compile.log" 2>&1 <<'EOF'
import sys
sys.path.insert(0, "tests")
from flashgen.verify.checks import compile_all
from flashgen.generator.space import shipped
from gpu.test_cai import SPECS as CAI
from gpu.test_long import SPECS as LONG

def keep(name: str, expr: str) -> bool:  # pytest's -k on a variant id (words: substrings)
    import re
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", expr)) - {"and", "or", "not"}
    env = {w: w in name for w in words}
    return bool(eval(expr, {}, env))

prop = [s for s in shipped() if keep(s.name, sys.argv[1])]
specs = list(dict.fromkeys([*CAI, *LONG, *prop]))
res = compile_all(specs)
bad = [s.name for s, c in res.items() if isinstance(c, Exception)]
print(len(specs), "compiled;", len(prop), "property variants;", len(bad), "failed", bad[:5])
EOF
  note "trust compile: $(last "$dir/compile.log")"
  "$py" -m pytest -q -p no:cacheprovider tests/gpu/test_cai.py tests/gpu/test_long.py \
    --junitxml="$dir/junit-cai-long.xml" >"$dir/pytest-cai-long.log" 2>&1 &
  pids+=($!)
  rm -f "$dir"/gpu-suite-[0-9]*.json
  for i in $(seq 0 $((jobs - 1))); do
    FLASHGEN_HYPOTHESIS_PROFILE=thorough FLASHGEN_GPU_EXAMPLES=${TRUST_EXAMPLES:-40} \
      FLASHGEN_GPU_SHRINK=0 FLASHGEN_GPU_SHARD=$i/$jobs FLASHGEN_GPU_SUMMARY=$dir/gpu-suite-$i.json \
      "$py" -m pytest -q -p no:cacheprovider tests/gpu/test_property.py -k "$filter" \
      >"$dir/pytest-property-$i.log" 2>&1 &
    pids+=($!)
  done
  wait_all "${pids[@]}" || rc=1
  "$py" scripts/merge_gpu_summaries.py "$dir" >"$dir/property-merge.txt" 2>&1
  "$py" - "$dir" "$rc" "$((SECONDS - t0))" <<'EOF' | tee -a "$summary"
import json, sys, xml.etree.ElementTree as ET
from pathlib import Path
out, rc, secs = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
summary = {"rc": rc, "seconds": secs}
try:
    suite = ET.parse(out / "junit-cai-long.xml").getroot().iter("testcase")
    groups: dict = {}
    for case in suite:
        name = "cai" if "test_cai" in case.get("classname", "") else "long"
        g = groups.setdefault(name, {"passed": 0, "failed": 0, "skipped": 0, "failures": []})
        if case.find("failure") is not None or case.find("error") is not None:
            g["failed"] += 1
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            g["failures"].append(f"{case.get('name')}: {(bad.get('message') or '')[:300]}")
        elif case.find("skipped") is not None:
            g["skipped"] += 1
        else:
            g["passed"] += 1
    summary.update(groups)
except (OSError, ET.ParseError) as exc:
    summary["cai_long_error"] = str(exc)
merged = out / "gpu-suite.json"
if merged.exists():
    data = json.loads(merged.read_text())
    summary["property"] = {
        k: data.get(k) for k in ("profile", "random_examples_per_variant", "variants", "passed",
                                 "failed", "examples", "worst_ratio")
    }
    summary["property"]["failures"] = [
        f"{v['variant']}: {(v['failure'] or '')[:400]}" for v in data["per_variant"] if not v["passed"]
    ][:20]
(out / "trust-summary.json").write_text(json.dumps(summary, indent=1) + "\n")
print(f"trust: rc={rc}, {secs} s, summary in {out / 'trust-summary.json'}")
for name in ("cai", "long"):
    g = summary.get(name, {})
    print(f"{name}: {g.get('passed', 0)} passed, {g.get('failed', 0)} failed, {g.get('skipped', 0)} skipped")
    for f in g.get("failures", [])[:5]:
        print("  FAIL", f)
p = summary.get("property")
if p:
    print(f"property ({p['profile']}, {p['random_examples_per_variant']} random/variant): "
          f"{p['passed']}/{p['variants']} variants passed, {p['examples']} examples, "
          f"worst error/bound {p['worst_ratio']}")
    for f in p["failures"][:5]:
        print("  FAIL", f)
else:
    print("property: no summary (see pytest-property-*.log)")
EOF
  return "$rc"
}

stage_wgmma_bwd() {
  local dir=$out/wgmma-bwd rc=0 c d s names=()
  mkdir -p "$dir"
  "$py" -m pytest -q -p no:cacheprovider tests/gpu/test_backward.py -k wgmma \
    >"$dir/test-backward.log" 2>&1 || rc=1
  note "test_backward -k wgmma: $(last "$dir/test-backward.log")"
  grep -h "^FAILED\|^ERROR\|Error" "$dir/test-backward.log" | head -8 | tee -a "$summary"
  # autograd through flashgen.torch: sm_90's default is the wgmma backward where it applies
  env -u FLASHGEN_WGMMA_BWD "$py" -m pytest -q -p no:cacheprovider \
    tests/gpu/test_torch_backward.py >"$dir/test-torch-backward.log" 2>&1 || rc=1
  note "test_torch_backward: $(last "$dir/test-torch-backward.log")"
  grep -h "^FAILED\|^ERROR" "$dir/test-torch-backward.log" | head -5 | tee -a "$summary"
  # the shipped mma and wgmma backward tiles (wgmma: stages 3 at d 64, 2 at d 128) and wgmma's
  # bc 64 beside them, with SDPA's FA2 (--peers)
  for c in causal noncausal; do
    for d in 64 128; do
      s=$([ "$d" = 64 ] && echo 3 || echo 2)
      names+=("flash_bwd_mma_d${d}_br64_bc64_bf16_${c}_w4_s$([ "$d" = 64 ] && echo 2 || echo 1)")
      names+=("flash_bwd_wgmma_d${d}_br64_bc128_bf16_${c}_s$s")
      names+=("flash_bwd_wgmma_d${d}_br64_bc64_bf16_${c}_s$s")
    done
  done
  "$py" scripts/bwd_sweep.py "$dir/bwd-sweep.json" "${names[@]}" --peers \
    >"$dir/bwd-sweep.log" 2>&1 || rc=1
  grep -v '^{' "$dir/bwd-sweep.log" | tail -n 30 | tee -a "$summary"
  return "$rc"
}

stage_sass() {
  local dir=$out/sass base=${SASS_BASE:-} dumps rc=0 side tree
  mkdir -p "$dir"
  if [ -z "$base" ] || [ ! -f "$base/flashgen/__init__.py" ]; then
    note "sass: SASS_BASE must name a flashgen checkout to compare against (got '$base')"
    return 2
  fi
  dumps=$tmp/sass
  [ "${SASS_KEEP:-0}" = 1 ] && dumps=$dir
  rm -rf "$dumps/base" "$dumps/head"
  for side in base head; do
    tree=$root
    [ "$side" = base ] && tree=$base
    "$py" scripts/sass_compare.py dump --tree "$tree" --out "$dumps/$side" \
      --jobs "${SASS_JOBS:-$(nproc)}" ${SASS_FAMILY:+--family "$SASS_FAMILY"} \
      >"$dir/dump-$side.log" 2>&1 || rc=1
    note "sass dump $side: $(last "$dir/dump-$side.log")"
    [ "$dumps" = "$dir" ] || cp "$dumps/$side/index.json" "$dir/index-$side.json" 2>/dev/null
  done
  "$py" scripts/sass_compare.py compare "$dumps/base" "$dumps/head" >"$dir/compare.txt" 2>&1 || rc=1
  note "sass compare ($base vs $root): $(last "$dir/compare.txt")"
  return "$rc"
}

note "flashgen gpu_check $(date -u +%FT%TZ) commit=${FLASHGEN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)} stages: $stages"
note "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null)"
status=0
for stage in $stages; do
  t0=$SECONDS
  "stage_${stage//-/_}"
  rc=$?
  [ "$rc" = 0 ] || status=1
  note "stage $stage: $([ "$rc" = 0 ] && echo PASS || echo FAIL) (rc=$rc), $((SECONDS - t0)) s"
done
note "gpu_check status=$status"
exit $status
