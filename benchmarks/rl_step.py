"""Where the time of one RL step goes, and what one-step-off-policy rollouts buy.

    python benchmarks/rl_step.py --device cpu                     # tiny Qwen3, ~3 min on 2 cores
    python benchmarks/rl_step.py --device cuda                    # Qwen3 ~0.5B, one GPU
        [--config examples/configs/gpu_igpo_qwen3_0p5b.yaml] [--engine auto|hf|vllm]
        [--steps 2] [--async-steps 4] [--work runs/rl_step]

The policy is built from a config (random weights: trainers.modeling.models.build_tiny_causal_lm with a
tokenizer trained on the world's text), so nothing is downloaded: `--preset tiny` (hidden 64,
2 layers) on the CPU, `qwen3_0p5b` (Qwen3 shape: hidden 1024, 28 layers, 16 query and 8
key/value heads of 128, MLP 3072, tied embeddings; 0.46B parameters with a 16K vocabulary)
on CUDA. A random policy writes malformed turns until the per-turn token cap, so rollouts
are long and uniform: the timing of the machinery, not of a trained agent's episodes.

Phases (`--steps` IGPO steps in this process, the first a warm-up; the last one reported):
    rollout        G environments per query, token in / token out (the engine of the config)
    score          IGPO's fused forward: old log-probs and the IG probes at every boundary
    old_logprobs   a plain forward for the old log-probs alone (what GRPO pays)
    ig_scoring     score - old_logprobs: what information gain adds
    update         the PPO epochs over the mini-batches (forward, backward, optimizer)
    weight_sync    the learner's weights into the engine (the config's sync.method path)

Prints `PHASE name seconds`, then
    RESULT ig_share=<float>               ig_scoring / (rollout + score + update + sync)
    RESULT rollout_tokens_per_s_per_gpu=  generated tokens / rollout seconds / GPUs (cuda)
    RESULT learner_tokens_per_s_per_gpu=  batch tokens x ppo_epochs / update seconds / GPUs
    RESULT ig_gap_mean_abs=<float>        mean |IG(weights that generated) - IG(updated
                                          weights)| over every turn of the last batch: the
                                          error async rollouts make by scoring IG with the
                                          newer weights (one update apart)
    RESULT ig_gap_relative=<float>        that / mean |IG(updated weights)|
    RESULT async_speedup=<float>          (with --async-steps N > 1) steps per hour of
                                          run.async_rollouts over the same run synchronous,
                                          N steps each, equal samples, steps 2..N timed
The async comparison runs the trainer (trainers.rl.driver.train) twice; on CUDA on Ray with
the learner and one rollout worker sharing the GPU (gpus 0.5 each), on the CPU in-process,
where async rollouts do not overlap the update (the ratio then shows the bookkeeping cost).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib.util
import time
from pathlib import Path
from typing import Any

import torch

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"hidden": 64, "layers": 2, "heads": 2, "vocab": 2048},
    "qwen3_0p5b": {"hidden": 1024, "layers": 28, "heads": 16, "kv_heads": 8, "head_dim": 128,
                   "intermediate": 3072, "vocab": 16384},
}
DEFAULT_CUDA_CONFIG = "examples/configs/gpu_igpo_qwen3_0p5b.yaml"


def cpu_config() -> Any:
    """A 2-query x G=4 IGPO step on a small generated world (CPU)."""
    from trainers.rl.config import RLConfig

    config = RLConfig()
    config.policy.threads = 1
    config.env = dataclasses.replace(config.env, hops=(1,), search_top_k=2, max_turns=3,
                                     max_context_tokens=1500, world_size=300, world_seed=3)
    config.rollout = dataclasses.replace(config.rollout, group_size=4, queries_per_step=2,
                                         max_turn_tokens=48, max_context_tokens=2048)
    # A random policy's turns are all malformed, so every advantage is 0; the entropy bonus
    # makes each update move the weights, as a real one would (ig_gap needs that).
    config.algorithm.options = {"loss": {"tis_cap": 2.0, "entropy_coef": 0.01}}
    config.learner = dataclasses.replace(config.learner, lr=1e-4, micro_batch_size=4)
    config.eval = dataclasses.replace(config.eval, num_tasks=1, max_turn_tokens=24, before=False)
    config.run = dataclasses.replace(config.run, progress_bar=False, tensorboard="off",
                                     save_every=0, sample_trajectories=1)
    return config


def build_policy(directory: Path, preset: str, env: Any) -> str:
    """A random Qwen3 of `preset` with a world-trained tokenizer, saved to `directory`."""
    from trainers.data.oracle_data import world_texts
    from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm

    shape = dict(PRESETS[preset])
    if (directory / "config.json").is_file():
        return str(directory)
    world = {"world_size": env.world_size, "world_seed": env.world_seed}
    tokenizer = build_chatml_tokenizer(world_texts(world), vocab_size=shape.pop("vocab"))
    model = build_tiny_causal_lm(tokenizer, arch="qwen3", seed=0, **shape)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


def timed(device: str, call: Any, *args: Any) -> tuple[Any, float]:
    """call(*args) and its wall-clock seconds (CUDA work included)."""
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    value = call(*args)
    if device == "cuda":
        torch.cuda.synchronize()
    return value, time.perf_counter() - started


def every_turn_ig(model: Any, learner: Any, batch: Any, answers: list[list[str]]
                  ) -> torch.Tensor:
    """[B, T] probe-score differences between consecutive boundaries (question first) of
    every turn, valid or not, scored by `model` (a random policy has no valid visit turn, so
    the IGPO reward's own IG turns would leave nothing to compare)."""
    from trainers.algorithms.information_gain import (
        InformationGainConfig,
        boundary_positions,
        score_batch,
    )
    from trainers.algorithms.probes import build_probes

    template = learner.algorithm.probe_template(learner.scoring())  # IGPO (or its placebo)
    probes = [build_probes(learner.tokenizer, template, gold) for gold in answers]
    slots = boundary_positions(batch) >= 0
    with torch.no_grad():
        scores = score_batch(model, batch, probes, slots,
                             InformationGainConfig(temperature=learner.temperature)
                             ).boundary_scores
    return scores[:, 1:] - scores[:, :-1]


def phases(config: Any, device: str, steps: int) -> dict[str, float]:
    """Time the phases of `steps` in-process IGPO steps; the last step's numbers."""
    from trainers.modeling.models import load_tokenizer
    from trainers.rl.cluster import start_workers
    from trainers.rl.driver import ppo_update, step_jobs, to_batch
    from trainers.rl.weight_updates import WeightSync

    algorithm = config.algorithm.build()
    tokenizer, _ = load_tokenizer(config.policy.path)
    workers = start_workers(config, algorithm)
    learner = workers.learners.group.workers[0]  # in-process: the Learner object itself
    sync = WeightSync(workers.learners, workers.rollouts)
    out: dict[str, float] = {}
    try:
        sync.push(0)
        num_tasks = workers.rollouts.num_tasks()
        for step in range(steps):
            jobs = step_jobs(config.run.seed, step, config.rollout.queries_per_step, num_tasks)
            results, rollout_s = timed(device, workers.rollouts.rollout, jobs)
            batch, answers = to_batch(results, tokenizer.pad_token_id or 0)
            distractors = algorithm.probe_distractors(batch, answers)
            scored, score_s = timed(device, workers.learners.score, batch, answers,
                                    distractors)
            _, old_s = timed(device, learner._logprobs, learner.scorer, batch, False)
            rewards = algorithm.turn_rewards(scored)
            advantages = algorithm.advantages(scored, rewards)
            scored = scored.replace(advantages=advantages.tokens)
            before = copy.deepcopy(learner.scorer) if step == steps - 1 else None
            _, update_s = timed(device, ppo_update, workers.learners, scored, config.learner)
            _, sync_s = timed(device, sync.push, step + 1)
            generated = sum(r.stats.generated_tokens for r in results)
            tokens = int(batch.attention_mask.sum()) * config.learner.ppo_epochs
            out = {"rollout": rollout_s, "score": score_s, "old_logprobs": old_s,
                   "ig_scoring": max(0.0, score_s - old_s), "update": update_s,
                   "weight_sync": sync_s, "generated_tokens": float(generated),
                   "learner_tokens": float(tokens)}
        gen_ig = every_turn_ig(before, learner, batch, answers)
        new_ig = every_turn_ig(learner.scorer, learner, batch, answers)
        both = torch.isfinite(gen_ig) & torch.isfinite(new_ig)
        out["ig_gap_mean_abs"] = float((gen_ig - new_ig)[both].abs().mean())
        out["ig_gap_relative"] = out["ig_gap_mean_abs"] / max(
            float(new_ig[both].abs().mean()), 1e-12)
        out["ig_turns"] = float(both.sum())
    finally:
        for worker in workers.rollouts.group.workers:  # an in-process vLLM engine holds GPU memory
            getattr(worker.engine, "close", lambda: None)()
        workers.close()
        if device == "cuda":
            import gc

            gc.collect()
            torch.cuda.empty_cache()
    return out


def steps_per_hour(config: Any, output_dir: Path) -> float:
    """Run the trainer and time steps 2..N from metrics.jsonl's wall-clock stamps."""
    import shutil

    from trainers.rl.driver import train
    from trainers.run_log import read_metrics

    config = copy.deepcopy(config)
    config.run.output_dir = str(output_dir)
    shutil.rmtree(output_dir, ignore_errors=True)
    train(config)
    times = [row["time"] for row in read_metrics(output_dir / "metrics.jsonl")]
    return 3600.0 * (len(times) - 1) / max(times[-1] - times[0], 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--config", default="", help="RL YAML (default: built-in CPU config; "
                        f"{DEFAULT_CUDA_CONFIG} on cuda)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="",
                        help="policy shape when the config names no policy.path "
                             "(default: tiny on cpu, qwen3_0p5b on cuda)")
    parser.add_argument("--engine", choices=("auto", "hf", "vllm"), default="auto",
                        help="auto: the config's engine, but hf when vllm is not installed")
    parser.add_argument("--steps", type=int, default=2, help="phase-timed steps (first: warm-up)")
    parser.add_argument("--async-steps", type=int, default=-1,
                        help="steps per trainer run for async_speedup (0 = skip; default 4 "
                             "on cuda, 0 on cpu)")
    parser.add_argument("--work", default="runs/rl_step", help="policy and run directories")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no GPU")
    from trainers.rl.config import load_rl_config

    config_path = args.config or (DEFAULT_CUDA_CONFIG if args.device == "cuda" else "")
    config = load_rl_config(config_path) if config_path else cpu_config()
    work = Path(args.work)
    preset = args.preset or ("qwen3_0p5b" if args.device == "cuda" else "tiny")
    if not config.policy.path:
        config.policy.path = build_policy(work / f"policy-{preset}", preset, config.env)
    engine = config.rollout.engine if args.engine == "auto" else args.engine
    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        print("vllm is not installed: the transformers engine rolls out", flush=True)
        engine = "hf"
    config.rollout.engine = engine
    if args.device == "cpu":
        config.learner.gpus_per_learner = config.rollout.gpus_per_worker = 0.0
    # Phases in this process: no Ray, one learner, one rollout worker.
    local = copy.deepcopy(config)
    local.run.use_ray, local.rollout.num_workers, local.learner.num_learners = False, 0, 1
    local.env.shared_search = False
    local.sync.method = "object_store"
    print(f"device {args.device} ({torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'})"
          f", engine {engine}, policy {config.policy.path}", flush=True)
    out = phases(local, args.device, max(1, args.steps))
    for name in ("rollout", "score", "old_logprobs", "ig_scoring", "update", "weight_sync"):
        print(f"PHASE {name} {out[name]:.3f}", flush=True)
    step_s = out["rollout"] + out["score"] + out["update"] + out["weight_sync"]
    print(f"PHASE step {step_s:.3f}")
    print(f"RESULT ig_share={out['ig_scoring'] / step_s:.4f}")
    gpus = 1 if args.device == "cuda" else 0
    if gpus:
        print(f"RESULT rollout_tokens_per_s_per_gpu="
              f"{out['generated_tokens'] / out['rollout'] / gpus:.1f}")
        print(f"RESULT learner_tokens_per_s_per_gpu="
              f"{out['learner_tokens'] / out['update'] / gpus:.1f}")
    else:
        print(f"rollout tokens/s {out['generated_tokens'] / out['rollout']:.1f}, learner "
              f"tokens/s {out['learner_tokens'] / out['update']:.1f} (CPU)")
    print(f"RESULT ig_gap_mean_abs={out['ig_gap_mean_abs']:.3e}  ({int(out['ig_turns'])} turns)")
    print(f"RESULT ig_gap_relative={out['ig_gap_relative']:.3e}", flush=True)

    async_steps = args.async_steps if args.async_steps >= 0 else (4 if gpus else 0)
    if async_steps > 1:
        runs = copy.deepcopy(config if gpus else local)
        runs.run.steps, runs.run.save_every = async_steps, 0
        runs.eval = dataclasses.replace(runs.eval, before=False, num_tasks=1)
        if runs.algorithm.build().config.loss.tis_cap is None:
            runs.algorithm.options = {**runs.algorithm.options,
                                      "loss": {**runs.algorithm.options.get("loss", {}),
                                               "tis_cap": 2.0}}
        on_ray = bool(gpus) and runs.run.use_ray and importlib.util.find_spec("ray") is not None
        if not on_ray:  # in-process: the async rollouts do not overlap the update
            runs.run.use_ray, runs.rollout.num_workers, runs.learner.num_learners = False, 0, 1
            runs.env.shared_search = False
        print(f"async comparison {'on Ray' if on_ray else 'in-process'}", flush=True)
        if on_ray:
            import ray

            from trainers.backends import init_ray

            init_ray(runs.run.ray_address, num_cpus=8)
        try:
            rates = {}
            for mode in (False, True):
                runs.run.async_rollouts = mode
                rates[mode] = steps_per_hour(runs, work / ("async" if mode else "sync"))
                print(f"{'async' if mode else 'sync'}: {rates[mode]:.1f} steps/hour", flush=True)
        finally:
            if on_ray:
                ray.shutdown()
        print(f"RESULT async_speedup={rates[True] / rates[False]:.3f}")


if __name__ == "__main__":
    main()
