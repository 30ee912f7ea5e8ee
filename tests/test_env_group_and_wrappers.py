"""The group env (G copies on one task) and the chat-history wrapper."""

from __future__ import annotations

import gymnasium as gym
import pytest

import envs  # noqa: F401  (registers the environments)
from envs.group import DeepResearchGroupEnv
from envs.wrappers import ChatHistory
from venus_gym.protocol import format_answer_turn, format_tool_turn

SMALL = {"world_size": 300, "world_seed": 3}


def test_group_members_share_task_and_backends():
    group = DeepResearchGroupEnv(group_size=4, **SMALL)
    obs, infos = group.reset(seed=7)
    assert len(set(obs)) == 1 and len({i["task_id"] for i in infos}) == 1
    assert len({id(e.toolbox) for e in group.envs}) == 1
    obs2, _ = group.reset(seed=7)
    assert obs2 == obs
    ids = {group.reset(seed=s)[1][0]["task_id"] for s in range(10)}
    assert len(ids) > 1


def test_group_steps_as_batch_and_finished_members_take_none():
    group = DeepResearchGroupEnv(group_size=3, num_threads=2, reveal_answer_in_info=True,
                                 **SMALL)
    _, infos = group.reset(seed=1)
    gold = infos[0]["gold_answers"][0]
    search = format_tool_turn("s", "search", {"query": [group.task.gold_path[0]["entity"]]})
    obs, rew, term, trunc, info = group.step(
        [format_answer_turn("t", gold), search, "broken"])
    assert rew == [1.0, 0.0, -1.0]
    assert term == [True, False, False] and group.done == [True, False, False]
    assert obs[0] == "" and "<tool_response>" in obs[1]
    with pytest.raises(ValueError, match="pass None"):
        group.step(["x", "y", "z"])
    with pytest.raises(TypeError, match="needs an action"):
        group.step([None, None, "z"])
    # A bad action is rejected before any member steps: nobody's state changes.
    with pytest.raises(TypeError, match="member 2"):
        group.step([None, search, 123])
    assert group.done == [True, False, False] and not group.envs[1]._done
    obs, rew, term, trunc, info = group.step([None, format_answer_turn("t", "no"),
                                              format_answer_turn("t", gold)])
    assert rew == [0.0, 0.0, 1.0] and group.all_done
    group.close()


def test_chat_history_builds_the_conversation():
    env = ChatHistory(gym.make("DeepResearch-v0", **SMALL))
    msgs, info = env.reset(seed=0)
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert msgs[1]["content"] == info["question"]
    assert env.observation_space.contains(msgs)
    msgs, *_ = env.step("malformed")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[2]["content"] == "malformed"
    assert msgs[3]["content"].startswith("<tool_response>")
    msgs, _, term, _, _ = env.step(format_answer_turn("t", "x"))
    assert term and msgs[-1] == {"role": "assistant", "content": format_answer_turn("t", "x")}
    assert env.observation_space.contains(msgs)
