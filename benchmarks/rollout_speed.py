"""Rollout speed: the transformers engine alone vs the same engine driving G=8 environments.

    python benchmarks/rollout_speed.py [--queries 2] [--group 8] [--hidden 128] [--layers 2]
                                       [--repeats 2]

Prints, in order:
    RESULT engine_tokens_per_s=<float>    generated tokens / s, engine.generate alone
    RESULT rollout_tokens_per_s=<float>   generated tokens / s, rollout_group end to end
    RESULT rollout_efficiency=<float>     rollout / engine (issue 5 target: >= 0.8)

How the two runs are made equal. A random tiny model never calls a tool, so the policy is
the world's oracle agent played through the real engine: every token costs the same
forward passes as free decoding, only the choice of token is forced (trainers.engines.
scripted). A warm-up rollout records, for each prompt, the ids the oracle's turn encodes to;
the timed rollout replays them by prompt lookup (no oracle cost inside the timing), and the
engine-alone run sends exactly the timed rollout's batches (same prompts, same group
batching, same generated ids) to engine.generate with no environment. So both runs generate
the same tokens with the same batches, and the gap is the rollout's own cost: env steps
(search over the local index, visit + extractive summary), chat-template ids for replies,
decoding turns to text, bookkeeping. The two timed runs alternate `--repeats` times and the
best time of each is reported (the machine may be shared; load only slows runs down).
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from envs.group import DeepResearchGroupEnv
from trainers.engines.base import Engine, GenerationRequest, GenerationResult
from trainers.engines.hf import DecodeRow, HFEngine
from trainers.engines.scripted import ForcedHFEngine
from trainers.models import build_chatml_tokenizer, build_tiny_causal_lm
from trainers.rollout import RolloutStats, SamplingConfig, rollout_group
from trainers.sampling import raw_logprob
from trainers.tokenization import ChatTokenizer
from venus_gym.worlds.oracle import OracleAgent


class ReplayHFEngine(HFEngine):
    """HFEngine forced to ids recorded per prompt (a dict lookup per row, no script cost)."""

    def __init__(self, model: Any, tokenizer: Any, targets: dict[tuple[int, ...], list[int]]):
        super().__init__(model, tokenizer)
        self.targets = targets

    def _choose(self, logits: torch.Tensor, row: DecodeRow, step: int) -> tuple[int, float]:
        token = self.targets[tuple(row.request.prompt_ids)][step]
        return token, raw_logprob(logits, token)


class RecordingEngine(Engine):
    """Passes calls through and keeps each call's requests and results."""

    def __init__(self, inner: Engine):
        self.inner = inner
        self.calls: list[tuple[list[GenerationRequest], list[GenerationResult]]] = []

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        results = self.inner.generate(requests)
        self.calls.append((list(requests), results))
        return results


def _oracle_respond(group: DeepResearchGroupEnv):
    def respond(observations: list[str]) -> str:
        agent = OracleAgent(group.task, rng_seed=0, detour_prob=0.3)
        action = ""
        for observation in observations:
            action = agent.act(observation)
        return action

    return respond


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", type=int, default=2)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--world-size", type=int, default=2000)
    parser.add_argument("--max-turns", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # The local index and summarizer cannot hang, so the tools run without timeout threads.
    warnings.filterwarnings("ignore", message="the group env's tools have no timeout")

    group = DeepResearchGroupEnv(group_size=args.group, world_size=args.world_size,
                                 max_turns=args.max_turns)
    world = group.envs[0].world
    texts = [group.system_prompt] + [f"{p.title}\n{p.url}\n{p.text}" for p in list(world.corpus)[:500]]
    tokenizer = build_chatml_tokenizer(texts, vocab_size=2000)
    chat = ChatTokenizer(tokenizer)
    model = build_tiny_causal_lm(tokenizer, hidden=args.hidden, layers=args.layers,
                                 heads=max(1, args.hidden // 64), head_dim=64)
    sampling = SamplingConfig(max_turn_tokens=1024, temperature=0)
    seeds = list(range(args.queries))

    # Warm-up: the oracle through the real engine; record each prompt's forced ids.
    recorder = RecordingEngine(ForcedHFEngine(model, tokenizer, _oracle_respond(group),
                                              chat.end_of_turn_id))
    for seed in seeds:
        rollout_group(recorder, group, chat, seed=seed, sampling=sampling)
    targets = {tuple(request.prompt_ids): result.token_ids
               for requests, results in recorder.calls
               for request, result in zip(requests, results)}

    # Timed runs, alternated `--repeats` times; the best time of each counts, since the
    # machine is shared and load bursts only ever slow a run down.
    rollout_seconds, engine_seconds = float("inf"), float("inf")
    for _ in range(args.repeats):
        # Rollout: replayed ids, real environments.
        replay = RecordingEngine(ReplayHFEngine(model, tokenizer, targets))
        stats = RolloutStats()
        started = time.perf_counter()
        trajectories = []
        for seed in seeds:
            trajectories += rollout_group(replay, group, chat, seed=seed, sampling=sampling,
                                          stats=stats)
        rollout_seconds = min(rollout_seconds, time.perf_counter() - started)
        tokens = stats.generated_tokens

        # Engine alone: the rollout's batches, nothing else.
        engine = ReplayHFEngine(model, tokenizer, targets)
        started = time.perf_counter()
        engine_tokens = 0
        for requests, _ in replay.calls:
            engine_tokens += sum(len(r.token_ids) for r in engine.generate(requests))
        engine_seconds = min(engine_seconds, time.perf_counter() - started)
        assert engine_tokens == tokens, (engine_tokens, tokens)
        print(f"# rollout {rollout_seconds:.2f} s (engine {stats.engine_seconds:.2f} s + env "
              f"and tokenisation {stats.env_seconds:.2f} s); engine alone "
              f"{engine_seconds:.2f} s (best so far)", flush=True)

    kinds = [kind for t in trajectories for kind in t.turn_kinds]
    print(f"# {len(trajectories)} trajectories, {len(kinds)} turns "
          f"({kinds.count('search')} search, {kinds.count('visit')} visit, "
          f"{kinds.count('answer')} answer), {tokens} generated tokens in "
          f"{len(replay.calls)} engine calls; mean outcome "
          f"{sum(t.outcome or 0 for t in trajectories) / len(trajectories):.2f}")
    engine_tps = tokens / engine_seconds
    rollout_tps = tokens / rollout_seconds
    print(f"RESULT engine_tokens_per_s={engine_tps:.1f}")
    print(f"RESULT rollout_tokens_per_s={rollout_tps:.1f}")
    print(f"RESULT rollout_efficiency={rollout_tps / engine_tps:.3f}")


if __name__ == "__main__":
    main()
