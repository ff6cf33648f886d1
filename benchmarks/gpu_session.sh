#!/usr/bin/env bash
# One session on a CUDA machine, in at most $BUDGET seconds (540 by default, 9 minutes):
#   checks   the kernels' tests on the GPU (float32 as float32: MLX_ENABLE_TF32=0)
#   matvec   the quantized matvec kernel's tactics against quantized_matmul, briefly
#   targets  the target table (benchmarks/gpu_targets.py --quick: one repetition each),
#            each row in a process of its own (targets-ROW.md), then targets.md: in one
#            process, MLX's CUDA graph capture has aborted the run (docs/benchmarks.md)
#   full     the full table (three repetitions, 128 tokens), with whatever time is left:
#            each row is written as it is measured, so a run cut short keeps its rows
# Each step is time-boxed and its failure ends only that step. Logs, the tables
# (targets.md/.json, targets-full.md/.json) and each step's exit status (summary.txt,
# 124 for a step cut at its limit) go to $OUT (./gpu-out when unset).
#
# From the checkout, on the machine that `../shared/gpu/README.md`'s first call set up:
#   bash benchmarks/gpu_session.sh                 # all four steps
#   STEPS="checks matvec" bash benchmarks/gpu_session.sh
#   CHECKS=core STEPS=checks bash benchmarks/gpu_session.sh  # all of tests/core (not slow),
#                                 # its modules shared among $SHARDS processes (8 by default)
#   ROWS="decode_1b turbo4_1b" STEPS=targets bash benchmarks/gpu_session.sh
# MLX comes from .gpu-b/activate.sh when that folder was sent along (the setup's second
# call), else from ~/mlx-cuda-stage/activate.sh. Wheels in .whl/ (gguf, which some tests'
# fixtures need) are installed to /tmp/site first; without them those tests fail alone.
set -uo pipefail
# The suite's own options (addopts) spread it over pytest-xdist workers, which this machine's
# Python lacks: the checks run without them (all of tests/core in processes of their own).
pytest=(python3 -m pytest -q -p no:cacheprovider -p no:xdist -o addopts=
  --continue-on-collection-errors)
# core_shards (`$0 core-shards`): all of tests/core (not slow), module i of every $SHARDS
# going to process i; the processes share the card and run at once.
core_shards() {
  local shards=${SHARDS:-8} i status=0
  local modules=(tests/core/test_*.py)
  local pids=()
  for ((i = 0; i < shards; i++)); do
    local mine=()
    for ((m = i; m < ${#modules[@]}; m += shards)); do mine+=("${modules[m]}"); done
    "${pytest[@]}" -m "not slow and not long" "${mine[@]}" >"$OUT/checks-$i.log" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < shards; i++)); do
    wait "${pids[i]}" || status=1
    echo "shard $i: $(tail -n 1 "$OUT/checks-$i.log")"
  done
  grep -h "^FAILED\|^ERROR" "$OUT"/checks-*.log
  return $status
}

# target_rows (`$0 target-rows`): each row of `ROWS` (every row by default) in a process of
# its own, then the rows' tables in one. A row that aborts (MLX's CUDA graph capture, which
# cuDNN attention is part of: docs/benchmarks.md) runs once more with cuDNN attention off.
target_rows() {
  local rows=${ROWS:-decode_1b batch_1b turbo4_1b decode_8b batch_8b prefill_8b
    speculative_8b decode_8b4 batch_8b4}
  local row status=0
  for row in $rows; do
    local command=(python3 benchmarks/gpu_targets.py --quick --rows "$row"
      --out "$OUT/targets-$row.md")
    "${command[@]}" && continue
    [ $? -eq 134 ] && echo "$row aborted; again with MLX_CUDA_USE_CUDNN_SDPA=0" \
      && MLX_CUDA_USE_CUDNN_SDPA=0 "${command[@]}" && continue
    status=1
  done
  for row in $rows; do cat "$OUT/targets-$row.md" 2>/dev/null; done >"$OUT/targets.md"
  return $status
}

# `timeout` runs commands, not functions: the steps that are functions run as this script
# again, in the environment set up below.
case "${1:-}" in
  core-shards) OUT=${OUT:?}; core_shards; exit ;;
  target-rows) OUT=${OUT:?}; target_rows; exit ;;
esac
START=$(date +%s)
BUDGET=${BUDGET:-540}
export OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
if [ -f .gpu-b/activate.sh ]; then
  source .gpu-b/activate.sh || exit 3
else
  source ~/mlx-cuda-stage/activate.sh || exit 3
fi
if ls .whl/*.whl >/dev/null 2>&1; then
  if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl; then
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
  else
    echo "wheels in .whl/ did not install; going on without them" | tee -a "$OUT/summary.txt"
  fi
fi
export PYTHONUNBUFFERED=1 MLX_ENABLE_CACHE_THRASHING_CHECK=0 MLX_ENABLE_TF32=0
# MLX keys its compiled-kernel cache by kernel name and template arguments, not source: a
# machine kept from an earlier session would run a kernel's old code. Each session compiles
# into a cache of its own.
export MLX_PTX_CACHE_DIR=/tmp/mlxcel-ptx-$START
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv >"$OUT/device.txt" 2>&1

# step NAME SECONDS COMMAND...: run COMMAND, if STEPS names it, for at most SECONDS and
# never past the budget (less 20 s for the summary), its output also in NAME.log.
step() {
  local name=$1 limit=$2
  shift 2
  case " ${STEPS:-checks matvec targets full} " in *" $name "*) ;; *) return ;; esac
  local left=$((BUDGET - 20 - ($(date +%s) - START)))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 30 ]; then
    echo "$name: not run, $left s of the budget left" | tee -a "$OUT/summary.txt"
    return
  fi
  echo "== $name (at most ${limit} s): $*"
  timeout --signal=INT --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  echo "$name: exit ${PIPESTATUS[0]} after $(($(date +%s) - START)) s" | tee -a "$OUT/summary.txt"
}

if [ "${CHECKS:-kernels}" = core ]; then
  step checks 360 bash "$0" core-shards
else
  step checks 100 "${pytest[@]}" tests/core/test_quantized_matvec.py \
    tests/core/test_paged_decode_kernel.py tests/core/test_turbo_kernels.py \
    tests/core/test_kernels.py tests/core/test_kernel_backends.py
fi
step matvec 50 python3 benchmarks/quantized_matmul.py --rows 1,2,4,8 --repeats 3
step targets 300 bash "$0" target-rows
step full 400 python3 benchmarks/gpu_targets.py --out "$OUT/targets-full.md"
cat "$OUT/summary.txt"
