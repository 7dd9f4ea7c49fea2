#!/usr/bin/env bash
# One device session of codegen tune on an H200 (which lacks the compiler's packages: carry .whl/, see
# bench/RESULTS.md).  Usage: bench/tune_h200.sh STEP...   STEP: matmul | moe | matmul_check
#   matmul        tune matmul over the spec's shapes and space, --dry-run, results under $OUT/tune
#   moe           tune moe_launch over the spec's shapes (decode and small batches), 200 s budget
#   matmul_check  the GPU tests of the generated matmul kernels, then bench/matmul.py
set -o pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/tune-run}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv | tee -a "$OUT/gpu.txt"
status=0
for step in "$@"; do
    case "$step" in
        matmul) timeout 560 python3 -m codegen tune matmul --hw auto --budget 480 --results "$OUT/tune" --dry-run 2>&1 \
                    | grep -v "━" | tee "$OUT/tune_matmul.log" | grep -v "^[+-]" | tail -40 || status=1 ;;
        moe) timeout 300 python3 -m codegen tune moe_launch --hw auto --budget 200 --results "$OUT/tune" --dry-run 2>&1 \
                 | grep -v "━" | tee "$OUT/tune_moe.log" | grep -v "^[+-]" | tail -40 || status=1 ;;
        matmul_check) timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_matmul.py 2>&1 | tail -4 || status=1
                      timeout 240 python3 bench/matmul.py 2>&1 | tee "$OUT/bench_matmul.log" | tail -18 || status=1 ;;
        *) echo "unknown step $step"; status=2 ;;
    esac
done
exit $status
