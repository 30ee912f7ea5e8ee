"""Group rollouts, token in / token out: one engine, G environments on one query.

    trajectories = rollout_group(engine, group_env, chat, seed=7, sampling=SamplingConfig())

Each step generates one turn for *every live member in one engine call* (the group is the
batch), then steps the group environment with the decoded turns. Per member a
`ConversationBuilder` keeps the ids exactly as the engine produced them:

* the prompt is the chat template's rendering of [env system prompt, question] with the
  generation prompt (`ChatTokenizer`);
* generated ids go in verbatim with their log-probs (mask 1); they are decoded to text
  only because the environment speaks text, and that text is never encoded again;
* the environment's reply goes in as the template's ids for "user message + next generation
  prompt" (mask 0), and the turn boundary after it is recorded;
* turn kind, validity, reason, rewards and the forced-final flag come from the env's info.

Budgets
* Per turn: `SamplingConfig.max_turn_tokens` is the engine's `max_new_tokens`. A cut turn is
  closed by the builder with a mask-0 end-of-turn id; the env usually finds it malformed.
* Context, in real tokens: before each turn the member's prompt length is measured; the turn
  may use at most `max_context_tokens - len(prompt)` new tokens, and a member with no room
  left is truncated by the rollout (`metadata["budget"] == "rollout_context"`). No policy
  token lies past the budget; the env reply that filled it (mask 0) is kept whole, so the
  ids may end beyond it by that reply (cutting a reply would break the template). The env's own
  context budget (which triggers the DR-Venus forced final answer) counts with its
  `token_counter`; pass `token_counter=text_token_counter(chat)` to the env so it counts the
  same tokenizer's tokens (template tokens aside), and set its `max_context_tokens` below
  the rollout's so the forced final turn fits.
* Turns: the env's `max_turns`, with the forced final turn after the notice.

Stop strings: DR-Venus stops generation on `<tool_response>` so the model never writes a
tool result. The ids are kept up to the token that completes the stop string (mask 1, as
sampled); the message text is their decoding, and the env gets the text before the stop
string (trainers.engines.base documents the mid-token case).

Cancellation: `should_stop` (a callable) is asked before every turn; when it answers True
the group is abandoned with RolloutCancelled (a straggler cut by rollout.completion_cutoff:
trainers.rl.workers.RolloutWorker.cancel). A group is never returned in part.

Stuck or crashing tools: tools run inside the env's toolbox, which never raises and gives
up after `tool_timeout_s` (set it on the env; the rollout warns when a group runs without
one). The turn then gets the toolbox's error text as its reply and the rollout goes on.

Where we deviate from verl-agent / DR-Venus and why
* No retries of empty / repetitive / duplicate turns (DR-Venus inference does up to 5): in
  RL the policy must see the consequences of its own samples; retries would bias the data.
* The forced final turn is the env's (one more turn after the notice replaces the last
  reply), not a rewrite of the conversation: rewriting history would break token-in/out.
* The rollout-side context cut has no forced final turn: there is no room left for one;
  keep the env's budget tighter (see above) so the forced final turn happens first.
"""

from __future__ import annotations

import itertools
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainers.engines.base import Engine, GenerationRequest, text_before_stop_string
from trainers.tokenization import ChatTokenizer, ConversationBuilder
from trainers.trajectory import Trajectory, Turn

DEFAULT_STOP_STRINGS: tuple[str, ...] = ("<tool_response>",)


class RolloutCancelled(Exception):
    """The group was abandoned between turns because `should_stop` said so."""


@dataclass
class SamplingConfig:
    """How each turn is sampled. temperature 0 = greedy. `seed` (if set) seeds member i's
    turn t with seed + 1000 * t + i, so a group's members sample differently."""

    max_turn_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_strings: tuple[str, ...] = DEFAULT_STOP_STRINGS
    seed: int | None = None


@dataclass
class RolloutStats:
    """Where the time of one group rollout went (for benchmarks and logs)."""

    engine_seconds: float = 0.0
    env_seconds: float = 0.0
    generated_tokens: int = 0
    engine_calls: int = 0


@dataclass
class _Member:
    """One group member's episode as it is built."""

    builder: ConversationBuilder
    turns: list[Turn] = field(default_factory=list)
    done: bool = False
    notice_pending: bool = False  # the last reply was the forced-final notice
    score: float = 0.0
    budget: str | None = None
    finish_reasons: list[str] = field(default_factory=list)


def text_token_counter(chat: ChatTokenizer) -> Callable[[str], int]:
    """A `token_counter` for the env that counts this tokenizer's tokens of a text."""
    tokenizer = chat.tokenizer

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    return count


def banned_control_ids(chat: ChatTokenizer) -> list[int]:
    """Special-token ids other than the end-of-turn id: message text may not contain them
    (the template would read them as structure), so engines must never sample them."""
    return sorted(int(i) for i in chat.control_ids - {chat.end_of_turn_id})


def rollout_group(engine: Engine, group_env: Any, chat: ChatTokenizer, *,
                  seed: int | None = None, options: dict[str, Any] | None = None,
                  sampling: SamplingConfig | None = None, max_context_tokens: int = 32_768,
                  trajectory_id_prefix: str | None = None,
                  stats: RolloutStats | None = None,
                  should_stop: Callable[[], bool] | None = None) -> list[Trajectory]:
    """Play one query with every member of `group_env` (an envs.group.DeepResearchGroupEnv).

    Args:
        engine: any trainers.engines Engine; called once per step with all live members.
        group_env: reset here with `seed` / `options` (e.g. {"task_id": ...}).
        chat: the ChatTokenizer of the policy's template.
        sampling: per-turn sampling and token cap (SamplingConfig()).
        max_context_tokens: hard cap on a member's ids (prompt + all turns), real tokens.
        trajectory_id_prefix: ids are "<prefix>/<member>"; default the task id.
        stats: filled with engine / environment time and generated tokens, if given.
        should_stop: asked before each turn; True abandons the group (RolloutCancelled).

    Returns:
        G trajectories (member order) with messages, turns, outcome and the token view
        (input_ids, loss_mask, rollout_logprobs, turn spans/boundaries, question_end).
    """
    sampling = sampling or SamplingConfig()
    stats = stats if stats is not None else RolloutStats()
    if getattr(group_env.envs[0].toolbox, "timeout_s", 0) is None:
        warnings.warn("the group env's tools have no timeout (tool_timeout_s=None): a stuck "
                      "remote backend would stall the rollout", RuntimeWarning, stacklevel=2)
    started = time.perf_counter()
    questions, _ = group_env.reset(seed=seed, options=options)
    task = group_env.task
    members = [_Member(ConversationBuilder(chat, [
        {"role": "system", "content": group_env.system_prompt},
        {"role": "user", "content": question}])) for question in questions]
    stats.env_seconds += time.perf_counter() - started
    banned = banned_control_ids(chat)

    for turn_index in itertools.count():  # ends when every member is done
        if should_stop is not None and should_stop():
            engine.forget_conversations()
            raise RolloutCancelled(f"group of task {task.id} cancelled before turn {turn_index}")
        live = [i for i, member in enumerate(members) if not member.done]
        requests, asking = [], []
        for i in live:
            prompt = members[i].builder.prompt_ids()
            room = max_context_tokens - len(prompt)
            if room < 1:
                _cut_for_context(group_env, members[i], i)
                continue
            requests.append(GenerationRequest(
                prompt_ids=prompt, max_new_tokens=min(sampling.max_turn_tokens, room),
                temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                stop_token_ids=[chat.end_of_turn_id], stop_strings=list(sampling.stop_strings),
                banned_token_ids=banned,
                seed=None if sampling.seed is None else sampling.seed + 1000 * turn_index + i))
            asking.append(i)
        if not asking:
            break
        started = time.perf_counter()
        results = engine.generate(requests)
        stats.engine_seconds += time.perf_counter() - started
        stats.engine_calls += 1

        started = time.perf_counter()
        actions: list[str | None] = [None] * len(members)
        texts: dict[int, str] = {}
        for i, result in zip(asking, results):
            stats.generated_tokens += len(result.token_ids)
            ended_by_eot = bool(result.token_ids) and result.token_ids[-1] == chat.end_of_turn_id
            text_ids = result.token_ids[:-1] if ended_by_eot else result.token_ids
            text = chat.tokenizer.decode(text_ids, skip_special_tokens=False,
                                         clean_up_tokenization_spaces=False)
            members[i].builder.add_generation(result.token_ids, text, result.logprobs)
            members[i].finish_reasons.append(result.finish_reason)
            # The record keeps the builder's text (control-token strings defused), so the
            # turn and its message agree; the environment parses what was generated.
            texts[i] = members[i].builder.messages[-1]["content"]
            actions[i] = text_before_stop_string(text, result.stop_string)
        observations, rewards, _, _, infos = group_env.step(actions)
        for i in asking:
            _record_step(members[i], texts[i], observations[i], rewards[i], infos[i],
                         group_env.done[i])
        stats.env_seconds += time.perf_counter() - started

    engine.forget_conversations()  # the group's episodes are over: free their KV caches
    prefix = trajectory_id_prefix or task.id
    return [_trajectory(member, f"{prefix}/{i}", task, seed)
            for i, member in enumerate(members)]


def _cut_for_context(group_env: Any, member: _Member, index: int) -> None:
    """End a member whose prompt fills the context budget; the group env stops asking for
    its actions (its public truncated flags are the members' episode state)."""
    if not member.turns:
        raise ValueError("the question prompt alone fills max_context_tokens; raise the budget")
    group_env.truncated[index] = True
    member.done = True
    member.budget = "rollout_context"


def _record_step(member: _Member, text: str, observation: str, reward: float,
                 info: dict[str, Any], done: bool) -> None:
    valid = bool(info["valid"])
    turn = Turn(kind=str(info["kind"]), valid=valid, assistant=text,
                env_reply=observation or None,
                reason="" if valid else str(info.get("reason", "")),
                forced_final=member.notice_pending,
                format_reward=float(reward) if not valid else None)
    member.turns.append(turn)
    if info["kind"] == "answer":
        member.score = float(info.get("score", 0.0))
    if info.get("budget"):
        member.budget = str(info["budget"])
    member.notice_pending = bool(info.get("forced_final")) and not done
    if observation:
        member.builder.add_env_reply(observation)
    member.done = done


def _trajectory(member: _Member, trajectory_id: str, task: Any, seed: int | None) -> Trajectory:
    # The outcome lands on the last turn: the answer's score, or 0 for an unanswered episode
    # (the format penalty stays a separate component), as trainers.policy does.
    member.turns[-1].outcome_reward = member.score
    tokenized = member.builder.finish()
    return Trajectory(
        id=trajectory_id, messages=member.builder.messages, task_id=task.id,
        question=task.question, answers=list(task.answers), turns=member.turns,
        outcome=member.score,
        metadata={"hops": task.hops, "seed": seed, "budget": member.budget,
                  "finish_reasons": member.finish_reasons},
    ).with_tokens(tokenized, member.builder.rollout_logprobs)


def check_group(trajectories: Sequence[Trajectory], chat: ChatTokenizer | None = None) -> None:
    """Run trainers.trajectory.check_invariants on every trajectory (tests, debugging)."""
    from trainers.trajectory import check_invariants

    for trajectory in trajectories:
        check_invariants(trajectory, chat)
