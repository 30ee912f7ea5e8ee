#!/bin/bash
# The GPU checks, in one short run (under 8 minutes of commands on one H100):
#
#     bash benchmarks/gpu_checks.sh [OUTPUT_DIR]      (default: $OUT, else runs/gpu_checks)
#
# Default (STEPS unset): the RL trainer at GPU scale.
# rl_step: benchmarks/rl_step.py --device cuda with examples/configs/gpu_igpo_qwen3_0p5b.yaml:
#    a Qwen3-shaped 0.46B policy built from a config (nothing downloaded), vLLM colocated
#    when installed (else the transformers engine); the phases of one IGPO step (ig_share,
#    rollout and learner tokens/s per GPU, the async IG gap), then the config trained 3 steps
#    synchronous and 3 steps with run.async_rollouts on Ray (async_speedup). Its log and the
#    runs' metrics.jsonl go to OUTPUT_DIR.
# rl_step_cpu: the same script at tiny size on the CPU (the part that runs anywhere).
#
# The checks of the SFT stage and the information-gain reward (run before: ~7 min; measured
# 24 s for the tests, 277 s for three packing runs and 68 s for the IG run;
# docs/benchmarks.md, "GPU checks") are named steps, e.g.
# STEPS="sft_tests sft_speed sft_speed_mask sft_speed_fp32 ig_speed_1b":
#
# 0. sft_gpu (runs first; not in the default STEPS): the SFT recipe on one GPU,
#    examples/sft_tiny.py with examples/configs/sft_gpu.yaml. The run's final model,
#    eval.json and metrics.jsonl go to OUTPUT_DIR as sft_gpu.tgz.partNN (15 MB pieces:
#    `cat sft_gpu.tgz.part* | tar xz`), so the weights can be evaluated again elsewhere.
# 1. The SFT and policy tests with a CUDA device present: train.device defaults to 'auto',
#    so the example's passes (tests/test_sft_example.py) train and evaluate on the GPU, and
#    the CUDA-only resume test runs.
# 2. benchmarks/sft_speed.py on the GPU: packing vs padding in bf16 (packed samples kept
#    apart by per-span SDPA, then by a dense block mask) and in fp32.
# 3. benchmarks/ig_speed.py --preset 1b at 32K tokens: the long-context information gain.
# Each step has its own time limit, and a failed step does not stop the later ones; the
# script exits non-zero if any failed. Logs go to OUTPUT_DIR (default: runs/gpu_checks).
# STEPS="sft_tests sft_speed" runs only the steps named.
#
# fit_gpu / learning_gpu: the learning checks on the GPU with the packaged warm start
#    (benchmarks/fit_check.py, benchmarks/learning_check.py; the policy is tiny, so a GPU step
#    is mostly decode and kernel-launch time). FIT_ARGS / LEARNING_ARGS add arguments, e.g.
#    LEARNING_ARGS="--steps 40". Their logs and results.md / results.json go to OUTPUT_DIR.
#
# learning_seeds: the learning check's seeds LEARNING_SEEDS (default "0 1 2") side by side
#    (benchmarks/learning_seeds.sh: each arm trains in its own process, then each seed plays
#    its three policies), with policy.threads 1. LEARNING_ARGS as above; the runs under
#    runs/learning_seeds, their summary.txt and results copied to OUTPUT_DIR. On an H200 a
#    trainer takes ~19 s a step alone and six share the GPU's time: one seed per 15-minute
#    lease (LEARNING_SEEDS=1; docs/benchmarks.md "GPU checks").
#
# The lent GPU image (Python 3.12, no network) lacks gymnasium, Farama-Notifications,
# tantivy, Ray and jsonschema (Ray's). Prepare a carry folder `.gpu` on a machine with the
# package index (`/.gpu/` in .git/info/exclude):
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#         --implementation cp --platform manylinux_2_28_x86_64 \
#         --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu/whl \
#         gymnasium==1.4.0 farama-notifications==0.0.4 tantivy==0.27.0 jsonschema \
#         referencing rpds-py jsonschema-specifications
#     # Ray's wheel (79 MB) is over the carry limit: unpack it, drop its Java jars (unused),
#     # and repack with xz (33 MB):
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#         --implementation cp --platform manylinux2014_x86_64 -d /tmp/ray ray==2.60.0
#     (cd /tmp/ray && unzip -q ray-*.whl -d site && rm -r site/ray/jars && \
#      tar cf - -C site . | xz -6 > "$OLDPWD/.gpu/ray_site.tar.xz")
# This script installs them into /tmp/site when `.gpu` is there (carry it: carry [".gpu"]).
set -u
out=${1:-${OUT:-runs/gpu_checks}}
mkdir -p "$out"
if [ -d .gpu ] && [ ! -e /tmp/site/.installed ]; then
    mkdir -p /tmp/site
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl \
        && { [ ! -f .gpu/ray_site.tar.xz ] || tar xJf .gpu/ray_site.tar.xz -C /tmp/site; } \
        && touch /tmp/site/.installed || echo "installing the carried packages failed"
fi
[ -d /tmp/site ] && export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; fi
python=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled
failed=0
steps=" ${STEPS:-rl_step} "

step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    [[ $steps == *" $name "* ]] || return 0
    echo "== $name ($(date +%T), limit ${limit}s): $*"
    local started=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    grep -iE "RESULT|passed|failed|error|traceback" "$out/$name.log" | tail -n 15
    echo "== $name rc=$rc in $((SECONDS - started)) s"
    [ "$rc" -eq 0 ] || failed=1
}

nvidia-smi -L 2>/dev/null || echo "nvidia-smi: not found"
"$python" -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'cuda', torch.cuda.is_available(),
torch.cuda.get_device_name() if torch.cuda.is_available() else '')"

# First, so that its time limit is not eaten by the checks below. An earlier run's output
# is removed first, so that what gets packed is this run's (metrics.jsonl appends).
if [[ $steps == *" sft_gpu "* ]]; then
    rm -rf runs/sft_gpu "$out"/sft_gpu.tgz.part*
fi
step sft_gpu "${SFT_GPU_LIMIT:-540}" "$python" examples/sft_tiny.py \
    --config examples/configs/sft_gpu.yaml
if [[ $steps == *" sft_gpu "* ]] && [ -d runs/sft_gpu/final ]; then
    packed=(final)
    for f in eval.json metrics.jsonl; do [ -f "runs/sft_gpu/$f" ] && packed+=("$f"); done
    tar czf - -C runs/sft_gpu "${packed[@]}" | split -b 15M -d - "$out/sft_gpu.tgz.part"
    [ "${PIPESTATUS[0]}${PIPESTATUS[1]}" = 00 ] || { echo "packing sft_gpu failed"; failed=1; }
    ls -l "$out"/sft_gpu.tgz.part*
fi
step sft_tests 200 "$python" -m pytest -q -p no:cacheprovider tests/test_sft_trainer.py \
    tests/test_sft_example.py tests/test_sft_packing.py tests/test_sft_models.py \
    tests/test_policy_eval.py
# 256 episodes (~0.5M tokens): at 32, a GPU epoch lasts a fraction of a second.
speed=("$python" benchmarks/sft_speed.py --device cuda --episodes 256 --rounds 3)
step sft_speed 150 "${speed[@]}" --precision bf16
step sft_speed_mask 150 "${speed[@]}" --precision bf16 --packed-attention mask
step sft_speed_fp32 150 "${speed[@]}" --precision fp32
step ig_speed_1b 150 "$python" benchmarks/ig_speed.py --preset 1b --device cuda --tokens 32768
# The RL step at GPU scale; the policy, the two trainer runs and their metrics under
# runs/rl_step (metrics and the policy's config copied to OUTPUT_DIR).
step rl_step "${RL_STEP_LIMIT:-420}" "$python" benchmarks/rl_step.py --device cuda \
    --config examples/configs/gpu_igpo_qwen3_0p5b.yaml --steps 2 --async-steps 3 \
    --work runs/rl_step
if [[ $steps == *" rl_step "* ]]; then
    for run in sync async; do
        [ -f "runs/rl_step/$run/metrics.jsonl" ] && cp "runs/rl_step/$run/metrics.jsonl" \
            "$out/rl_step_${run}_metrics.jsonl"
    done
    [ -f runs/rl_step/policy-qwen3_0p5b/config.json ] && \
        cp runs/rl_step/policy-qwen3_0p5b/config.json "$out/rl_step_policy_config.json"
fi
step rl_step_cpu 300 "$python" benchmarks/rl_step.py --device cpu --steps 2 --async-steps 0 \
    --work runs/rl_step_cpu
# The learning checks on the GPU (the warm start is tiny: the runs are decode-bound).
# Their runs stay under runs/; only results.md / .json are copied to OUTPUT_DIR.
step fit_gpu "${FIT_LIMIT:-540}" "$python" benchmarks/fit_check.py --seed 0 \
    --output runs/fit_gpu ${FIT_ARGS:-}
step learning_gpu "${LEARNING_LIMIT:-540}" "$python" benchmarks/learning_check.py --seed 0 \
    --output runs/learning_gpu ${LEARNING_ARGS:-}
if [[ $steps == *" learning_seeds "* ]]; then
    rm -rf runs/learning_seeds  # an earlier run's summary.txt would be appended to
    sed 's/^  threads: [0-9]*$/  threads: 1/' benchmarks/configs/learning_check_igpo.yaml \
        > /tmp/learning_check_threads1.yaml
fi
PYTHON="$python" LEARNING_ARGS="--config /tmp/learning_check_threads1.yaml ${LEARNING_ARGS:-}" \
    step learning_seeds "${LEARNING_LIMIT:-540}" bash benchmarks/learning_seeds.sh \
    runs/learning_seeds ${LEARNING_SEEDS:-0 1 2}
if [ -f runs/learning_seeds/summary.txt ]; then
    cp runs/learning_seeds/summary.txt "$out/learning_seeds_summary.txt"
    for seed in ${LEARNING_SEEDS:-0 1 2}; do
        [ -f "runs/learning_seeds/seed_$seed/results.md" ] && \
            cp "runs/learning_seeds/seed_$seed/results.md" "$out/learning_seeds_$seed.md"
    done
fi
for check in fit_gpu learning_gpu; do
    for f in results.md results.json; do
        [ -f "runs/$check/$f" ] && cp "runs/$check/$f" "$out/${check}_$f"
    done
done
exit $failed
