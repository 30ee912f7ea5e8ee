"""Rollout speed: the transformers engine alone vs the same engine driving G=8 environments,
and group rollouts with kept KV caches vs re-encoding every turn.

    python benchmarks/rollout_speed.py [--queries 2] [--group 8] [--hidden 128] [--layers 2]
                                       [--heads 0] [--vocab-size 2000] [--world-tokenizer]
                                       [--max-turns 6] [--repeats 2]

The demo's model (trainers/configs/demo_sft.yaml: Qwen3 hidden 128, 3 layers, 4 heads,
16,384-id world tokenizer) with 10-turn episodes:

    python benchmarks/rollout_speed.py --layers 3 --heads 4 --vocab-size 16384 \
        --world-tokenizer --max-turns 10

Prints, in order:
    RESULT engine_tokens_per_s=<float>    generated tokens / s, engine.generate alone
    RESULT rollout_tokens_per_s=<float>   generated tokens / s, rollout_group end to end
    RESULT rollout_efficiency=<float>     rollout / engine (target: >= 0.8)
    RESULT rollout_kv_speedup=<float>     rollout time re-encoding every prompt
                                          (HFEngine(kv_cache=False, reserve_decode=False,
                                          lean_decode=False)) / with kept KV caches
                                          (the default; target: >= 3)
    RESULT sampling_speedup=<float>       free sampling (T 1.0, top-p 0.95, seeded) of each
                                          group's first prompts: engine time choosing tokens
                                          row by row (HFEngine(batched_sampling=False)) /
                                          one batched draw per step (the default); the two
                                          must produce the same tokens
    RESULT decode_outside_forward_share=<float>  of that batched run's decode time, the
                                          share spent outside the model forward (sampling,
                                          stop checks, bookkeeping)

How the runs are made equal. A random tiny model never calls a tool, so the policy is
the world's oracle agent played through the real engine: every token costs the same
forward passes as free decoding, only the choice of token is forced (trainers.engines.
scripted). A warm-up rollout records, for each prompt, the ids the oracle's turn encodes to;
the timed rollouts replay them by prompt lookup (no oracle cost inside the timing), and the
engine-alone run sends exactly the timed rollout's batches (same prompts, same group
batching, same generated ids) to engine.generate with no environment. So every run
generates the same tokens with the same batches: the engine-alone gap is the rollout's own
cost (env steps: search over the local index, visit + extractive summary; chat-template ids
for replies, decoding turns to text, bookkeeping), and the re-encoding run differs from the
cached one only in the prefill of each turn's prompt. The timed runs alternate `--repeats`
times and the best time of each is reported (the machine may be shared; load only slows
runs down).
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from envs.group import DeepResearchGroupEnv
from trainers.engines import hf as hf_engine
from trainers.engines.base import Engine, GenerationRequest, GenerationResult
from trainers.engines.hf import DecodeRow, HFEngine
from trainers.engines.sampling import forced_logprob
from trainers.engines.scripted import ForcedHFEngine
from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm
from trainers.modeling.tokenization import ChatTokenizer
from trainers.rollout import RolloutStats, SamplingConfig, rollout_group
from venus_gym.worlds.oracle import OracleAgent


class ReplayHFEngine(HFEngine):
    """HFEngine forced to ids recorded per prompt (a dict lookup per row, no script cost)."""

    def __init__(self, model: Any, tokenizer: Any, targets: dict[tuple[int, ...], list[int]],
                 **options: Any):
        super().__init__(model, tokenizer, **options)
        self.targets = targets

    def _choose(self, logits: torch.Tensor, row: DecodeRow, step: int,
                log_probs: torch.Tensor | None = None) -> tuple[int, float]:
        token = self.targets[tuple(row.request.prompt_ids)][step]
        return token, forced_logprob(logits, token, row.request.temperature, log_probs)


class RecordingEngine(Engine):
    """Passes calls through and keeps each call's requests and results (None marks the end
    of a group's conversations)."""

    def __init__(self, inner: Engine):
        self.inner = inner
        self.calls: list[tuple[list[GenerationRequest], list[GenerationResult]] | None] = []

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        results = self.inner.generate(requests)
        self.calls.append((list(requests), results))
        return results

    def forget_conversations(self) -> None:
        self.inner.forget_conversations()
        self.calls.append(None)


def _oracle_respond(group: DeepResearchGroupEnv):
    def respond(observations: list[str]) -> str:
        agent = OracleAgent(group.task, rng_seed=0, detour_prob=0.3)
        action = ""
        for observation in observations:
            action = agent.act(observation)
        return action

    return respond


# The engines the kept-cache default is timed against (HFEngine options).
REFERENCES: dict[str, dict[str, bool]] = {
    "before": {"kv_cache": False, "reserve_decode": False, "lean_decode": False},
    "reserved_decode": {"kv_cache": False},
}


def _tokenizer(group: DeepResearchGroupEnv, args: argparse.Namespace) -> Any:
    if args.world_tokenizer:  # the SFT pipeline's world tokenizer (every page and question)
        from trainers.data.oracle_data import world_texts

        texts = world_texts({"world_size": args.world_size})
    else:
        world = group.envs[0].world
        texts = [group.system_prompt] + [f"{p.title}\n{p.url}\n{p.text}"
                                         for p in list(world.corpus)[:500]]
    return build_chatml_tokenizer(texts, vocab_size=args.vocab_size)


def _timed_rollouts(engine: Engine, group: DeepResearchGroupEnv, chat: ChatTokenizer,
                    seeds: list[int], sampling: SamplingConfig
                    ) -> tuple[float, RolloutStats, list[Any]]:
    stats = RolloutStats()
    started = time.perf_counter()
    trajectories = []
    for seed in seeds:
        trajectories += rollout_group(engine, group, chat, seed=seed, sampling=sampling,
                                      stats=stats)
    return time.perf_counter() - started, stats, trajectories


class ForwardTimer:
    """Times the model forwards of HFEngine calls (prefill and every decode step): the lean
    decoder's steps and the transformers forward, patched for the `with` block. On the CPU a
    forward is synchronous, so its wall time is its cost."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __enter__(self) -> ForwardTimer:
        timer = self
        self._forward, self._decoder = HFEngine._forward, hf_engine.LeanDecoder

        def forward(engine: HFEngine, *args: Any) -> Any:
            started = time.perf_counter()
            try:
                return timer._forward(engine, *args)
            finally:
                timer.seconds += time.perf_counter() - started

        class TimedDecoder(self._decoder):  # type: ignore[misc, valid-type]
            def step(self, *args: Any) -> torch.Tensor:
                started = time.perf_counter()
                try:
                    return super().step(*args)
                finally:
                    timer.seconds += time.perf_counter() - started

        HFEngine._forward, hf_engine.LeanDecoder = forward, TimedDecoder  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: Any) -> None:
        HFEngine._forward, hf_engine.LeanDecoder = self._forward, self._decoder  # type: ignore[method-assign]


def _sampling_speed(model: Any, tokenizer: Any, calls: list[Any], repeats: int
                    ) -> tuple[float, float, int]:
    """Free sampling of each group's first engine call, row by row vs batched: (speedup,
    share of the batched run's time outside the model forward, tokens per run)."""
    firsts = [call[0] for previous, call in zip([None] + calls, calls)
              if call is not None and previous is None]
    batches = [[GenerationRequest(r.prompt_ids, max_new_tokens=128, temperature=1.0,
                                  top_p=0.95, stop_token_ids=r.stop_token_ids,
                                  banned_token_ids=r.banned_token_ids, seed=1000 * b + i)
                for i, r in enumerate(requests)] for b, requests in enumerate(firsts)]
    best = {False: float("inf"), True: float("inf")}
    forward_share, outputs = 1.0, {}
    for _ in range(repeats):
        for batched in (False, True):
            engine = HFEngine(model, tokenizer, batched_sampling=batched)
            with ForwardTimer() as timer:
                started = time.perf_counter()
                results = [engine.generate(batch) for batch in batches]
                seconds = time.perf_counter() - started
            outputs[batched] = [[r.token_ids for r in batch] for batch in results]
            if seconds < best[batched]:
                best[batched] = seconds
                if batched:
                    forward_share = timer.seconds / seconds
    assert outputs[True] == outputs[False], "batched and per-row sampling drew other tokens"
    tokens = sum(len(ids) for batch in outputs[True] for ids in batch)
    print(f"# sampling: {tokens} tokens in {len(batches)} batches of "
          f"{len(batches[0])}; row by row {best[False]:.2f} s, batched {best[True]:.2f} s",
          flush=True)
    return best[False] / best[True], 1.0 - forward_share, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", type=int, default=2)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=0,
                        help="attention heads (head_dim = hidden / heads); 0 = hidden / 64 "
                             "heads of 64")
    parser.add_argument("--intermediate", type=int, default=0, help="MLP width; 0 = 2 * hidden")
    parser.add_argument("--vocab-size", type=int, default=2000)
    parser.add_argument("--world-tokenizer", action="store_true",
                        help="train the tokenizer on the whole world (pages and questions) as "
                             "the SFT pipeline does; default: 500 pages")
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
    tokenizer = _tokenizer(group, args)
    chat = ChatTokenizer(tokenizer)
    if args.heads:
        shape = {"heads": args.heads}
    else:
        shape = {"heads": max(1, args.hidden // 64), "head_dim": 64}
    model = build_tiny_causal_lm(tokenizer, hidden=args.hidden, layers=args.layers,
                                 intermediate=args.intermediate or None, **shape)
    sampling = SamplingConfig(max_turn_tokens=1024, temperature=0)
    seeds = list(range(args.queries))

    # Warm-up: the oracle through the real engine; record each prompt's forced ids.
    recorder = RecordingEngine(ForcedHFEngine(model, tokenizer, _oracle_respond(group),
                                              chat.end_of_turn_id))
    for seed in seeds:
        rollout_group(recorder, group, chat, seed=seed, sampling=sampling)
    targets = {tuple(request.prompt_ids): result.token_ids
               for call in recorder.calls if call is not None
               for request, result in zip(*call)}

    # Timed runs, alternated `--repeats` times; the best time of each counts, since the
    # machine is shared and load bursts only ever slow a run down.
    rollout_seconds = engine_seconds = float("inf")
    reference_seconds = dict.fromkeys(REFERENCES, float("inf"))
    for _ in range(args.repeats):
        # Rollout: replayed ids, real environments, kept KV caches (the engine default).
        replay = RecordingEngine(ReplayHFEngine(model, tokenizer, targets))
        seconds, stats, trajectories = _timed_rollouts(replay, group, chat, seeds, sampling)
        rollout_seconds = min(rollout_seconds, seconds)
        tokens = stats.generated_tokens

        # The same rollouts on the engine before kept caches (re-encoding every prompt,
        # the cache grown by concatenation), and re-encoding with the reserved decode cache
        # (to split the gain between the two).
        for name, options in REFERENCES.items():
            reference = ReplayHFEngine(model, tokenizer, targets, **options)
            seconds, _, reference_trajectories = _timed_rollouts(reference, group, chat, seeds,
                                                                 sampling)
            reference_seconds[name] = min(reference_seconds[name], seconds)
            assert [t.input_ids for t in reference_trajectories] == \
                [t.input_ids for t in trajectories]

        # Engine alone: the rollout's batches, nothing else.
        engine = ReplayHFEngine(model, tokenizer, targets)
        started = time.perf_counter()
        engine_tokens = 0
        for call in replay.calls:
            if call is None:
                engine.forget_conversations()
                continue
            engine_tokens += sum(len(r.token_ids) for r in engine.generate(call[0]))
        engine_seconds = min(engine_seconds, time.perf_counter() - started)
        assert engine_tokens == tokens, (engine_tokens, tokens)
        print(f"# rollout {rollout_seconds:.2f} s (engine {stats.engine_seconds:.2f} s + env "
              f"and tokenisation {stats.env_seconds:.2f} s); engine alone "
              f"{engine_seconds:.2f} s; rollout re-encoding {reference_seconds['before']:.2f} s, "
              f"re-encoding with the reserved decode cache "
              f"{reference_seconds['reserved_decode']:.2f} s (best so far)", flush=True)

    kinds = [kind for t in trajectories for kind in t.turn_kinds]
    lengths = sorted(len(t.input_ids) for t in trajectories)
    calls = sum(call is not None for call in replay.calls)
    cache = replay.inner.cache_stats
    print(f"# {len(trajectories)} trajectories, {len(kinds)} turns "
          f"({kinds.count('search')} search, {kinds.count('visit')} visit, "
          f"{kinds.count('answer')} answer), {tokens} generated tokens in {calls} engine "
          f"calls; trajectory tokens median {lengths[len(lengths) // 2]}, max {lengths[-1]}; "
          f"prompt ids prefilled {cache.prefilled_tokens}, reused {cache.reused_tokens}; "
          f"mean outcome {sum(t.outcome or 0 for t in trajectories) / len(trajectories):.2f}")
    engine_tps = tokens / engine_seconds
    rollout_tps = tokens / rollout_seconds
    print(f"RESULT engine_tokens_per_s={engine_tps:.1f}")
    print(f"RESULT rollout_tokens_per_s={rollout_tps:.1f}")
    print(f"RESULT rollout_efficiency={rollout_tps / engine_tps:.3f}")
    before, reserved = reference_seconds["before"], reference_seconds["reserved_decode"]
    print(f"# of the speedup: reserved decode cache {before / reserved:.2f}x, then kept "
          f"caches {reserved / rollout_seconds:.2f}x")
    print(f"RESULT rollout_kv_speedup={before / rollout_seconds:.2f}")
    speedup, outside, _ = _sampling_speed(model, tokenizer, replay.calls, args.repeats)
    print(f"RESULT sampling_speedup={speedup:.2f}")
    print(f"RESULT decode_outside_forward_share={outside:.3f}")


if __name__ == "__main__":
    main()
