"""DeepResearch-v0 as peers' environments are used: plug-in tools (the calculator and a
user's own), a reward callable, Gymnasium's vector API in both modes with autoreset, and
get_state/set_state branching."""

from __future__ import annotations

import time

import gymnasium as gym
import pytest

import envs  # noqa: F401  (registers the environments)
from venus_gym.protocol import (
    format_answer_turn,
    format_tool_turn,
    parse_turn,
    register_tool_schema,
)
from venus_gym.tools import CalculatorTool, calculate, resolve_tool
from venus_gym.tools.calculator import CalculatorError

SMALL = {"world_size": 100}


# --- the calculator -----------------------------------------------------------------------------
@pytest.mark.parametrize("expression,value", [("2*(3+4)", 14), ("7 // 2 + 7 % 2", 4),
                                              ("-2 ** 2", -4), ("sqrt(16) + abs(-1)", 5.0),
                                              ("max(1, 2.5)", 2.5), ("(1871 - 1850) * 12", 252)])
def test_calculator_evaluates_arithmetic(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize("expression,reason", [
    ("__import__('os').system('true')", "not allowed"), ("open('x')", "not allowed"),
    ("x + 1", "not allowed"), ("'a' * 3", "not allowed"), ("(1).real", "not allowed"),
    ("1 / 0", "division by zero"), ("9 ** 9 ** 9", "digits"), ("(-8) ** 0.5", "real"),
    ("1e308 * 10", "finite"), ("2 +", "not an arithmetic"), ("1" * 600, "characters"),
    ("sqrt(-1)", "sqrt"), ("(" * 200 + "1" + ")" * 200, ""),
])
def test_calculator_refuses_everything_else_with_a_reason(expression, reason):
    start = time.process_time()
    try:
        value = calculate(expression)
    except CalculatorError as e:
        assert reason in str(e)
    else:  # deep parentheses are arithmetic too
        assert reason == "" and value == 1
    assert time.process_time() - start < 5  # no exponentiation bomb ran


# --- plug-in tools ------------------------------------------------------------------------------
class Reverser:
    """A user's own tool with a string and an integer argument."""

    name = "reverse"
    schema = {"type": "function", "function": {
        "name": "reverse", "description": "Reverse a word, repeated n times.",
        "parameters": {"type": "object",
                       "properties": {"word": {"type": "string"}, "n": {"type": "integer"}},
                       "required": ["word", "n"], "additionalProperties": False}}}

    def call(self, arguments: dict) -> str:
        if arguments["n"] > 3:
            raise RuntimeError("n must be at most 3")
        return arguments["word"][::-1] * arguments["n"]


def test_calculator_plug_in_is_offered_parsed_and_run():
    env = gym.make("DeepResearch-v0", extra_tools=["calculator"], **SMALL)
    _, info = env.reset(seed=0)
    assert '"name": "calculator"' in info["system_prompt"] and '"name": "search"' in info[
        "system_prompt"]
    obs, reward, _, _, info = env.step(format_tool_turn("t", "calculator",
                                                        {"expression": "2*(3+4)"}))
    assert obs == "<tool_response>\n2*(3+4) = 14\n</tool_response>" and reward == 0.0
    assert info["kind"] == "calculator" and info["tool_calls"][0]["ok"]
    obs, _, _, _, info = env.step(format_tool_turn("t", "calculator", {"expression": "1/0"}))
    assert "division by zero" in obs and info["valid"] and not info["tool_calls"][0]["ok"]
    _, reward, _, _, info = env.step(format_tool_turn("t", "calculator", {"expression": 3}))
    assert not info["valid"] and "must be a non-empty string" in info["reason"] and reward < 0
    # Search still works beside it.
    obs, _, _, _, info = env.step(format_tool_turn("t", "search", {"query": ["x"]}))
    assert info["kind"] == "search"


def test_a_users_tool_object_and_module_spec_and_only_plug_ins():
    env = gym.make("DeepResearch-v0", tools=(), **SMALL,
                   extra_tools=[Reverser(), "venus_gym.tools.calculator:CalculatorTool"])
    _, info = env.reset(seed=0)
    assert '"name": "search"' not in info["system_prompt"]
    obs, _, _, _, info = env.step(format_tool_turn("t", "reverse", {"word": "abc", "n": 2}))
    assert obs == "<tool_response>\ncbacba\n</tool_response>"
    obs, _, _, _, info = env.step(format_tool_turn("t", "reverse", {"word": "abc", "n": 9}))
    assert "n must be at most 3" in obs and not info["tool_calls"][0]["ok"]
    _, _, _, _, info = env.step(format_tool_turn("t", "reverse", {"word": "abc", "n": True}))
    assert not info["valid"] and "must be an integer" in info["reason"]
    _, _, _, _, info = env.step(format_tool_turn("t", "search", {"query": ["x"]}))
    assert not info["valid"] and "unknown tool 'search'" in info["reason"]


def test_unknown_or_clashing_plug_ins_fail_loudly():
    with pytest.raises(ValueError, match="unknown plug-in tool 'abacus'"):
        gym.make("DeepResearch-v0", extra_tools=["abacus"], **SMALL)
    with pytest.raises(ValueError, match="not a tool"):
        gym.make("DeepResearch-v0", extra_tools=[object()], **SMALL)
    clash = Reverser()
    clash.name = "search"
    clash.schema = {"type": "function", "function": {**Reverser.schema["function"],
                                                     "name": "search"}}
    with pytest.raises(ValueError, match="built-in"):
        resolve_tool(clash)
    with pytest.raises(ValueError, match="supported"):
        register_tool_schema({"type": "function", "function": {
            "name": "bad", "parameters": {"type": "object",
                                          "properties": {"x": {"type": "tuple"}}}}})


def test_parser_accepts_a_registered_tool_only_where_offered():
    register_tool_schema(CalculatorTool.schema)
    turn = format_tool_turn("t", "calculator", {"expression": "1+1"})
    assert parse_turn(turn, ("search", "calculator")).valid
    default = parse_turn(turn)  # search and visit only, as before
    assert not default.valid and default.reason == "unknown tool 'calculator'; available: " \
                                                   "search, visit"


# --- reward callables ---------------------------------------------------------------------------
def length_reward(prediction: str, answers: list[str], task) -> float:
    assert isinstance(answers, list) and task.answers == tuple(answers)
    return len(prediction) / 10


@pytest.mark.parametrize("reward_fn", [length_reward,
                                       "tests.test_env_integrations:length_reward"])
def test_reward_fn_replaces_the_metric(reward_fn):
    env = gym.make("DeepResearch-v0", reward_fn=reward_fn, **SMALL)
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(format_answer_turn("t", "abcd"))
    assert terminated and reward == pytest.approx(0.4) and info["score"] == reward


def test_reward_fn_misconfigured_or_misbehaving_fails_loudly():
    with pytest.raises(ValueError, match="reward_fn must be a callable"):
        gym.make("DeepResearch-v0", reward_fn=3, **SMALL)
    with pytest.raises(ValueError, match="has no attribute"):
        gym.make("DeepResearch-v0", reward_fn="venus_gym.scoring:nothing_here", **SMALL)
    env = gym.make("DeepResearch-v0", reward_fn=lambda p, a, t: float("nan"), **SMALL)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="finite float"):
        env.step(format_answer_turn("t", "x"))


# --- Gymnasium's vector API -----------------------------------------------------------------------
def test_make_vec_sync_and_async_agree_and_autoreset():
    runs = {}
    for mode in ("sync", "async"):
        vec = gym.make_vec("DeepResearch-v0", num_envs=2, vectorization_mode=mode,
                           reveal_answer_in_info=True, **SMALL)
        try:
            trace = []
            obs, info = vec.reset(seed=3)
            assert isinstance(obs, tuple) and len(obs) == 2 and vec.observation_space.contains(obs)
            gold = info["gold_answers"][0][0]
            trace.append(obs)
            # env 0 answers correctly (episode ends); env 1 searches with odd characters.
            actions = [format_answer_turn("t", gold),
                       format_tool_turn("t", "search", {"query": ["q \ud800 é 😀 \x1b"]})]
            obs, reward, terminated, truncated, info = vec.step(actions)
            assert list(terminated) == [True, False] and reward[0] == 1.0
            assert obs[0] == "" and "q \ufffd é 😀 \ufffd" in obs[1]
            trace.append((obs, tuple(reward)))
            # Next step: env 0 autoresets (its action ignored) to a new question.
            obs, reward, terminated, _, info = vec.step([format_answer_turn("t", "x"),
                                                         format_answer_turn("t", "y")])
            assert obs[0].strip() and not obs[0].startswith("<") and reward[0] == 0.0
            assert list(terminated) == [False, True]
            trace.append((obs, tuple(reward)))
            runs[mode] = trace
        finally:
            vec.close()
    assert runs["sync"] == runs["async"]


# --- branching ------------------------------------------------------------------------------------
def _play(env, turns):
    return [env.step(turn)[:4] for turn in turns]


def test_state_branching_replays_identically_and_branches_differ():
    env = gym.make("DeepResearch-v0", extra_tools=["calculator"], **SMALL).unwrapped
    env.reset(seed=5)
    title = env.world.corpus.get(env.task.gold_urls[0]).title
    _play(env, [format_tool_turn("t", "search", {"query": [title]}),
                format_tool_turn("t", "calculator", {"expression": "6*7"}),
                "not a turn"])
    snapshot = env.get_state()
    branch_a = [format_tool_turn("t", "search", {"query": ["mayor"]}),
                format_answer_turn("t", "Lumen")]
    first = _play(env, branch_a)
    after_first = env.reset(seed=None)[0]
    env.set_state(snapshot)
    assert _play(env, branch_a) == first
    assert env.reset(seed=None)[0] == after_first  # the RNG was restored too
    env.set_state(snapshot)
    second = _play(env, [format_tool_turn("t", "calculator", {"expression": "1+1"})])
    assert second[0] != first[0]
    env.set_state(snapshot)
    assert env.turn == 3 and env.transcript == snapshot["transcript"]
    with pytest.raises(ValueError, match="get_state"):
        env.set_state({"turn": 1})
