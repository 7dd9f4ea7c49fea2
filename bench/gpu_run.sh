#!/usr/bin/env bash
# One device session: the generated kernels' tests on the GPU (bf16 is checked by the benchmarks),
# then a benchmark.  Usage: bench/gpu_run.sh {tests,sweep,matmul,membound,attention,moe,peers,host_cost,warmup_classes,scaled_mm,moe_fp8,first_call,warmup,fp8_kv,window,prefill_tma}...   Logs go to $OUT (or /tmp).
# first_call: only matmul's first-call latencies, 3 repeats (they move by tenths of a second between processes).
# warmup: ahead-of-time warm-up of every kernel module (bf16, fp16), then the first calls after it and autotune's, 3 repeats.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-run}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
status=0
for step in "$@"; do
    case "$step" in
        tests)
            # The kernel test files (the compiler's need pydantic, the warm-up plan tests the interpreter):
            # about 250 s on 14 workers.
            python3 -m pytest -q -p no:cacheprovider -n 14 --tb=short -rfEs \
                tests/test_matmul.py tests/test_transform*.py tests/test_cache.py tests/test_attention*.py tests/test_moe*.py \
                tests/test_first_launch.py tests/test_detect.py tests/test_parity.py tests/test_fp8_kv*.py tests/test_fp8_cast.py \
                tests/test_scaled_mm.py tests/test_feature_records.py tests/test_direct_launch*.py tests/test_call_cache*.py \
                tests/test_warmup_gpu.py tests/test_host_cost.py \
                2>&1 | tee "$OUT/gpu_tests.log" | tail -15 || status=1 ;;
        # The attention tile sweep (prefill and decode tiles, cut at 235 s), for the specs' h200 policies.
        sweep) python3 bench/attention_sweep.py --json "$OUT/attention_sweep.json" --budget-s 235 2>&1 | tee "$OUT/attention_sweep.log" || status=1 ;;
        matmul) python3 bench/matmul.py 2>&1 | tee "$OUT/bench_matmul.log" || status=1 ;;
        membound) python3 bench/membound.py 2>&1 | tee "$OUT/bench_membound.log" || status=1 ;;
        attention) python3 bench/attention.py 2>&1 | tee "$OUT/bench_attention.log" || status=1 ;;
        moe) python3 bench/moe.py 2>&1 | tee "$OUT/bench_moe.log" || status=1 ;;
        # Issue 33: the peers' columns in quick runs (~6 min for the three, with host_cost), the host
        # cost of eager calls, and the GPU test of warm-up's argument classes.
        peers)
            python3 bench/moe.py --quick --json "$OUT/moe_peers.json" 2>&1 | tee "$OUT/bench_moe_peers.log" || status=1
            python3 bench/attention.py --quick --json "$OUT/attention_peers.json" 2>&1 | tee "$OUT/bench_attention_peers.log" || status=1 ;;
        host_cost) python3 bench/host_cost.py 2>&1 | tee "$OUT/bench_host_cost.log" || status=1 ;;
        warmup_classes) python3 -m pytest -q -p no:cacheprovider tests/test_warmup_gpu.py -rs 2>&1 | tee "$OUT/warmup_classes.log" || status=1 ;;
        moe_fp8)
            python3 -m pytest -q -p no:cacheprovider tests/test_moe_fp8.py tests/test_moe_fp8_gpu.py 2>&1 | tee "$OUT/gpu_tests_moe_fp8.log" | tail -5 || status=1
            for model in qwen3_30b mixtral dsv3; do
                python3 bench/moe_fp8.py --model "$model" 2>&1 | tee "$OUT/bench_moe_fp8_$model.log" || status=1
            done ;;
        scaled_mm)
            python3 -m pytest -q -p no:cacheprovider tests/test_scaled_mm.py 2>&1 | tee "$OUT/gpu_tests_scaled_mm.log" | tail -5 || status=1
            python3 bench/scaled_mm.py 2>&1 | tee "$OUT/bench_scaled_mm.log" || status=1 ;;
        # Issue 36: the attention features in bf16 against float64 references, then windowed
        # prefill against FlexAttention and windowed decode against a copy of the window's bytes.
        window)
            python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_attention_features_gpu.py tests/test_feature_records.py \
                2>&1 | tee "$OUT/gpu_tests_window.log" | tail -5 || status=1
            python3 bench/attention.py --phases window --json "$OUT/attention_window.json" 2>&1 | tee "$OUT/bench_attention_window.log" || status=1 ;;
        # Issue 33: prefill's K/V through TMA descriptors against pointer loads, same kernels (~40 s).
        prefill_tma) python3 bench/prefill_tma.py --json "$OUT/prefill_tma.json" 2>&1 | tee "$OUT/bench_prefill_tma.log" || status=1 ;;
        first_call) python3 bench/matmul.py --first-call-only --repeats 3 2>&1 | tee "$OUT/bench_first_call.log" || status=1 ;;
        warmup) python3 bench/warmup.py --repeats 3 2>&1 | tee "$OUT/bench_warmup.log" || status=1 ;;
        # Issue 35 item 4: the FP8 KV cache's tests on the GPU, then its decode phase (~1 min).
        fp8_kv)
            python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_fp8_kv.py tests/test_fp8_kv_gpu.py 2>&1 | tee "$OUT/gpu_tests_fp8_kv.log" | tail -5 || status=1
            python3 bench/attention.py --phases fp8_decode --json "$OUT/attention_fp8.json" 2>&1 | tee "$OUT/bench_attention_fp8.log" || status=1 ;;
        *) echo "unknown step $step"; status=2 ;;
    esac
done
exit $status
