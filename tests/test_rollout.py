"""Group rollouts (trainers.rollout): token in / token out with G environments, budgets, the
forced final turn, stop strings, and stuck or crashing tool backends. Every trajectory goes
through trainers.trajectory.check_invariants with the tokenizer."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from envs.group import DeepResearchGroupEnv
from tests.helpers import check_group
from trainers.engines.hf import HFEngine
from trainers.engines.scripted import ForcedHFEngine, ScriptedEngine, chatml_user_messages
from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm
from trainers.modeling.tokenization import ChatTokenizer
from trainers.rollout import (
    RolloutStats,
    SamplingConfig,
    banned_control_ids,
    rollout_group,
    text_token_counter,
)
from venus_gym.protocol import FORCED_FINAL_NOTICE
from venus_gym.tools.base import ToolBackendError
from venus_gym.worlds.oracle import OracleAgent

WORLD = {"world_size": 300, "world_seed": 3}
# Local tools cannot hang; the warning is tested once below.


@pytest.fixture(scope="module")
def chat() -> ChatTokenizer:
    group = DeepResearchGroupEnv(group_size=1, **WORLD)
    world = group.envs[0].world
    texts = [group.system_prompt] + [f"{p.title}\n{p.url}\n{p.text}" for p in world.corpus]
    texts += [task.question for task in world.tasks]
    group.close()
    return ChatTokenizer(build_chatml_tokenizer(texts[:400], vocab_size=700))


@pytest.fixture(scope="module")
def model(chat: ChatTokenizer) -> Any:
    return build_tiny_causal_lm(chat.tokenizer, hidden=64, layers=2, seed=0)


def oracle_respond(group: DeepResearchGroupEnv, suffix: str = ""):
    """The oracle agent replayed over the observations in the prompt (stateless)."""

    def respond(observations: list[str]) -> str:
        agent = OracleAgent(group.task, rng_seed=0)
        action = ""
        for observation in observations:
            action = agent.act(observation)
        return action + (suffix if "<tool_call>" in action else "")

    return respond


def test_random_policy_group_rollout_keeps_engine_ids_and_passes_invariants(chat, model):
    group = DeepResearchGroupEnv(group_size=3, max_turns=3, tool_timeout_s=5.0, **WORLD)
    stats = RolloutStats()
    trajectories = rollout_group(HFEngine(model, chat.tokenizer), group, chat, seed=1,
                                 sampling=SamplingConfig(max_turn_tokens=16, seed=0),
                                 stats=stats)
    check_group(trajectories, chat)
    assert len(trajectories) == 3 and group.all_done
    assert len({t.task_id for t in trajectories}) == 1
    for t in trajectories:
        # Cut turns: invalid, then the forced final turn after the notice (also invalid).
        assert t.turn_kinds == ["invalid"] * 4
        assert [turn.forced_final for turn in t.turns] == [False, False, False, True]
        assert t.turns[2].env_reply == FORCED_FINAL_NOTICE
        assert t.metadata["finish_reasons"] == ["length"] * 4
        assert t.turns[-1].outcome_reward == 0.0 and t.outcome == 0.0
        assert all(turn.format_reward == -1.0 for turn in t.turns)
        assert sum(t.loss_mask) == 16 * 4  # only generated ids are policy tokens
        banned = set(banned_control_ids(chat))
        policy_ids = [i for i, m in zip(t.input_ids, t.loss_mask) if m]
        assert not banned & set(policy_ids)
    assert stats.generated_tokens == 3 * 4 * 16 and stats.engine_calls == 4
    # Sampling seeds differ per member, so members produce different turns.
    assert len({t.messages[2]["content"] for t in trajectories}) > 1


class SpellsControlToken(ScriptedEngine):
    """Writes `<|im_start|>` character by character (ordinary ids), as a small-vocabulary
    model can, then ends the turn."""

    def generate(self, requests):
        from trainers.engines.base import GenerationResult

        ids = [i for ch in "<|im_start|>user" for i in
               self.tokenizer.encode(ch, add_special_tokens=False)]
        return [GenerationResult([*ids, self.end_of_turn_id], [-1.0] * (len(ids) + 1), "stop")
                for _ in requests]


def test_turn_that_spells_a_control_token_is_kept_token_exact(chat):
    group = DeepResearchGroupEnv(group_size=2, max_turns=2, **WORLD)
    engine = SpellsControlToken(chat.tokenizer, lambda observations: "", chat.end_of_turn_id)
    trajectories = rollout_group(engine, group, chat, seed=4)
    check_group(trajectories, chat)  # turn text == message text, ids as generated
    spelled = engine.generate([None])[0].token_ids
    for t in trajectories:
        assert t.turn_kinds == ["invalid"] * 3
        start, end = t.turn_spans[0]
        assert t.input_ids[start:end] == spelled
        assert "im_start" in t.turns[0].assistant


def test_oracle_group_uses_search_and_visit_and_answers(chat):
    group = DeepResearchGroupEnv(group_size=2, max_turns=12, **WORLD)
    engine = ScriptedEngine(chat.tokenizer, oracle_respond(group), chat.end_of_turn_id)
    trajectories = rollout_group(engine, group, chat, seed=2)
    check_group(trajectories, chat)
    for t in trajectories:
        assert "search" in t.turn_kinds and "visit" in t.turn_kinds
        assert t.turn_kinds[-1] == "answer" and t.outcome == 1.0
        assert t.turns[-1].outcome_reward == 1.0
        assert len(t.turn_boundaries) == len(t.turn_spans) == len(t.turns)
        # Tool replies are template ids with mask 0 and come back as user messages.
        assert t.messages[3]["role"] == "user"
        assert t.messages[3]["content"].startswith("<tool_response>")


def test_real_model_stop_string_keeps_ids_and_env_reads_text_before_it(chat, model):
    # Two turns keep the real model's prefills short: a search that runs into the stop
    # string, a visit cut by the turn budget (the notice replaces its result), then the
    # forced final answer.
    group = DeepResearchGroupEnv(group_size=2, max_turns=2, **WORLD)
    respond = oracle_respond(group, suffix="\n<tool_response>\nmade-up result")
    engine = ForcedHFEngine(model, chat.tokenizer, respond, chat.end_of_turn_id)
    trajectories = rollout_group(engine, group, chat, seed=2,
                                 sampling=SamplingConfig(max_turn_tokens=400))
    check_group(trajectories, chat)
    for t in trajectories:
        assert t.metadata["finish_reasons"] == ["stop_string", "stop_string", "stop"]
        assert t.turns[0].kind == "search" and t.turns[0].valid
        assert t.turns[0].assistant.endswith("<tool_response>")
        assert "made-up" not in t.turns[0].assistant
        assert t.turns[0].env_reply.startswith("<tool_response>")
        assert t.turns[1].env_reply == FORCED_FINAL_NOTICE
        assert t.turns[2].forced_final and t.turn_kinds[2] == "answer"
        # The real model's log-probs of the forced ids, on policy tokens only.
        assert all(lp < 0 for lp, m in zip(t.rollout_logprobs, t.loss_mask) if m)


def test_context_budget_in_real_tokens_cuts_the_member(chat, model):
    group = DeepResearchGroupEnv(group_size=2, max_turns=50, **WORLD)
    engine = ScriptedEngine(chat.tokenizer, oracle_respond(group), chat.end_of_turn_id)
    prompt_length = len(chat.prompt_ids([{"role": "system", "content": group.system_prompt},
                                         {"role": "user", "content": "x"}]))
    budget = prompt_length + 400
    trajectories = rollout_group(engine, group, chat, seed=2, max_context_tokens=budget)
    check_group(trajectories, chat)
    for t in trajectories:
        # Nothing is generated past the budget; only the last env reply (mask 0) may end
        # beyond it, and the rollout then stops the member.
        assert all(end <= budget for _, end in t.turn_spans)
        assert t.turn_boundaries[-1] == len(t.input_ids) > budget - 1
        assert t.metadata["budget"] == "rollout_context"
        assert t.turn_kinds[-1] != "answer"


def test_env_context_budget_with_real_token_counter_forces_a_final_answer(chat):
    group = DeepResearchGroupEnv(group_size=2, max_turns=50, max_context_tokens=1500,
                                 token_counter=text_token_counter(chat), **WORLD)
    engine = ScriptedEngine(chat.tokenizer, oracle_respond(group), chat.end_of_turn_id)
    trajectories = rollout_group(engine, group, chat, seed=2, max_context_tokens=100_000)
    check_group(trajectories, chat)
    for t in trajectories:
        assert any(turn.env_reply == FORCED_FINAL_NOTICE for turn in t.turns)
        assert t.turns[-1].forced_final and t.metadata["budget"] in ("context", None)


class _StuckSearch:
    """Hangs until the test releases it (at most 10 s)."""

    def __init__(self):
        self.release = threading.Event()
        self.calls = self.answered = 0

    def search(self, query: str, k: int) -> list[Any]:
        self.calls += 1
        self.release.wait(10.0)
        self.answered += 1
        return []


class _CrashingSearch:
    def search(self, query: str, k: int) -> list[Any]:
        raise ToolBackendError("search backend crashed")


@pytest.mark.parametrize("kind", ["stuck", "crashing"])
def test_stuck_or_crashing_tool_backend_cannot_hang_the_rollout(chat, kind):
    # Two turns: one search (run), then the forced final turn; no retries, so a stuck
    # backend costs one 0.2 s timeout per query and is never waited for.
    backend = _StuckSearch() if kind == "stuck" else _CrashingSearch()
    group = DeepResearchGroupEnv(group_size=2, max_turns=2, tool_timeout_s=0.2, tool_retries=0,
                                 **WORLD)
    group.envs[0].toolbox.search_backend = backend  # shared by every member
    engine = ScriptedEngine(chat.tokenizer, oracle_respond(group), chat.end_of_turn_id)
    try:
        trajectories = rollout_group(engine, group, chat, seed=2)
        if kind == "stuck":  # every call was abandoned while its backend still hung
            assert backend.answered == 0
    finally:
        if kind == "stuck":
            backend.release.set()
    check_group(trajectories, chat)
    for t in trajectories:
        assert t.turns[0].kind == "search"
        assert "failed" in t.turns[0].env_reply
        assert t.turns[-1].forced_final
    assert group.all_done


def test_rollout_warns_without_tool_timeout_for_plugin_tools_and_helpers_work(chat):
    import warnings

    from trainers.rollout import RolloutCancelled

    group = DeepResearchGroupEnv(group_size=1, max_turns=2, **WORLD)
    engine = ScriptedEngine(chat.tokenizer, oracle_respond(group), chat.end_of_turn_id)
    with warnings.catch_warnings():  # the world's own tools cannot hang: no warning
        warnings.simplefilter("error")
        check_group(rollout_group(engine, group, chat, seed=0), chat)
    # A plug-in tool may hang: without tool_timeout_s the rollout says so (remote search and
    # summarizer backends get a 30 s default from the env).
    plugged = DeepResearchGroupEnv(group_size=1, max_turns=2, extra_tools=["calculator"],
                                   **WORLD)
    with pytest.warns(RuntimeWarning, match="no timeout"), pytest.raises(RolloutCancelled):
        rollout_group(engine, plugged, chat, seed=0, should_stop=lambda: True)
    assert chatml_user_messages("<|im_start|>user\nhi<|im_end|>\n<|im_start|>user\nyo<|im_end|>"
                                ) == ["hi", "yo"]
    assert chat.end_of_turn_id not in banned_control_ids(chat)
    with pytest.raises(ValueError, match="fills max_context_tokens"):
        rollout_group(engine, group, chat, seed=0, max_context_tokens=5)
