"""How fast the RL learner trains compared with the SFT trainer, on the same trajectories.

    python benchmarks/learning_speed.py          # the learning-check step on the warm start, ~6 min
    python benchmarks/learning_speed.py --config benchmarks/configs/learning_check_igpo.yaml \
        --repeats 2

One step of the learning-check config (benchmarks/configs/learning_check_igpo.yaml: the
packaged warm start, queries_per_step x G trajectories) is rolled out once, group by group
and then with all groups sharing engine calls (rollout.groups_per_call), so both are timed
on the same jobs. On that one batch of trajectories, in this process:

* the RL learner, as the learning check runs it (IGPO: the fused information-gain and
  old-log-prob pass, reference log-probs, one PPO epoch over two mini-batches), timed from
  a fresh learner with the packed learner (learner.packing, the default) and with the
  padded one (packing false, micro-batches of micro_batch_size trajectories: the learner
  before packing);
* the SFT trainer (trainers.sft.trainer, packed rows, varlen attention) training one epoch
  over the same trajectories with their policy-token masks, after one warm-up epoch.

Prints each phase's seconds (the median of --repeats) and

    RESULT learner_vs_sft=<float>    packed RL learner trajectory tokens/s over score + update
                                     / the SFT trainer's tokens/s on the same trajectories
    RESULT rl_step_s=<float>         rollout (the faster way) + score + update, packed
    RESULT rl_step_speedup=<float>   the step before (group by group, padded learner) / after
    RESULT rollout_shared_speedup=<float>  group-by-group rollout s / shared-call rollout s

Every ratio's baseline is measured in the same run, on the same trajectories.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import statistics
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "benchmarks" / "configs" / "learning_check_igpo.yaml"


def roll_out(config: Any, groups_per_call: int) -> tuple[list[Any], float]:
    """Step 0's groups of `config` in this process; (results, seconds)."""
    from trainers.rl.cluster import start_workers
    from trainers.rl.driver import roll_out as driver_roll_out
    from trainers.rl.driver import step_jobs

    config = copy.deepcopy(config)
    config.rollout.groups_per_call = groups_per_call
    workers = start_workers(config, config.algorithm.build())
    try:
        num_tasks = workers.rollouts.num_tasks()
        jobs = step_jobs(config.run.seed, 0, config.rollout.queries_per_step, num_tasks)
        started = time.perf_counter()
        rolled = driver_roll_out(workers.rollouts, jobs, 1.0, groups_per_call=groups_per_call)
        return rolled.results, time.perf_counter() - started
    finally:
        workers.close()


def learner_step(config: Any, results: list[Any], packing: bool) -> tuple[float, float, int]:
    """(score s, update s, trajectory tokens) of one learner step on `results`."""
    from trainers.backends import InProcess, WorkerSpec
    from trainers.distributed import WorkerGroup
    from trainers.modeling.models import load_tokenizer
    from trainers.rl.driver import ppo_update, to_batch
    from trainers.rl.learner import Learner
    from trainers.rl.learner_group import LearnerGroup

    config = copy.deepcopy(config)
    config.learner.packing = packing
    algorithm = config.algorithm.build()
    learner = config.learner
    tokenizer, _ = load_tokenizer(config.policy.path)
    settings = dict(**learner.optimizer_settings(), use_gpu=False, seed=config.run.seed,
                    temperature=config.rollout.temperature, **learner.model_settings())
    learners = LearnerGroup(WorkerGroup(InProcess(), [WorkerSpec(
        Learner, (config.policy.path, algorithm), settings)]))
    try:
        batch, answers = to_batch(results, tokenizer.pad_token_id or 0)
        started = time.perf_counter()
        batch = learners.score(batch, answers, algorithm.probe_distractors(batch, answers))
        score_s = time.perf_counter() - started
        advantages = algorithm.advantages(batch, algorithm.turn_rewards(batch))
        batch = batch.replace(advantages=advantages.tokens)
        started = time.perf_counter()
        ppo_update(learners, batch, config.learner)
        update_s = time.perf_counter() - started
        return score_s, update_s, int(batch.attention_mask.sum())
    finally:
        learners.close()


def sft_tokens_per_s(config: Any, results: list[Any], work: Path) -> float:
    """The SFT trainer's tokens/s over one epoch of the trajectories (after a warm-up one)."""
    from trainers.modeling.models import load_policy
    from trainers.sft.config import DataConfig, TrainConfig
    from trainers.sft.packing import samples_from_trajectories
    from trainers.sft.trainer import SFTTrainer

    model, tokenizer, _ = load_policy(config.policy.path)
    trajectories = [t for result in results for t in result.trajectories]
    row = max(8192, max(len(t.input_ids) for t in trajectories))
    samples = samples_from_trajectories(trajectories, row)
    data = DataConfig(max_seq_len=row, packing=True)
    train = TrainConfig(output_dir=str(work), epochs=2, progress_bar=False, log_every=10**9,
                        lr=1e-5, warmup_ratio=0.0)
    trainer = SFTTrainer(model, samples, train, data, tokenizer.pad_token_id or 0,
                         log=lambda _: None)
    second = trainer.train()[trainer.steps_per_epoch:]  # the first epoch warms up
    return sum(m["tokens"] for m in second) / sum(m["step_time_s"] for m in second)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--repeats", type=int, default=1,
                        help="learner and SFT timings per mode (the median is reported)")
    parser.add_argument("--groups-per-call", type=int, default=0,
                        help="shared-call rollout width (0 = all the step's groups at once)")
    parser.add_argument("--work", default="runs/learning_speed")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import torch

    from trainers.rl.config import load_rl_config

    config = load_rl_config(args.config)
    config.run = dataclasses.replace(config.run, use_ray=False)
    config.rollout = dataclasses.replace(config.rollout, num_workers=0)
    # One PPO epoch: SFT's tokens/s is one pass over the data, so the learner's is too (the
    # config's ppo_epochs repeats the update on the same tokens).
    config.learner = dataclasses.replace(config.learner, num_learners=1, ppo_epochs=1)
    if config.policy.threads:
        torch.set_num_threads(config.policy.threads)
    print(f"config {args.config}: {config.rollout.queries_per_step} queries x "
          f"{config.rollout.group_size}, policy {config.policy.path}, "
          f"{torch.get_num_threads()} threads", flush=True)
    wide = args.groups_per_call or config.rollout.queries_per_step
    results, single_s = roll_out(config, 1)
    shared_results, shared_s = roll_out(config, wide)
    same = [t.input_ids for r in results for t in r.trajectories] == \
        [t.input_ids for r in shared_results for t in r.trajectories]
    tokens = sum(r.stats.generated_tokens for r in results)
    print(f"PHASE rollout_group_by_group {single_s:.2f}  ({tokens} generated tokens)")
    print(f"PHASE rollout_shared_calls {shared_s:.2f}  ({wide} groups per call; identical "
          f"trajectories: {same})", flush=True)

    timings: dict[bool, list[tuple[float, float, int]]] = {True: [], False: []}
    for _ in range(max(1, args.repeats)):
        for packing in (False, True):
            timings[packing].append(learner_step(config, results, packing))
    phases = {}
    for packing, runs in timings.items():
        name = "packed" if packing else "padded"
        score_s = statistics.median(r[0] for r in runs)
        update_s = statistics.median(r[1] for r in runs)
        phases[packing] = (score_s, update_s, runs[0][2])
        print(f"PHASE {name}_score {score_s:.2f}")
        print(f"PHASE {name}_update {update_s:.2f}  ({runs[0][2]} trajectory tokens, "
              f"{runs[0][2] / (score_s + update_s):.0f} tok/s over score + update)", flush=True)
    sft = statistics.median(sft_tokens_per_s(config, results, Path(args.work) / f"sft{i}")
                            for i in range(max(1, args.repeats)))
    print(f"PHASE sft_tokens_per_s {sft:.0f}", flush=True)

    score_s, update_s, traj_tokens = phases[True]
    rollout_s = min(single_s, shared_s)
    before = single_s + phases[False][0] + phases[False][1]
    after = rollout_s + score_s + update_s
    print(f"RESULT learner_vs_sft={traj_tokens / (score_s + update_s) / sft:.3f}")
    print(f"RESULT rl_step_s={after:.2f}")
    print(f"RESULT rl_step_speedup={before / after:.3f}")
    print(f"RESULT rollout_shared_speedup={single_s / shared_s:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
