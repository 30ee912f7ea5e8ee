#!/bin/bash
# One device call: the GPU checks side by side (one GPU, 16 cores), their outputs in one
# archive (the device returns at most 8 files):
#     bash benchmarks/gpu_run.sh "rl_step fit_gpu learning_gpu"   # with .gpu carried
# Each step runs as its own `benchmarks/gpu_checks.sh` process (STEP_LIMIT seconds each);
# /tmp/gpu/<step>/ holds its log and results; everything goes to $OUT/gpu.tgz.
set -u
steps=${1:-"rl_step fit_gpu learning_gpu"}
limit=${STEP_LIMIT:-440}
export PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p /tmp/gpu
STEPS=none bash benchmarks/gpu_checks.sh /tmp/gpu/setup > /tmp/gpu/setup.log 2>&1
for s in $steps; do
    STEPS=$s RL_STEP_LIMIT=$limit FIT_LIMIT=$limit LEARNING_LIMIT=$limit \
        bash benchmarks/gpu_checks.sh "/tmp/gpu/$s" > "/tmp/gpu/$s.out" 2>&1 &
done
wait
for run in runs/rl_step runs/fit_gpu runs/learning_gpu; do
    [ -d "$run" ] && find "$run" -name metrics.jsonl | while read -r f; do
        mkdir -p "/tmp/gpu/metrics/$(dirname "$f")" && cp "$f" "/tmp/gpu/metrics/$f"; done
done
tar czf "${OUT:-/tmp}/gpu.tgz" -C /tmp gpu
cat /tmp/gpu/setup.log /tmp/gpu/*.out
