#!/usr/bin/env bash
# The worker-per-GPU path of codegen tune on the one GPU lent (both workers on device 0), then the same
# tune as two --shard runs merged: a stand-in for issue 19's two-GPU run.  Carries .whl/ (bench/RESULTS.md).
export PYTHONUNBUFFERED=1; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3; export PYTHONPATH=/tmp/site:$PWD
A="matmul --hw h200 --shapes 128x4096x4096 5120x2048x2048 --space num_stages=3,4,5,6 group_m=8,16 --buckets small large --chunk 2 --quiet --dry-run"
timeout 150 python3 -m codegen tune $A --devices 0,0 --results $OUT/two > $OUT/two_workers.txt 2>&1; echo "two workers rc=$?"
grep -E "workers|wall|held|new:|disqualified" $OUT/two_workers.txt | head; ls $OUT/two/*/
for i in 0 1; do timeout 100 python3 -m codegen tune $A --shard $i/2 --results $OUT/shard$i.jsonl > $OUT/shard$i.txt 2>&1; echo "shard $i rc=$?"; tail -1 $OUT/shard$i.txt; done
timeout 60 python3 -m codegen tune merge $OUT/shard0.jsonl $OUT/shard1.jsonl --dry-run --quiet > $OUT/merged.txt 2>&1; echo "merge rc=$?"; grep -E "│" $OUT/merged.txt | head -5; grep -E "│" $OUT/two_workers.txt | head -5
