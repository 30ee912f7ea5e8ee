"""Train a tiny causal LM from scratch on oracle trajectories, then run it as a policy.

    .venv/bin/python examples/sft_tiny.py --config examples/configs/sft_tiny.yaml

Several configs run one after the other, e.g. the three passes of the best from-scratch
result (docs/benchmarks.md, seventh session; each pass starts from the previous one's
final model; ~2.2 h on 2 cores; a fourth pass, sft_compact_fourth.yaml, made it worse):

    .venv/bin/python examples/sft_tiny.py --config examples/configs/sft_compact.yaml \
        examples/configs/sft_compact_more.yaml examples/configs/sft_compact_third.yaml

Steps: train a BPE tokenizer on the embedded world's text; let the oracle agent write SFT
trajectories on the *train* split; masked SFT with packing (trainers.sft); then greedy
decoding in DeepResearch-v0 on the held-out *test* split, counting format-valid turns
(env info["valid"]) and correct answers. Writes metrics.jsonl, the final model and
eval.json under train.output_dir and prints `RESULT name=value` lines.

Honest settings (docs/sft.md): the environment's own system prompt (full or compact, as
`env.prompt_style` says; the evaluation uses the same), hops (1, 2),
search_top_k=3 (short search results keep episodes ~2K tokens), a world-trained tokenizer;
nothing about the environment is simplified for the model beyond those arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from trainers.policy import TransformersPolicy, evaluate_policy  # noqa: E402
from trainers.sft.config import SFTExperimentConfig, config_to_dict, load_config  # noqa: E402
from trainers.sft.pipeline import (  # noqa: E402
    build_chat,
    build_model,
    build_samples,
    build_tokenizer,
    train_sft,
)
from trainers.sft.trainer import STATE_FILE, resolve_device  # noqa: E402


def evaluation_policy(config: SFTExperimentConfig, model: torch.nn.Module,
                      chat: Any) -> TransformersPolicy:
    """The policy the example evaluates: the model with the config's decoding settings."""
    return TransformersPolicy(model, chat, max_new_tokens=config.eval.max_new_tokens,
                              temperature=config.eval.temperature)


def train_and_evaluate(config: SFTExperimentConfig, evaluate_untrained: bool = False
                       ) -> dict[str, float]:
    """Run the whole example; returns the result numbers."""
    if config.train.threads_per_worker:
        torch.set_num_threads(config.train.threads_per_worker)
    print("config: " + json.dumps(config_to_dict(config)), flush=True)
    output_dir = Path(config.train.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    tokenizer = build_tokenizer(config.model, config.env_kwargs(), config.data.world_seeds)
    chat = build_chat(tokenizer)
    samples = build_samples(config, chat)
    print(f"data: {len(samples)} samples, {sum(map(len, samples))} tokens "
          f"({time.perf_counter() - started:.1f} s)", flush=True)
    results: dict[str, float] = {}
    eval_env = config.eval_env_kwargs()
    device = resolve_device(config.train.device)

    def evaluate(model: torch.nn.Module, prefix: str) -> None:
        policy = evaluation_policy(config, model, chat)
        evaluation = evaluate_policy(policy, eval_env, num_tasks=config.eval.num_tasks)
        for key, value in evaluation.summary().items():
            results[f"{prefix}{key}"] = value

    if evaluate_untrained:  # the same seeded initialisation train_sft starts from
        evaluate(build_model(config.model, tokenizer).to(device), "untrained_")
    model, tokenizer, history = train_sft(config, samples)
    results["train_loss_last"] = history[-1]["loss"] if history else float("nan")
    results["train_tokens_per_s"] = sum(m["tokens"] for m in history) / max(
        1e-9, sum(m["step_time_s"] for m in history)) if history else 0.0
    evaluate(model, "")
    results["wall_s"] = time.perf_counter() - started
    (output_dir / "eval.json").write_text(json.dumps(results, indent=2))
    return results


def evaluate_checkpoint(config: SFTExperimentConfig, checkpoint: str) -> dict[str, float]:
    """Evaluate the model weights of a saved training checkpoint (no training)."""
    if config.train.threads_per_worker:
        torch.set_num_threads(config.train.threads_per_worker)
    tokenizer = build_tokenizer(config.model, config.env_kwargs(), config.data.world_seeds)
    chat = build_chat(tokenizer)
    model = build_model(config.model, tokenizer)
    state = torch.load(Path(checkpoint) / STATE_FILE, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    model = model.to(resolve_device(config.train.device))
    policy = evaluation_policy(config, model, chat)
    evaluation = evaluate_policy(policy, config.eval_env_kwargs(),
                                 num_tasks=config.eval.num_tasks)
    return {"step": state["step"], **evaluation.summary()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="+", default=["examples/configs/sft_tiny.yaml"],
                        help="one or more configs, run in the given order (a later one may "
                             "start from an earlier one's train.output_dir/final)")
    parser.add_argument("--evaluate-untrained", action="store_true",
                        help="also evaluate the randomly initialised model first")
    parser.add_argument("--resume", default=None,
                        help="override train.resume: a checkpoint directory or 'latest'")
    parser.add_argument("--threads", type=int, default=None,
                        help="override train.threads_per_worker (torch threads)")
    parser.add_argument("--eval-checkpoint", default=None,
                        help="only evaluate this checkpoint directory's weights")
    parser.add_argument("--eval-tasks", type=int, default=None,
                        help="override eval.num_tasks")
    parser.add_argument("--eval-world-seed", type=int, default=None,
                        help="override eval.world_seed: play the test tasks of this world "
                             "(a validation world no training data came from)")
    args = parser.parse_args()
    if len(args.config) > 1 and (args.resume or args.eval_checkpoint):
        parser.error("--resume and --eval-checkpoint name one run: give them one --config")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Load every config first: a typo in the third fails now, not after an hour of training.
    configs = [(path, load_config(path)) for path in args.config]
    for path, config in configs:
        if args.resume is not None:
            config.train.resume = args.resume
        if args.threads is not None:
            config.train.threads_per_worker = args.threads
        if args.eval_tasks is not None:
            config.eval.num_tasks = args.eval_tasks
        if args.eval_world_seed is not None:
            config.eval.world_seed = args.eval_world_seed
        if len(configs) > 1:
            print(f"== {path}", flush=True)
        if args.eval_checkpoint:
            results = evaluate_checkpoint(config, args.eval_checkpoint)
        else:
            results = train_and_evaluate(config, args.evaluate_untrained)
        for key, value in results.items():
            print(f"RESULT {key}={value:.4f}" if isinstance(value, float)
                  else f"RESULT {key}={value}", flush=True)


if __name__ == "__main__":
    main()
