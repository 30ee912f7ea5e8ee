"""Where did an RL run move the policy? Per-token log-probability changes on fixed trajectories.

    python benchmarks/token_drift.py --start warm-start --temperature 0.5 \
        --policies igpo=runs/learning_check/igpo/final placebo=runs/learning_check/placebo/final \
        --trajectories runs/learning_check/igpo/samples/*.jsonl

Scores the policy tokens (loss mask) of saved trajectories (an RL run's samples/, or any
trajectory JSONL with input_ids) under the start and each trained policy, with logits /
--temperature as the rollout and the learner do, and prints per bucket of the start's
probability of the token that was sampled: the share of tokens, the mean change of its
log-probability (trained - start) and the share of tokens that fell by more than 0.1 nats.
A bug hunt's tool: the PPO clip lets a confident token's probability fall much further in
one update than it can rise (ratio 0.8 takes p = 0.99 to 0.79; ratio 1.2 cannot lift it past
1), so random-sign updates (the placebo) should show up as falls concentrated on the
tokens the start was sure of. Prints `RESULT <policy>_dlogp_p<bucket>=` lines and the mean
change of each trajectory's summed log-probability, over all and over the correct and the
wrong ones (`<policy>_dlogp_per_{trajectory,correct,wrong}`, with their SE and median): a
policy that learned from outcomes raises its correct trajectories against its wrong ones.

Held-out episodes, such as the learning check's `played/<policy>.jsonl`, are saved without
token ids; they are tokenized here with the start's chat template (the text as SFT would see
it, which can differ from the ids the engine sampled), so the same question can be asked of
tasks no run trained on: does the update raise the start's correct held-out episodes?
"""

from __future__ import annotations

import argparse
import glob
import statistics

import torch

# Buckets of the start's probability of the sampled token (at the temperature).
EDGES = (0.0, 0.5, 0.9, 0.99, 0.999, 1.0)


def token_logprobs(model: torch.nn.Module, ids: list[int], mask: list[int],
                   temperature: float) -> torch.Tensor:
    """Log-probabilities (at logits / temperature) of the tokens where mask is 1, given the
    tokens before them; shape [policy tokens]."""
    inputs = torch.tensor([ids])
    with torch.no_grad():
        logits = model(input_ids=inputs, use_cache=False).logits[0, :-1].float() / temperature
    targets = inputs[0, 1:]
    chosen = torch.log_softmax(logits, -1).gather(1, targets[:, None])[:, 0]
    keep = torch.tensor(mask[1:], dtype=torch.bool)
    return chosen[keep]


def with_token_ids(trajectories: list, chat) -> list:
    """The trajectories, those saved without token ids (held-out play) tokenized with `chat`,
    the start policy's ChatTokenizer; the order is kept."""
    missing = [index for index, t in enumerate(trajectories) if not t.input_ids]
    if not missing:
        return trajectories
    from trainers.data.oracle_data import tokenize_trajectories

    tokenized = tokenize_trajectories([trajectories[i] for i in missing], chat)
    result = list(trajectories)
    for index, trajectory in zip(missing, tokenized):
        result[index] = trajectory
    return result


def mean_se_median(values: list[float]) -> tuple[float, float, float]:
    """Mean, its standard error and the median; nan where there are too few values."""
    if not values:
        return float("nan"), float("nan"), float("nan")
    se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else float("nan")
    return statistics.fmean(values), se, statistics.median(values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start", default="warm-start", help="the policy RL started from")
    parser.add_argument("--policies", nargs="+", required=True, metavar="NAME=DIR",
                        help="trained policies to compare with the start")
    parser.add_argument("--trajectories", nargs="+", required=True,
                        help="trajectory JSONL files (globs allowed)")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="the rollout temperature (logits are divided by it)")
    parser.add_argument("--limit", type=int, default=64, help="at most this many trajectories")
    args = parser.parse_args(argv)
    if not args.temperature > 0:
        raise SystemExit(f"--temperature must be > 0, got {args.temperature}")
    from rl_checks import parse_named_dirs  # a sibling: the script's folder is on sys.path

    policies = parse_named_dirs(args.policies, "--policies", saved_policy=True)

    from trainers.modeling.models import load_policy
    from trainers.trajectory import read_trajectories

    files = sorted({f for pattern in args.trajectories for f in glob.glob(pattern)})
    if not files:
        raise SystemExit(f"no file matches --trajectories {args.trajectories}")
    trajectories = [t for f in files for t in read_trajectories(f)
                    if t.input_ids or t.messages][:args.limit]
    if not trajectories:
        raise SystemExit(f"none of {len(files)} files holds a trajectory with input_ids or "
                         f"messages")
    torch.set_grad_enabled(False)
    start, _, chat = load_policy(args.start)
    start.eval()
    trajectories = with_token_ids(trajectories, chat)
    base = [token_logprobs(start, t.input_ids, t.loss_mask, args.temperature)
            for t in trajectories]
    start_p = torch.cat(base).exp()
    bucket = torch.bucketize(start_p, torch.tensor(EDGES[1:-1]), right=True)
    print(f"{len(trajectories)} trajectories from {len(files)} files, {start_p.numel()} "
          f"policy tokens, temperature {args.temperature}")
    header = "| policy | " + " | ".join(
        f"p in [{lo:g}, {hi:g}) share / mean dlogp / fell > 0.1" for lo, hi in
        zip(EDGES, EDGES[1:])) + " | dlogp per trajectory, mean ± SE: all / correct / wrong |"
    lines = [header, "|---" * (len(EDGES) + 1) + "|"]
    for name, path in policies.items():
        model = load_policy(path)[0].eval()
        moved = [token_logprobs(model, t.input_ids, t.loss_mask, args.temperature) - b
                 for t, b in zip(trajectories, base)]
        change = torch.cat(moved)
        cells = []
        for index, lo in enumerate(EDGES[:-1]):
            inside = bucket == index
            share = float(inside.float().mean())
            mean = float(change[inside].mean()) if inside.any() else float("nan")
            fell = float((change[inside] < -0.1).float().mean()) if inside.any() else float("nan")
            cells.append(f"{share:.3f} / {mean:+.4f} / {fell:.3f}")
            print(f"RESULT {name}_dlogp_p{lo:g}={mean:.5f}")
        sums = {"trajectory": [float(m.sum()) for m in moved],
                "correct": [float(m.sum()) for m, t in zip(moved, trajectories)
                            if (t.outcome or 0) >= 0.5],
                "wrong": [float(m.sum()) for m, t in zip(moved, trajectories)
                          if (t.outcome or 0) < 0.5]}
        stats = {k: mean_se_median(v) for k, v in sums.items()}
        for key, (mean, se, median) in stats.items():
            print(f"RESULT {name}_dlogp_per_{key}={mean:.3f}")
            print(f"RESULT {name}_dlogp_per_{key}_se={se:.3f}")
            print(f"RESULT {name}_dlogp_per_{key}_median={median:.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " | " + " / ".join(
            f"{stats[k][0]:+.2f} ± {stats[k][1]:.2f} (median {stats[k][2]:+.2f})"
            for k in sums) + f" ({len(sums['correct'])} / {len(sums['wrong'])}) |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
