"""The one episode runner, token in / token out: one engine, G environments on one query.

    trajectories = rollout_group(engine, group_env, chat, seed=7, sampling=SamplingConfig())
    trajectory = play_episode(engine, env, chat, task_index=0)      # one env: a group of one

RL rollouts, evaluation, the warm-start check and `venus-gym chat` all play episodes here.

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
trainers.rl.rollout_worker.RolloutWorker.cancel). A group is never returned in part.

Stuck or crashing tools: tools run inside the env's toolbox, which never raises and gives
up after `tool_timeout_s` (remote backends default to 30 s; the rollout warns when plug-in
tools run without a timeout). The turn then gets the toolbox's error text as its reply and
the rollout goes on.

Retries (evaluation only, `max_retries`): DR-Venus's inference samples a turn again, up to 5
times, when it is empty, repetitive, malformed or repeats an earlier tool call
(`retry_reason`). A discarded attempt never enters the conversation, so the model does not
see its own loop, but it is kept in `metadata["discarded_turns"]` (turn, attempt, reason,
whether the token cap cut it, text) and counted as a malformed turn by the evaluation.
Attempt a of member i's turn t samples with seed + 1000 t + i + RETRY_SEED_STRIDE * a.

Where we deviate from verl-agent / DR-Venus and why
* RL rollouts never retry a turn (DR-Venus inference does up to 5): in RL the policy must see
  the consequences of its own samples; retries would bias the data. Retries follow
  DR-Venus's conditions but not its exponential backoff (there is no server to wait for).
* The forced final turn is the env's (one more turn after the notice replaces the last
  reply), not a rewrite of the conversation: rewriting history would break token-in/out.
* The rollout-side context cut has no forced final turn: there is no room left for one;
  keep the env's budget tighter (see above) so the forced final turn happens first.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainers.engines.base import (
    Engine,
    GenerationRequest,
    GenerationResult,
    text_before_stop_string,
)
from trainers.modeling.tokenization import ChatTokenizer, ConversationBuilder
from trainers.trajectory import Trajectory, Turn, check_invariants
from venus_gym.protocol import ParsedTurn, ToolCall, is_repetitive, tool_call_key

DEFAULT_STOP_STRINGS: tuple[str, ...] = ("<tool_response>",)
RETRY_SEED_STRIDE = 1_000_003  # a retried attempt's seed offset (module header)


class RolloutCancelled(Exception):
    """The group was abandoned between turns because `should_stop` said so."""


@dataclass
class SamplingConfig:
    """How each turn is sampled. temperature 0 = greedy. `seed` (if set) seeds member i's
    turn t with seed + 1000 * t + i, so a group's members sample differently.
    presence_penalty: DR-Venus's inference option against loops (0 = off; engines.base)."""

    max_turn_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_strings: tuple[str, ...] = DEFAULT_STOP_STRINGS
    seed: int | None = None
    presence_penalty: float = 0.0


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
    tool_calls: set[str] = field(default_factory=set)  # tool_call_keys, for retry_reason
    discarded: list[dict[str, Any]] = field(default_factory=list)  # retried attempts


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


@dataclass
class GroupPlay:
    """One group for rollout_groups: its env, reset seed and options, sampling, trajectory
    id prefix (default: the task id) and cancellation check (asked before every turn)."""

    group_env: Any
    seed: int | None = None
    options: dict[str, Any] | None = None
    sampling: SamplingConfig | None = None
    trajectory_id_prefix: str | None = None
    should_stop: Callable[[], bool] | None = None


def rollout_group(engine: Engine, group_env: Any, chat: ChatTokenizer, *,
                  seed: int | None = None, options: dict[str, Any] | None = None,
                  sampling: SamplingConfig | None = None, max_context_tokens: int = 32_768,
                  trajectory_id_prefix: str | None = None,
                  stats: RolloutStats | None = None,
                  should_stop: Callable[[], bool] | None = None,
                  max_retries: int = 0) -> list[Trajectory]:
    """Play one query with every member of `group_env` (an envs.group.DeepResearchGroupEnv,
    or OneEnvGroup around a single env).

    Args:
        engine: any trainers.engines Engine; called once per step with all live members.
        group_env: reset here with `seed` / `options` (e.g. {"task_id": ...}).
        chat: the ChatTokenizer of the policy's template.
        sampling: per-turn sampling and token cap (SamplingConfig()).
        max_context_tokens: hard cap on a member's ids (prompt + all turns), real tokens.
        trajectory_id_prefix: ids are "<prefix>/<member>"; default the task id.
        stats: filled with engine / environment time and generated tokens, if given.
        should_stop: asked before each turn; True abandons the group (RolloutCancelled).
        max_retries: evaluation only: DR-Venus turn retries (module header); RL passes 0.

    Returns:
        G trajectories (member order) with messages, turns, outcome and the token view
        (input_ids, loss_mask, rollout_logprobs, turn spans/boundaries, question_end).
    """
    play = GroupPlay(group_env, seed, options, sampling, trajectory_id_prefix, should_stop)
    return rollout_groups(engine, [play], chat, max_context_tokens=max_context_tokens,
                          stats=stats, max_retries=max_retries)[0]


def rollout_groups(engine: Engine, groups: Sequence[GroupPlay], chat: ChatTokenizer, *,
                   max_context_tokens: int = 32_768, stats: RolloutStats | None = None,
                   max_retries: int = 0) -> list[list[Trajectory]]:
    """Play several groups in lockstep: every turn, the live members of all groups share one
    engine call (a larger batch decodes more tokens per second). A member's requests and
    seeds are those rollout_group would send, so each group's trajectories are the ones it
    would get alone (up to the float rounding of a different batch). Any group's
    `should_stop` abandons them all (RolloutCancelled)."""
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    stats = stats if stats is not None else RolloutStats()
    banned = banned_control_ids(chat)
    states = [_GroupState.start(play, chat, stats) for play in groups]

    for turn_index in itertools.count():  # ends when every member of every group is done
        for state in states:
            if state.play.should_stop is not None and state.play.should_stop():
                engine.forget_conversations()
                raise RolloutCancelled(f"group of task {state.task.id} cancelled before "
                                       f"turn {turn_index}")
        asked = [(state, state.requests(turn_index, chat, banned, max_context_tokens))
                 for state in states]
        requests = [request for _, (_, group_requests) in asked for request in group_requests]
        if not requests:
            break
        results = iter(_generate(engine, requests, stats))
        for state, (asking, group_requests) in asked:
            if not asking:
                continue
            group_results = [next(results) for _ in asking]
            if max_retries:
                group_results = _retried(engine, state.play.group_env, chat, state.members,
                                         asking, group_requests, group_results, max_retries,
                                         stats)
            state.step(asking, group_results, chat, stats)

    engine.forget_conversations()  # the episodes are over: free their KV caches
    return [state.trajectories() for state in states]


@dataclass
class _GroupState:
    """One group's members as its episodes are played."""

    play: GroupPlay
    sampling: SamplingConfig
    task: Any
    members: list[_Member]

    @classmethod
    def start(cls, play: GroupPlay, chat: ChatTokenizer, stats: RolloutStats) -> _GroupState:
        group_env = play.group_env
        if getattr(group_env.envs[0].toolbox, "timeout_s", 0) is None \
                and not _offline_tools(group_env.envs[0]):
            warnings.warn("the group env's tools have no timeout (tool_timeout_s=None): a "
                          "stuck remote backend would stall the rollout", RuntimeWarning,
                          stacklevel=4)
        started = time.perf_counter()
        questions, _ = group_env.reset(seed=play.seed, options=play.options)
        members = [_Member(ConversationBuilder(chat, [
            {"role": "system", "content": group_env.system_prompt},
            {"role": "user", "content": question}])) for question in questions]
        stats.env_seconds += time.perf_counter() - started
        return cls(play, play.sampling or SamplingConfig(), group_env.task, members)

    def requests(self, turn_index: int, chat: ChatTokenizer, banned: list[int],
                 max_context_tokens: int) -> tuple[list[int], list[GenerationRequest]]:
        """(members asked, their requests) for this turn; members out of context room are
        cut first."""
        sampling, requests, asking = self.sampling, [], []
        for i, member in enumerate(self.members):
            if member.done:
                continue
            prompt = member.builder.prompt_ids()
            room = max_context_tokens - len(prompt)
            if room < 1:
                _cut_for_context(self.play.group_env, member, i)
                continue
            requests.append(GenerationRequest(
                prompt_ids=prompt, max_new_tokens=min(sampling.max_turn_tokens, room),
                temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                stop_token_ids=[chat.end_of_turn_id], stop_strings=list(sampling.stop_strings),
                banned_token_ids=banned, presence_penalty=sampling.presence_penalty,
                seed=None if sampling.seed is None else sampling.seed + 1000 * turn_index + i))
            asking.append(i)
        return asking, requests

    def step(self, asking: list[int], results: list[GenerationResult], chat: ChatTokenizer,
             stats: RolloutStats) -> None:
        """The asked members' generated turns into their conversations and the env."""
        group_env = self.play.group_env
        started = time.perf_counter()
        actions: list[str | None] = [None] * len(self.members)
        texts: dict[int, str] = {}
        for i, result in zip(asking, results):
            member = self.members[i]
            stats.generated_tokens += len(result.token_ids)
            text = _decoded(chat, result)
            member.builder.add_generation(result.token_ids, text, result.logprobs)
            member.finish_reasons.append(result.finish_reason)
            # The record keeps the builder's text (control-token strings defused), so the
            # turn and its message agree; the environment parses what was generated.
            texts[i] = member.builder.messages[-1]["content"]
            actions[i] = text_before_stop_string(text, result.stop_string)
        observations, rewards, _, _, infos = group_env.step(actions)
        for i in asking:
            _record_step(self.members[i], texts[i], observations[i], rewards[i], infos[i],
                         group_env.done[i])
        stats.env_seconds += time.perf_counter() - started

    def trajectories(self) -> list[Trajectory]:
        prefix = self.play.trajectory_id_prefix or self.task.id
        return [_trajectory(member, f"{prefix}/{i}", self.task, self.play.seed)
                for i, member in enumerate(self.members)]


def _offline_tools(env: Any) -> bool:
    """Whether the env's tools are all the world's own (its index and the extractive
    summarizer): nothing can hang, so no timeout is needed."""
    config = getattr(env, "config", None)
    return config is not None and config.backend == "corpus" \
        and config.search_backend == "local" and config.summarizer == "extractive" \
        and not getattr(config, "extra_tools", None)


def _generate(engine: Engine, requests: list[GenerationRequest], stats: RolloutStats
              ) -> list[GenerationResult]:
    started = time.perf_counter()
    results = engine.generate(requests)
    stats.engine_seconds += time.perf_counter() - started
    stats.engine_calls += 1
    return results


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


def _retried(engine: Engine, group_env: Any, chat: ChatTokenizer, members: list[_Member],
             asking: list[int], requests: list[GenerationRequest],
             results: list[GenerationResult], max_retries: int, stats: RolloutStats
             ) -> list[GenerationResult]:
    """The results with every turn `retry_reason` rejects sampled again, up to max_retries
    times; the last attempt stands whatever it is. Discarded attempts go to the members'
    `discarded` lists."""
    results = list(results)
    for attempt in range(max_retries):
        again = []
        for slot, (i, result) in enumerate(zip(asking, results)):
            text = _decoded(chat, result)
            valid, _, parsed = group_env.envs[i].judge_turn(
                text_before_stop_string(text, result.stop_string))
            reason = retry_reason(text, valid, parsed, members[i].tool_calls)
            if reason:
                members[i].discarded.append({
                    "turn": len(members[i].turns) + 1, "attempt": attempt + 1, "reason": reason,
                    "cut": result.finish_reason == "length", "text": text})
                again.append(slot)
        if not again:
            break
        retry = [dataclasses.replace(requests[slot], seed=None if requests[slot].seed is None
                                     else requests[slot].seed + RETRY_SEED_STRIDE * (attempt + 1))
                 for slot in again]
        for slot, result in zip(again, _generate(engine, retry, stats)):
            results[slot] = result
    return results


def _decoded(chat: ChatTokenizer, result: GenerationResult) -> str:
    """A generated turn's text, without its end-of-turn id."""
    ids = result.token_ids
    text_ids = ids[:-1] if ids and ids[-1] == chat.end_of_turn_id else ids
    return chat.tokenizer.decode(text_ids, skip_special_tokens=False,
                                 clean_up_tokenization_spaces=False)


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
    member.tool_calls.update(tool_call_key(ToolCall(call["name"], call["arguments"]))
                             for call in info.get("tool_calls", []))
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
    # (the format penalty stays a separate component).
    member.turns[-1].outcome_reward = member.score
    tokenized = member.builder.finish()
    return Trajectory(
        id=trajectory_id, messages=member.builder.messages, task_id=task.id,
        question=task.question, answers=list(task.answers), turns=member.turns,
        outcome=member.score,
        metadata={"hops": task.hops, "seed": seed, "budget": member.budget,
                  "finish_reasons": member.finish_reasons,
                  **({"discarded_turns": member.discarded} if member.discarded else {})},
    ).with_tokens(tokenized, member.builder.rollout_logprobs)


class OneEnvGroup:
    """A single DeepResearch env (wrapped or not) with the group interface rollout_group
    plays: a group of one. Wrappers see every step (e.g. a narrator printing the turns)."""

    def __init__(self, env: Any):
        self.env = env
        self.envs = [env.unwrapped]
        self.terminated, self.truncated = [True], [True]

    @property
    def task(self) -> Any:
        return self.env.unwrapped.task

    @property
    def system_prompt(self) -> str:
        return self.env.unwrapped.system_prompt

    @property
    def done(self) -> list[bool]:
        return [self.terminated[0] or self.truncated[0]]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[list[str], list[dict[str, Any]]]:
        observation, info = self.env.reset(seed=seed, options=options)
        self.terminated, self.truncated = [False], [False]
        return [observation], [info]

    def step(self, actions: Sequence[str | None]) -> tuple[list, list, list, list, list]:
        observation, reward, terminated, truncated, info = self.env.step(actions[0])
        self.terminated, self.truncated = [terminated], [truncated]
        return [observation], [reward], [terminated], [truncated], [info]


def play_episode(engine: Engine, env: Any, chat: ChatTokenizer, *,
                 task_index: int | None = None, seed: int | None = None,
                 sampling: SamplingConfig | None = None, max_retries: int = 0,
                 max_context_tokens: int = 32_768, trajectory_id: str = "") -> Trajectory:
    """One episode of `env` (task `task_index` of its split, else one drawn with `seed`),
    played by rollout_group as a group of one; the trajectory is checked
    (trainers.trajectory.check_invariants)."""
    options = {"task_index": task_index} if task_index is not None else None
    trajectory = rollout_group(engine, OneEnvGroup(env), chat, seed=seed, options=options,
                               sampling=sampling, max_context_tokens=max_context_tokens,
                               max_retries=max_retries)[0]
    if trajectory_id:
        trajectory.id = trajectory_id
    check_invariants(trajectory)
    return trajectory
