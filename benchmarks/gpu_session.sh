#!/usr/bin/env bash
# One session on a CUDA machine: the kernels' GPU checks, the quantized product's tactics,
# then the target table (benchmarks/gpu_targets.py), each step time-boxed so that the whole
# fits in about 9 minutes. Logs, the table (targets.md, targets.json) and a summary of
# each step's exit status go to $OUT (./gpu-out when unset).
#
# From the checkout, on the machine that `../shared/gpu/README.md`'s first call set up:
#   bash benchmarks/gpu_session.sh            # full table
#   QUICK=1 bash benchmarks/gpu_session.sh    # one repetition of each row, 64 tokens
#   CHECKS=core STEPS=checks bash benchmarks/gpu_session.sh  # all of tests/core (not slow)
# STEPS names the steps to run, of "checks matvec targets" (all by default).
# MLX comes from .gpu-b/activate.sh when that folder was sent along (the setup's second
# call), else from ~/mlx-cuda-stage/activate.sh. Wheels in .whl/ (gguf, which the tests'
# fixtures need) are installed to /tmp/site first.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
if [ -f .gpu-b/activate.sh ]; then
  source .gpu-b/activate.sh || exit 3
else
  source ~/mlx-cuda-stage/activate.sh || exit 3
fi
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 4
  export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
export PYTHONUNBUFFERED=1 MLX_ENABLE_CACHE_THRASHING_CHECK=0
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv >"$OUT/device.txt" 2>&1

# step NAME SECONDS COMMAND...: run COMMAND under a time limit, its output also in NAME.log,
# if STEPS names it.
step() {
  local name=$1 limit=$2
  shift 2
  case " ${STEPS:-checks matvec targets} " in *" $name "*) ;; *) return ;; esac
  echo "== $name (at most ${limit} s): $*"
  timeout --signal=INT --kill-after=15 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  echo "$name: exit ${PIPESTATUS[0]}" | tee -a "$OUT/summary.txt"
}

if [ "${CHECKS:-kernels}" = core ]; then
  step checks 240 python3 -m pytest -q -p no:cacheprovider -m "not slow and not long" tests/core
else
  step checks 150 python3 -m pytest -x -q -p no:cacheprovider \
    tests/core/test_quantized_matvec.py tests/core/test_paged_decode_kernel.py \
    tests/core/test_kernels.py tests/models/test_compute_options.py
fi
step matvec 60 python3 benchmarks/quantized_matmul.py --rows 1,2,4,8,16,64
step targets 330 python3 benchmarks/gpu_targets.py --out "$OUT/targets.md" ${QUICK:+--quick}
cat "$OUT/summary.txt"
