"""Does information gain carry content? IG with the gold answer vs IG with wrong answers.

    python benchmarks/ig_content.py --policy warm-start              # the packaged policy
    python benchmarks/ig_content.py --policy runs/demo/sft/final     # a trained policy
    python benchmarks/ig_content.py                                  # trains a quick one first

A packaged policy (`warm-start`, or any directory with a warm_start.json) is measured in its
own env settings (prompt style, hops, search width) on world --world-seed (default 0, which
its SFT never saw); other policies in the demo SFT config's env.

For oracle trajectories (the scripted agent's searches and visits, tokenised with the
policy's own chat template) on tasks of the policy's world, the first visit's IG is computed
three ways (trainers.algorithms.rewards `ig_baseline`):

    question       s(after the visit) - s(question only)          (the paper)
    previous_turn  s(after the visit) - s(just before the visit)
    contrastive    c(after the visit) - c(question only), c = s_a - mean of s over the other
                   answers of the pool

each with the gold answer as the target and with each wrong answer (other tasks' gold
answers) as the target. A variant carries content when IG with the gold answer exceeds IG
with wrong ones: the page raised the policy's belief in *this* answer, not in answering.
Prints, per variant, the mean IG for gold and for wrong answers and their paired difference
with its standard error over trajectories, then `RESULT ig_content_<variant>=<gap / SE>`.

Without --policy the script first trains a small SFT policy from scratch
(trainers/configs/demo_sft.yaml with fewer episodes, --sft-episodes: 150 steps, about 5-8
minutes on 2 cores); numbers from such a policy are about a policy that barely reads.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import tempfile
import time
from pathlib import Path

import torch

from trainers.algorithms.information_gain import InformationGainConfig, fast_probe_scores
from trainers.algorithms.probes import build_probe_template, build_probes, encode_text
from trainers.batch import collate, record_from_trajectory
from trainers.data.oracle_data import (
    OracleDataConfig,
    generate_oracle_trajectories,
    tokenize_trajectories,
)
from trainers.modeling.models import load_policy
from trainers.modeling.warm_start import warm_start_info

DEMO_SFT = Path(__file__).resolve().parents[1] / "trainers" / "configs" / "demo_sft.yaml"
VARIANTS = ("question", "previous_turn", "contrastive")


def quick_sft(output_dir: Path, episodes: int) -> tuple[str, dict]:
    """Train the demo's SFT recipe on fewer episodes; returns the policy directory and env."""
    from trainers.sft.config import load_config
    from trainers.sft.pipeline import train_sft

    config = load_config(DEMO_SFT)
    config.data = dataclasses.replace(config.data, num_episodes=episodes)
    config.train = dataclasses.replace(config.train, output_dir=str(output_dir),
                                       progress_bar=False, log_every=100)
    train_sft(config)
    return str(output_dir / "final"), config.env_kwargs()


def demo_env() -> dict:
    from trainers.sft.config import load_config

    return load_config(DEMO_SFT).env_kwargs()


def first_visit(trajectory) -> int | None:
    for index, turn in enumerate(trajectory.turns[:-1]):
        if turn.kind == "visit" and turn.valid:
            return index
    return None


def contrast(scores: torch.Tensor) -> torch.Tensor:
    """[A] scores -> [A] contrastive scores: each answer's minus the mean of the others'."""
    return scores - (scores.sum() - scores) / (len(scores) - 1)


def paired(values: list[float]) -> tuple[float, float]:
    """Mean and its standard error."""
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / max(1, n - 1)
    return mean, math.sqrt(var / n)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="", help="trained policy directory (default: "
                        "train a quick SFT policy first)")
    parser.add_argument("--sft-episodes", type=int, default=300,
                        help="episodes of the quick SFT policy (without --policy)")
    parser.add_argument("--trajectories", type=int, default=40, help="oracle trajectories")
    parser.add_argument("--wrong", type=int, default=6, help="wrong answers per trajectory")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--world-seed", type=int, default=0,
                        help="the world of a packaged policy's measurement")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()

    env_kwargs = demo_env()
    policy = args.policy
    info = warm_start_info(policy) if policy else None
    if info is not None:  # the packaged policy's own env settings, on an unseen world
        env_kwargs = {**env_kwargs, **info["env"], "world_size": info["world_size"],
                      "world_seed": args.world_seed}
        print(f"{policy}: env {info['env']}, world {info['world_size']} pages, seed "
              f"{args.world_seed}")
    if not policy:
        workdir = Path(tempfile.mkdtemp(prefix="ig_content_"))
        policy, env_kwargs = quick_sft(workdir / "sft", args.sft_episodes)
        print(f"quick SFT policy: {policy} ({time.perf_counter() - started:.0f} s)")
    model, tokenizer, chat = load_policy(policy)
    model.eval()

    # Oracle episodes with a different seed from the SFT data's (seed 0).
    oracle = OracleDataConfig(num_episodes=args.trajectories, seed=1000 + args.seed,
                              env_kwargs=env_kwargs, plan_steps=False)
    trajectories = [t for t in tokenize_trajectories(generate_oracle_trajectories(oracle), chat)
                    if first_visit(t) is not None]
    golds = [t.answers[0] for t in trajectories]
    template = build_probe_template(tokenizer, list(chat.generation_prompt_ids)
                                    + encode_text(tokenizer, "<think>\n"),
                                    eos_token_id=chat.end_of_turn_id)
    rng = random.Random(args.seed)
    gaps: dict[str, list[float]] = {v: [] for v in VARIANTS}
    means: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    for index, trajectory in enumerate(trajectories):
        gold = golds[index].strip()
        pool = sorted({g.strip() for g in golds if g.strip().lower() != gold.lower()})
        wrong = rng.sample(pool, min(args.wrong, len(pool)))
        if not wrong:
            continue
        answers = [gold] + wrong
        batch = collate([record_from_trajectory(trajectory, group_id=0)])
        visit = first_visit(trajectory)
        question = int(batch.question_end[0])
        before = int(batch.turn_end[0, visit - 1]) if visit > 0 else question
        after = int(batch.turn_end[0, visit])
        # Causal attention: the scores up to the visit's boundary read only that prefix.
        scores = fast_probe_scores(
            model, batch.input_ids[0, :after], torch.tensor([question, before, after]),
            build_probes(tokenizer, template, answers), InformationGainConfig()).scores
        s_question, s_before, s_after = scores[0], scores[1], scores[2]  # [A] each
        ig = {"question": s_after - s_question, "previous_turn": s_after - s_before,
              "contrastive": contrast(s_after) - contrast(s_question)}
        for variant, values in ig.items():
            gold_ig, wrong_ig = float(values[0]), float(values[1:].mean())
            gaps[variant].append(gold_ig - wrong_ig)
            means[variant].append((gold_ig, wrong_ig))

    n = len(gaps["question"])
    print(f"policy {policy}: {n} oracle trajectories with a visit, "
          f"{args.wrong} wrong answers each ({time.perf_counter() - started:.0f} s)")
    print(f"{'variant':<15} {'IG gold':>9} {'IG wrong':>9} {'gap':>8} {'SE':>7} {'gap/SE':>7}")
    for variant in VARIANTS:
        gold_mean = sum(g for g, _ in means[variant]) / n
        wrong_mean = sum(w for _, w in means[variant]) / n
        gap, se = paired(gaps[variant])
        z = gap / se if se > 0 else float("nan")
        print(f"{variant:<15} {gold_mean:>9.3f} {wrong_mean:>9.3f} {gap:>8.3f} {se:>7.3f} "
              f"{z:>7.2f}")
    for variant in VARIANTS:
        gap, se = paired(gaps[variant])
        print(f"RESULT ig_content_{variant}={gap / se if se > 0 else float('nan'):.2f}")


if __name__ == "__main__":
    main()
