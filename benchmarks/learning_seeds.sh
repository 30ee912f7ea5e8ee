#!/bin/bash
# The learning check's seeds side by side, each arm in its own process (for a GPU machine
# with cores to spare; on 2 cores run `python benchmarks/learning_check.py --seed S` instead):
#
#     bash benchmarks/learning_seeds.sh OUTPUT_DIR [SEED ...]        (default seeds: 0 1 2)
#
# Every seed trains IGPO and its placebo at once (learning_check.py --train-only), then the
# start and both policies play the held-out tasks paired (learning_check.py --arms --trained):
# the same numbers as the one-process check, whose arms train one after the other.
# LEARNING_ARGS adds arguments to every learning_check.py call (e.g. "--steps 32");
# PLAY_ARGS to the plays only (default "--groups-per-call 53": one engine call plays a whole
# held-out split, 106 episodes at k 2). OUTPUT_DIR/seed_S holds a seed's runs, its logs
# (train_igpo.log, train_placebo.log, play.log) and results.md / results.json;
# OUTPUT_DIR/summary.txt gets each seed's RESULT lines and phase times as it finishes.
# Exits non-zero if any seed failed. The seeds and arms are this script's processes (each
# check runs with --jobs 1). Each process runs policy.threads (2) torch threads: keep
# seeds x 2 arms x threads within the cores (more makes OpenMP's spinning threads contend:
# two 2-thread trainers on 2 cores took over 9 minutes for a step one of them alone takes in 80 s).
set -u
if [ $# -lt 1 ]; then
    echo "usage: bash benchmarks/learning_seeds.sh OUTPUT_DIR [SEED ...]" >&2
    exit 2
fi
out=$1
shift
seeds=${*:-0 1 2}
python=${PYTHON:-python3}
check=(benchmarks/learning_check.py)
mkdir -p "$out"
count=$(wc -w <<<"$seeds")
if [ $((count * 4)) -gt "$(nproc)" ]; then
    echo "warning: $((count * 2)) processes of 2 threads on $(nproc) cores; pass fewer seeds" \
        "or a --config with policy.threads 1 in LEARNING_ARGS" >&2
fi

run_seed() {  # run_seed SEED: train both arms at once, then play; the last line says how
    local seed=$1 dir="$out/seed_$1" started=$SECONDS arm
    mkdir -p "$dir"
    for arm in igpo placebo; do
        # shellcheck disable=SC2086  # LEARNING_ARGS is a list of arguments
        "$python" "${check[@]}" --seed "$seed" --arms "$arm" --train-only --output "$dir" \
            --jobs 1 ${LEARNING_ARGS:-} >"$dir/train_$arm.log" 2>&1 &
    done
    wait
    local trained=$((SECONDS - started))
    for arm in igpo placebo; do
        if [ ! -f "$dir/$arm/final/config.json" ]; then
            echo "seed $seed: the $arm arm did not train (see $dir/train_$arm.log)"
            return 1
        fi
    done
    # shellcheck disable=SC2086
    "$python" "${check[@]}" --seed "$seed" --arms --trained igpo="$dir/igpo/final" \
        placebo="$dir/placebo/final" --output "$dir" --jobs 1 ${LEARNING_ARGS:-} \
        ${PLAY_ARGS:---groups-per-call 53} >"$dir/play.log" 2>&1
    local rc=$?
    {
        echo "== seed $seed: trained both arms in ${trained} s, played in" \
             "$((SECONDS - started - trained)) s (rc $rc)"
        grep "^RESULT" "$dir/play.log"
    } >>"$out/summary.txt"
    return $rc
}

pids=()
for seed in $seeds; do
    run_seed "$seed" &
    pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do
    wait "$pid" || failed=1
done
cat "$out/summary.txt" 2>/dev/null
exit $failed
