"""Run a Hugging Face causal LM as a policy in DeepResearch-v0, token in, token out.

`TransformersPolicy(model, chat)` generates one assistant turn at a time from the exact ids
of the conversation so far (`ConversationBuilder.prompt_ids()`), greedy or sampled, and
stops at the end-of-turn token. The generated ids go into the trajectory verbatim with their
log-probs; only the decoded text (without the end-of-turn token) goes to the environment.
The KV cache is kept across turns: the next turn's prompt extends the ids already in the
cache (the builder only appends), so each token is encoded once per episode; a retried turn
cuts the cache back to its prompt (trainers.kv_cache, shared with the batched engine).

`run_episode` plays one task and returns a `Trajectory` (messages, turns with the env's
kind / validity / rewards, token view, rollout log-probs, and in its metadata each turn's
finish reason and the discarded attempts) and per-episode stats;
`trainers.evaluation.evaluate` plays a list of tasks with it and aggregates the metrics.
With `max_retries > 0` (off by default) a turn is sampled again, as DR-Venus's inference
does, when it is empty, repetitive, malformed or repeats an earlier tool call
(design.md "Turn format"); every discarded attempt still counts as a malformed turn.

Where we deviate from DR-Venus and why
* Control tokens other than the end-of-turn token (e.g. `<|im_start|>`, padding) are
  never sampled (their logits are masked), as engines do with bad-word lists: message text
  may not contain them (the chat template would read them as structure). The DR-Venus
  stop string `<tool_response>` is unnecessary here because the env parses the turn; a
  turn that runs into a tool response is simply malformed.
* Retries are off by default: evaluation measures the policy as it is. With
  `max_retries` they follow DR-Venus's conditions but not its exponential backoff (there is
  no server to wait for). A discarded attempt never enters the conversation, so the model
  does not see its own loop, but it is kept in the trajectory's metadata and counted: the
  format-valid rate is over every generated turn, retried ones included as malformed. The
  RL rollouts never retry (trainers/rollout.py says why).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch
from transformers import Cache

from trainers.kv_cache import crop_cache, reserved_cache, reusable_prefix
from trainers.models import kv_cache_argument, returned_kv_cache
from trainers.sampling import sample_token
from trainers.tokenization import ChatTokenizer, ConversationBuilder
from trainers.trajectory import Trajectory, Turn, check_invariants
from venus_gym.protocol import ParsedTurn, ToolCall, is_repetitive, tool_call_key


@dataclass
class GeneratedTurn:
    token_ids: list[int]  # ends with the end-of-turn id unless cut by max_new_tokens
    text: str  # decoded turn without the end-of-turn token
    logprobs: list[float]


class TransformersPolicy:
    """Turn-level generation with a transformers causal LM.

    Args:
        model: any causal LM with a KV cache (put in eval mode here).
        chat: the ChatTokenizer whose template the model was trained with.
        max_new_tokens: cap per turn (a cut turn is closed by the builder and is usually
            malformed).
        temperature: 0 = greedy; else sample from softmax(logits / temperature).
        top_p, top_k: nucleus / top-k filtering when sampling (1.0 / 0 = off).
        seed: seed of the sampling generator.
        presence_penalty: subtracted from the logits of ids already generated in this turn
            (trainers.sampling; DR-Venus's inference option against loops). 0 = off.

    Tokens are chosen by trainers.sampling.sample_token, the rule the batched engine uses
    too; the recorded log-probs are log_softmax(logits / temperature), as the learner computes them.
    """

    def __init__(self, model: Any, chat: ChatTokenizer, max_new_tokens: int = 256,
                 temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0,
                 presence_penalty: float = 0.0):
        self.model = model.eval()
        self.chat = chat
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.presence_penalty = presence_penalty
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        # Control tokens other than the end of turn may not appear in message text.
        self.banned_ids = sorted(chat.control_ids - {chat.end_of_turn_id})
        self._cache: Cache | None = None
        self._cache_argument = kv_cache_argument(model)
        self._cached_ids: list[int] = []

    def reset(self) -> None:
        """Forget the KV cache (start of an episode)."""
        self._cache, self._cached_ids = None, []

    def _reuse_cache_for(self, prompt: list[int]) -> None:
        """Keep the part of the KV cache that `prompt` starts with, drop the rest.

        The next turn's prompt extends the cached ids, so all of it is kept; a retried
        turn's prompt is the cache minus the discarded attempt, so the cache is cut back to
        their common prefix (trainers.kv_cache: by slicing, since `Cache.crop`'s argument
        changed meaning between transformers 5.17 and 5.24).
        """
        keep = reusable_prefix(self._cached_ids, prompt)
        if keep == 0:
            self.reset()
        elif keep < len(self._cached_ids):
            self._cache = crop_cache(self._cache, keep)
            self._cached_ids = self._cached_ids[:keep]

    @torch.no_grad()
    def _forward(self, new_ids: list[int]) -> torch.Tensor:
        """Run new_ids through the model after the cached ids; returns the last logits."""
        start = len(self._cached_ids)
        inputs = torch.tensor([new_ids], device=self.device)
        positions = torch.arange(start, start + len(new_ids), device=self.device)[None]
        output = self.model(input_ids=inputs, position_ids=positions, use_cache=True,
                            logits_to_keep=1, **{self._cache_argument: self._cache})
        self._cache = returned_kv_cache(output)
        self._cached_ids.extend(new_ids)
        return output.logits[0, -1].float()

    def generate_turn(self, prompt_ids: Sequence[int]) -> GeneratedTurn:
        """Generate one turn continuing `prompt_ids` (the whole conversation so far)."""
        prompt = list(prompt_ids)
        if not prompt:
            raise ValueError("generate_turn needs a non-empty prompt (at least the system "
                             "message's ids)")
        self._reuse_cache_for(prompt)
        logits = self._forward(prompt[len(self._cached_ids):])
        # Decoding writes into room reserved now instead of copying the cache every step.
        self._cache = reserved_cache(self._cache, self.max_new_tokens)
        eot = self.chat.end_of_turn_id
        ids: list[int] = []
        logprobs: list[float] = []
        for _ in range(self.max_new_tokens):
            token, logprob = sample_token(logits, temperature=self.temperature,
                                          top_p=self.top_p, top_k=self.top_k,
                                          banned_ids=self.banned_ids, generator=self.generator,
                                          presence_penalty=self.presence_penalty, seen_ids=ids)
            ids.append(token)
            logprobs.append(logprob)
            if token == eot:
                break
            logits = self._forward([token])
        text_ids = ids[:-1] if ids and ids[-1] == eot else ids
        text = self.chat.tokenizer.decode(text_ids, skip_special_tokens=False,
                                          clean_up_tokenization_spaces=False)
        return GeneratedTurn(ids, text, logprobs)


@dataclass
class EpisodeStats:
    task_id: str
    hops: int
    turns: int
    valid_turns: int
    answered: bool
    score: float
    truncated: bool
    tokens: int
    cut_turns: int = 0  # generated turns that hit max_new_tokens before the end-of-turn token
    retried_turns: int = 0  # attempts discarded and sampled again (all count as malformed)

    @property
    def generated_turns(self) -> int:
        """Every turn the policy generated: those sent to the env and those retried."""
        return self.turns + self.retried_turns


def retry_reason(text: str, valid: bool, parsed: ParsedTurn, earlier_calls: set[str]) -> str:
    """Why DR-Venus's inference would sample this turn again, or "" to keep it.

    Args:
        text: the generated turn.
        valid, parsed: the environment's verdict on it (`judge_turn`).
        earlier_calls: `tool_call_key`s of the episode's earlier tool calls.
    """
    if not text.strip():
        return "empty"
    if is_repetitive(text):
        return "repetition"
    if not valid:
        return "malformed"
    if parsed.tool_call is not None and tool_call_key(parsed.tool_call) in earlier_calls:
        return "duplicate tool call"
    return ""


def run_episode(env: gym.Env, policy: TransformersPolicy, task_index: int | None = None,
                seed: int | None = None, trajectory_id: str = "", max_retries: int = 0
                ) -> tuple[Trajectory, EpisodeStats]:
    """Play one episode (task `task_index` of the env's split, else one drawn with `seed`).

    `max_retries` > 0: a turn that `retry_reason` rejects is discarded and generated again,
    up to that many times; the last attempt goes to the environment whatever it is.
    Discarded attempts are listed in `trajectory.metadata["discarded_turns"]` (turn number,
    attempt number, reason, whether the token cap cut it, text) and counted in
    `EpisodeStats.retried_turns`. Retrying a greedy policy
    repeats the same turn, so use a temperature > 0.
    """
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    options = {"task_index": task_index} if task_index is not None else None
    observation, info = env.reset(seed=seed, options=options)
    base = env.unwrapped
    task = base.task
    prompt = [{"role": "system", "content": base.system_prompt},
              {"role": "user", "content": observation}]
    builder = ConversationBuilder(policy.chat, prompt)
    policy.reset()
    turns: list[Turn] = []
    score, answered, truncated, done, cut_turns = 0.0, False, False, False, 0
    discarded: list[dict[str, Any]] = []
    finish_reasons: list[str] = []  # per turn sent, as engines report them
    earlier_calls: set[str] = set()
    while not done:
        prompt_ids = builder.prompt_ids()
        for attempt in range(max_retries + 1):
            generated = policy.generate_turn(prompt_ids)
            cut = generated.token_ids[-1:] != [policy.chat.end_of_turn_id]
            cut_turns += cut
            if attempt == max_retries:
                break
            valid, _, parsed = base.judge_turn(generated.text)
            reason = retry_reason(generated.text, valid, parsed, earlier_calls)
            if not reason:
                break
            discarded.append({"turn": len(turns) + 1, "attempt": attempt + 1,
                              "reason": reason, "cut": bool(cut), "text": generated.text})
        finish_reasons.append("length" if cut else "stop")
        builder.add_generation(generated.token_ids, generated.text, generated.logprobs)
        # The record keeps the builder's text (control-token strings defused; see
        # ConversationBuilder), the environment parses what was generated.
        observation, reward, terminated, truncated, info = env.step(generated.text)
        done = terminated or truncated
        earlier_calls.update(tool_call_key(ToolCall(call["name"], call["arguments"]))
                             for call in info["tool_calls"])
        turns.append(Turn(kind=info["kind"], valid=bool(info["valid"]),
                          assistant=builder.messages[-1]["content"],
                          env_reply=observation or None,
                          reason="" if info["valid"] else str(info["reason"]),
                          forced_final=bool(info.get("forced_final")) and done,
                          format_reward=reward if not info["valid"] else None))
        if terminated:
            answered, score = True, float(info.get("score", 0.0))
        if observation:
            builder.add_env_reply(observation)
    last = turns[-1]
    if last.valid:
        last.outcome_reward = score
    else:
        # The outcome of an unanswered episode is 0; the format penalty stays separate.
        last.outcome_reward = 0.0
    tokenized = builder.finish()
    trajectory = Trajectory(
        id=trajectory_id or f"{task.id}/policy", messages=builder.messages, task_id=task.id,
        question=task.question, answers=list(task.answers), turns=turns, outcome=score,
        metadata={"hops": task.hops, "finish_reasons": finish_reasons,
                  **({"discarded_turns": discarded} if max_retries else {})}
    ).with_tokens(tokenized, builder.rollout_logprobs)
    check_invariants(trajectory)
    stats = EpisodeStats(task_id=task.id, hops=task.hops, turns=len(turns),
                         valid_turns=sum(t.valid for t in turns), answered=answered,
                         score=score, truncated=truncated, tokens=len(tokenized.input_ids),
                         cut_turns=cut_turns, retried_turns=len(discarded))
    return trajectory, stats
