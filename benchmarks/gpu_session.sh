#!/usr/bin/env bash
# One session on a CUDA machine, in at most $BUDGET seconds (540 by default, 9 minutes):
#   checks   the kernels' tests on the GPU (float32 as float32: MLX_ENABLE_TF32=0)
#   matvec   the quantized matvec kernel's tactics against quantized_matmul, briefly
#   targets  the target table (benchmarks/gpu_targets.py --quick: one repetition each)
#   full     the full table (three repetitions, 128 tokens), with whatever time is left:
#            each row is written as it is measured, so a run cut short keeps its rows
# Each step is time-boxed and its failure ends only that step. Logs, the tables
# (targets.md/.json, targets-full.md/.json) and each step's exit status (summary.txt,
# 124 for a step cut at its limit) go to $OUT (./gpu-out when unset).
#
# From the checkout, on the machine that `../shared/gpu/README.md`'s first call set up:
#   bash benchmarks/gpu_session.sh                 # all four steps
#   STEPS="checks matvec" bash benchmarks/gpu_session.sh
#   CHECKS=core STEPS=checks bash benchmarks/gpu_session.sh  # all of tests/core (not slow)
# MLX comes from .gpu-b/activate.sh when that folder was sent along (the setup's second
# call), else from ~/mlx-cuda-stage/activate.sh. Wheels in .whl/ (gguf, which some tests'
# fixtures need) are installed to /tmp/site first; without them those tests fail alone.
set -uo pipefail
START=$(date +%s)
BUDGET=${BUDGET:-540}
OUT=${OUT:-$PWD/gpu-out}
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

# The suite's own options (addopts) spread it over pytest-xdist workers, which this machine's
# Python lacks: the checks run in one process, without them.
pytest=(python3 -m pytest -q -p no:cacheprovider -p no:xdist -o addopts=
  --continue-on-collection-errors)
if [ "${CHECKS:-kernels}" = core ]; then
  step checks 300 "${pytest[@]}" -m "not slow and not long" tests/core
else
  step checks 100 "${pytest[@]}" tests/core/test_quantized_matvec.py \
    tests/core/test_paged_decode_kernel.py tests/core/test_turbo_kernels.py \
    tests/core/test_kernels.py tests/core/test_kernel_backends.py
fi
step matvec 50 python3 benchmarks/quantized_matmul.py --rows 1,2,4,8 --repeats 3
step targets 200 python3 benchmarks/gpu_targets.py --quick --out "$OUT/targets.md"
step full 400 python3 benchmarks/gpu_targets.py --out "$OUT/targets-full.md"
cat "$OUT/summary.txt"
