"""The SFT recipe: train a tiny causal LM on oracle trajectories, then run it as a policy.

    venus-gym sft --config my_sft.yaml

Several configs run one after the other, each pass able to start from the previous one's
final model (a later config's model.name and model.tokenizer name the earlier
train.output_dir/final); every config is loaded and checked before the first one trains:

    venus-gym sft --config first.yaml second.yaml third.yaml

`dotted.key=value` overrides after the config file(s) apply to every config, typed and
checked like the file's own values; `--print-config` prints the resolved configs and exits:

    venus-gym sft --config my_sft.yaml train.lr=1e-3 data.num_episodes=32 --print-config

Steps: train a BPE tokenizer on the embedded world's text; let the oracle agent write SFT
trajectories on the *train* split; masked SFT with packing (trainers.sft); then decoding
(greedy, or sampled with eval.temperature over eval.seeds, optionally with DR-Venus's turn
retries, eval.retries) in DeepResearch-v0 on the held-out *test* split, counting format-valid
turns (env info["valid"]; a retried attempt counts as malformed) and correct answers.
Writes metrics.jsonl, the final model and eval.json under train.output_dir and prints
`RESULT name=value` lines.

Honest settings (docs/sft.md): the environment's own system prompt (full or compact, as
`env.prompt_style` says; the evaluation uses the same), hops (1, 2),
search_top_k=3 (short search results keep episodes ~2K tokens), a world-trained tokenizer;
nothing about the environment is simplified for the model beyond those arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from trainers.config_utils import config_to_yaml, is_override
from trainers.engines.hf import HFEngine
from trainers.evaluation.evaluate import evaluate
from trainers.modeling.models import resolve_device
from trainers.rollout import SamplingConfig
from trainers.sft.config import SFTExperimentConfig, config_to_dict, load_config
from trainers.sft.pipeline import (
    build_chat,
    build_model,
    build_samples,
    build_tokenizer,
    prepare_model,
    train_sft,
)
from trainers.sft.trainer import STATE_FILE
from trainers.sft.warmup import InductionWarmupError


def evaluation_sampling(config: SFTExperimentConfig) -> SamplingConfig:
    """How the recipe's evaluation decodes: the config's token cap and temperature (each
    pass over the tasks is seeded with its eval seed)."""
    return SamplingConfig(max_turn_tokens=config.eval.max_new_tokens,
                          temperature=config.eval.temperature)


def evaluate_model(config: SFTExperimentConfig, model: torch.nn.Module,
                   chat: Any) -> dict[str, float]:
    """Play the held-out tasks once per eval seed. Returns the rates over all episodes and,
    with several seeds, each seed's format-valid rate and accuracy (the spread is the noise
    of one 50-task evaluation)."""
    return evaluate(HFEngine(model, chat.tokenizer), chat, config.eval_env_kwargs(),
                    num_tasks=config.eval.num_tasks, seeds=config.eval.seeds,
                    sampling=evaluation_sampling(config), max_retries=config.eval.retries,
                    progress=True).summary()


def train_and_evaluate(config: SFTExperimentConfig, evaluate_untrained: bool = False
                       ) -> dict[str, float]:
    """Run the whole recipe on one config; returns the result numbers."""
    if config.train.threads_per_worker:
        torch.set_num_threads(config.train.threads_per_worker)
    print("config: " + json.dumps(config_to_dict(config)), flush=True)
    output_dir = Path(config.train.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    tokenizer = build_tokenizer(config.model, config.env_kwargs(), config.data.world_seeds)
    chat = build_chat(tokenizer, config.model.chat_template)
    model = prepare_model(config, tokenizer)  # the warm-up first: a miss costs no data time
    data_started = time.perf_counter()
    samples = build_samples(config, chat)
    print(f"data: {len(samples)} samples, {sum(map(len, samples))} tokens "
          f"({time.perf_counter() - data_started:.1f} s)", flush=True)
    results: dict[str, float] = {}
    device = resolve_device(config.train.device, "train.device")
    if evaluate_untrained:  # the same seeded initialisation prepare_model starts from
        untrained = build_model(config.model, tokenizer).to(device)
        results.update({f"untrained_{key}": value
                        for key, value in evaluate_model(config, untrained, chat).items()})
    model, tokenizer, history = train_sft(config, samples, model)
    results["train_loss_last"] = history[-1]["loss"] if history else float("nan")
    results["train_tokens_per_s"] = sum(m["tokens"] for m in history) / max(
        1e-9, sum(m["step_time_s"] for m in history)) if history else 0.0
    results.update(evaluate_model(config, model, chat))
    results["wall_s"] = time.perf_counter() - started
    (output_dir / "eval.json").write_text(json.dumps(results, indent=2))
    return results


def evaluate_checkpoint(config: SFTExperimentConfig, checkpoint: str) -> dict[str, float]:
    """Evaluate the weights of a training checkpoint (checkpoint-NNNNNNN) or of a saved model
    (train.output_dir/final) under the config's tokenizer and decoding (no training)."""
    if config.train.threads_per_worker:
        torch.set_num_threads(config.train.threads_per_worker)
    tokenizer = build_tokenizer(config.model, config.env_kwargs(), config.data.world_seeds)
    chat = build_chat(tokenizer, config.model.chat_template)
    model = build_model(config.model, tokenizer)
    if (Path(checkpoint) / STATE_FILE).exists():  # a training checkpoint
        state = torch.load(Path(checkpoint) / STATE_FILE, map_location="cpu",
                           weights_only=False)
        step, weights = state["step"], state["model"]
    elif (Path(checkpoint) / "config.json").exists():  # a saved model (train.output_dir/final)
        step = "final"
        weights = AutoModelForCausalLM.from_pretrained(checkpoint).state_dict()
    else:
        raise FileNotFoundError(f"{checkpoint} holds neither a training checkpoint "
                                f"({STATE_FILE}) nor a saved model (config.json)")
    try:
        model.load_state_dict(weights)
    except RuntimeError as error:  # e.g. a 3-layer model under a config that grows to 5
        raise ValueError(f"the weights in {checkpoint} do not fit the model the config builds "
                         f"(model.name {config.model.name!r}, grow_layers_after "
                         f"{list(config.model.grow_layers_after)}): {error}") from error
    model = model.to(resolve_device(config.train.device, "train.device"))
    return {"step": step, **evaluate_model(config, model, chat)}


def build_parser(prog: str | None = None,
                 default_config: str | None = None) -> argparse.ArgumentParser:
    """The options of `venus-gym sft`; --config is required unless a default is given."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="+", metavar="FILE",
                        required=default_config is None,
                        default=None if default_config is None else [default_config],
                        help="one or more configs, run in the given order (a later one may "
                             "start from an earlier one's train.output_dir/final), then "
                             "KEY=VALUE overrides applied to each")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", default=[],
                        help="config overrides, e.g. train.lr=1e-3 data.num_episodes=32 "
                             "(values are YAML; unknown keys refused with the closest names)")
    parser.add_argument("--print-config", action="store_true",
                        help="print each resolved config (file + overrides + options) as "
                             "YAML and exit")
    parser.add_argument("--evaluate-untrained", action="store_true",
                        help="also evaluate the randomly initialised model first")
    parser.add_argument("--resume", default=None,
                        help="override train.resume: a checkpoint directory or 'latest'")
    parser.add_argument("--threads", type=int, default=None,
                        help="override train.threads_per_worker (torch threads)")
    parser.add_argument("--eval-checkpoint", default=None,
                        help="only evaluate the weights of this checkpoint directory or saved "
                             "model directory (e.g. runs/<run>/final)")
    parser.add_argument("--world", default=None,
                        help="override env.world: 'synthetic' (generated), 'hotpotqa', a QA "
                             "JSONL or a saved world directory (docs/worlds.md)")
    parser.add_argument("--eval-tasks", type=int, default=None,
                        help="override eval.num_tasks")
    parser.add_argument("--eval-world-seed", type=int, default=None,
                        help="override eval.world_seed: play the test tasks of this world "
                             "(a validation world no training data came from)")
    parser.add_argument("--eval-temperature", type=float, default=None,
                        help="override eval.temperature (0 = greedy)")
    parser.add_argument("--eval-seeds", type=int, nargs="+", default=None,
                        help="override eval.seeds (sampling seeds; each plays every task)")
    parser.add_argument("--eval-retries", type=int, default=None,
                        help="override eval.retries (DR-Venus inference retries of malformed, "
                             "repetitive, empty or duplicate turns; needs a temperature > 0)")
    return parser


def _is_file(name: str) -> bool:
    """Whether `name` is an existing file; False for a name no file can have (a long
    override is not a file name: the OS refuses it with ENAMETOOLONG)."""
    try:
        return Path(name).is_file()
    except OSError:
        return False


def main(argv: list[str] | None = None, prog: str | None = None,
         default_config: str | None = None) -> int:
    """`venus-gym sft`: run (or, with --eval-checkpoint, only evaluate) each config in
    order and print its RESULT lines. A missed induction warm-up target exits with the
    advice (a setting to change, not a bug)."""
    parser = build_parser(prog, default_config)
    args = parser.parse_args(argv)
    # --config FILE... takes every word after it: the KEY=VALUE ones are overrides.
    overrides = [*(item for item in args.config if is_override(item)
                   and not _is_file(item)), *args.overrides]
    args.config = [item for item in args.config if item not in overrides]
    if not args.config:
        parser.error("--config needs at least one config file before the overrides")
    if len(args.config) > 1 and (args.resume or args.eval_checkpoint):
        parser.error("--resume and --eval-checkpoint name one run: give them one --config")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Load every config first: a typo in the third fails now, not after an hour of training.
    try:
        configs = [(path, load_config(path, overrides=overrides)) for path in args.config]
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))
    for path, config in configs:
        if args.world is not None:
            try:  # replace() and __post_init__ re-run the env and world checks
                config.env = dataclasses.replace(config.env, world=args.world)
                config.__post_init__()
            except ValueError as error:
                parser.error(f"{path}: {error}")
        if args.resume is not None:
            config.train.resume = args.resume
        if args.threads is not None:
            config.train.threads_per_worker = args.threads
        if args.eval_tasks is not None:
            config.eval.num_tasks = args.eval_tasks
        if args.eval_world_seed is not None:
            config.eval.world_seed = args.eval_world_seed
        decoding = {"temperature": args.eval_temperature, "retries": args.eval_retries,
                    "seeds": None if args.eval_seeds is None else tuple(args.eval_seeds)}
        decoding = {key: value for key, value in decoding.items() if value is not None}
        if decoding:  # replace() re-runs EvalConfig's checks on the new combination
            try:
                config.eval = dataclasses.replace(config.eval, **decoding)
            except ValueError as error:
                parser.error(f"{path}: {error}")
        if len(configs) > 1:
            print(f"== {path}", flush=True)
        if args.print_config:
            print(config_to_yaml(config), end="", flush=True)
            continue
        if args.eval_checkpoint:
            results = evaluate_checkpoint(config, args.eval_checkpoint)
        else:
            try:
                results = train_and_evaluate(config, args.evaluate_untrained)
            except InductionWarmupError as error:  # a setting to change, not a bug
                sys.exit(f"{path}: {error}")
        for key, value in results.items():
            print(f"RESULT {key}={value:.4f}" if isinstance(value, float)
                  else f"RESULT {key}={value}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
