#!/bin/bash
# scripts/dev/pytest_shards.sh N LOGDIR PYTEST_ARGS...: run `python3 -m pytest -q PYTEST_ARGS` as
# N processes in parallel (FLASHGEN_GPU_SHARD=i/N, tests/gpu only), BLAS threads 1, one log per
# shard in LOGDIR; prints each shard's last line and the failures, exits non-zero when any
# shard fails. Why: on the GPU host the variants compile with nvcc on first use, and one pytest
# process compiles them one at a time; N shards compile N at a time (the compile cache locks
# a variant, so two shards never build the same one twice).
set -u
n=${1:?usage: pytest_shards.sh N LOGDIR PYTEST_ARGS...}; logs=${2:?LOGDIR}; shift 2
mkdir -p "$logs"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
pids=()
for i in $(seq 0 $((n - 1))); do
  FLASHGEN_GPU_SHARD=$i/$n python3 -m pytest -q -p no:cacheprovider "$@" >"$logs/shard-$i.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
for i in $(seq 0 $((n - 1))); do echo "shard $i: $(tail -n1 "$logs/shard-$i.log")"; done
grep -h -E "^(FAILED|ERROR)" "$logs"/shard-*.log | head -20
exit "$rc"
