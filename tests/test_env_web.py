"""DeepResearch-v0 with backend="web" against a fake web on 127.0.0.1: every tool failure is
an observation, keys never leak, a recorded 20-episode run replays identically without the
network, and a replay miss is a clear error."""

from __future__ import annotations

import json
import re

import gymnasium as gym
import pytest

import envs  # noqa: F401  (registers DeepResearch-v0)
from envs.config import DeepResearchConfig
from tests.web_fixtures import FakeWeb
from venus_gym.tools import CacheMissError

LINK = re.compile(r"\]\((http[^)\s]+)\)")
CAPITAL = re.compile(r"is (City\d+ville)")


@pytest.fixture()
def web():
    w = FakeWeb()
    yield w
    w.close()


def web_env(web, **kwargs):
    kwargs.setdefault("search_provider", "searxng")
    kwargs.setdefault("search_url", web.url + "/searxng")
    kwargs.setdefault("allow_hosts", [f"127.0.0.1:{web.port}"])
    kwargs.setdefault("tool_retries", 0)
    return gym.make("DeepResearch-v0", backend="web", **kwargs).unwrapped


def tool(name, **arguments):
    return (f"<think>use {name}</think>\n<tool_call>"
            f"{json.dumps({'name': name, 'arguments': arguments})}</tool_call>")


def answer(text):
    return f"<think>done</think>\n<answer>{text}</answer>"


def scripted_episode(env, question, gold):
    """Search the question, visit the first result, answer what the page says."""
    observations, rewards = [], []
    obs, _ = env.reset(options={"question": question, "answer": gold})
    observations.append(obs)
    obs, reward, *_ = env.step(tool("search", query=[question]))
    observations.append(obs)
    rewards.append(reward)
    links = LINK.findall(obs)
    obs, reward, *_ = env.step(tool("visit", url=links[:1] or ["http://none.invalid/"],
                                    goal=question))
    observations.append(obs)
    rewards.append(reward)
    found = CAPITAL.search(obs)
    obs, reward, terminated, *_ = env.step(answer(found.group(1) if found else "unknown"))
    assert terminated
    rewards.append(reward)
    return observations, rewards


def run(env, n=20):
    out = []
    for i in range(n):
        gold = f"City{i}ville" if i % 5 else "Atlantis"  # every fifth answer is wrong
        out.append(scripted_episode(env, f"What is the capital of Country {i}?", gold))
    return out


def test_record_then_replay_20_episodes_identically(web, tmp_path):
    cache = tmp_path / "web.sqlite"
    env = web_env(web, cache_mode="record", cache_path=str(cache))
    recorded = run(env)
    cost = env.cost()
    assert cost["search_calls"] == 20 and cost["fetch_calls"] == 20
    assert cost["bytes_received"] > 0 and cost["cache_hits"] == 0
    rewards = [r for _, rs in recorded for r in rs]
    assert sum(rewards) == 16.0  # 16 right answers, 4 deliberately wrong golds
    assert all("City" in obs[2] for obs, _ in recorded)
    web.close()  # replay must not need the network

    replay = web_env(web, cache_mode="replay", cache_path=str(cache))
    assert run(replay) == recorded
    assert replay.cost()["search_calls"] == 0 and replay.cost()["cache_hits"] == 40
    # A recording keeps its answers: recording again over it changes nothing either.
    again = web_env(web, cache_mode="record", cache_path=str(cache))
    assert run(again) == recorded

    replay.reset(options={"question": "What is the capital of Country 99?", "answer": "x"})
    with pytest.raises(CacheMissError) as e:
        replay.step(tool("search", query=["What is the capital of Country 99?"]))
    message = str(e.value)
    assert str(cache) in message and "Country 99" in message and "key " in message


def test_every_failure_is_an_observation(web):
    env = web_env(web, fetch_timeout_s=0.3, fetch_max_bytes=50_000)
    env.reset(options={"question": "q?", "answer": "a"})
    bad = [f"{web.url}/binary", f"{web.url}/missing", f"{web.url}/slow",
           f"{web.url}/redirect?to=http://localhost:{web.port}/page/1",
           f"{web.url}/redirect?to=file:///etc/passwd", "http://10.0.0.1/",
           "http://169.254.169.254/latest/meta-data/", "ftp://example.org/x", "not a url"]
    for url in bad:
        obs, reward, terminated, truncated, info = env.step(tool("visit", url=[url], goal="g"))
        assert "could not be accessed" in obs and reward == 0.0
        assert not (terminated or truncated)
        assert info["tool_calls"][0]["ok"] is False and info["tool_calls"][0]["error"]
    obs, *_, info = env.step(tool("visit", url=[f"{web.url}/huge"], goal="word"))
    assert info["tool_calls"][0]["ok"] and "page cut at 50000 bytes" not in obs  # evidence
    broken = web_env(web, search_url="http://127.0.0.1:9")
    broken.reset(options={"question": "q?", "answer": "a"})
    obs, *_, info = broken.step(tool("search", query=["anything"]))
    assert "failed" in obs and "unreachable" in obs and info["tool_calls"][0]["ok"] is False


def test_api_key_never_reaches_observations_info_repr_or_cache(web, tmp_path, monkeypatch):
    key = "sk-live-DO-NOT-LEAK-0123456789"
    monkeypatch.setenv("WRONG_SERPER_KEY", key)  # the fake server echoes a wrong key
    cache = tmp_path / "k.sqlite"
    env = web_env(web, search_provider="serper", search_url=web.url + "/serper",
                  search_api_key_env="WRONG_SERPER_KEY", cache_mode="record",
                  cache_path=str(cache))
    seen = [repr(env.toolbox.search_backend.backend), repr(env.config), str(env.config.to_dict())]
    obs, info = env.reset(options={"question": "q?", "answer": "a"})
    seen += [obs, repr(info)]
    obs, _, _, _, info = env.step(tool("search", query=["Country 1"]))
    seen += [obs, repr(info)]
    assert "HTTP 403" in obs  # the error is shown ...
    assert all(key not in text for text in seen)  # ... without the key
    env.toolbox.search_backend.cache.close()
    assert key.encode() not in cache.read_bytes()


def test_serper_key_from_the_default_variable(web, monkeypatch):
    monkeypatch.setenv("SERPER_API_KEY", "test-serper-key")
    env = web_env(web, search_provider="serper", search_url=web.url + "/serper")
    env.reset(options={"question": "Capital of Country 2?", "answer": "City2ville"})
    obs, *_ = env.step(tool("search", query=["Capital of Country 2?"]))
    assert f"1. [Country 2]({web.url}/page/2)" in obs


def test_llm_summarizer_counts_tokens_and_replays(web, tmp_path):
    cache = tmp_path / "llm.sqlite"
    kwargs = dict(summarizer="openai", summarizer_url=web.url + "/v1", cache_path=str(cache))
    env = web_env(web, cache_mode="record", **kwargs)
    env.reset(options={"question": "Capital of Country 3?", "answer": "City3ville"})
    visit = tool("visit", url=[f"{web.url}/page/3"], goal="capital")
    obs, *_, info = env.step(visit)
    assert "LLM: The capital of Country 3 is City3ville." in obs
    assert info["cost"]["summarizer_calls"] == 1
    assert info["cost"]["summarizer_prompt_tokens"] == 100
    assert info["cost"]["summarizer_completion_tokens"] == 10
    web.close()
    replay = web_env(web, cache_mode="replay", **kwargs)
    replay.reset(options={"question": "Capital of Country 3?", "answer": "City3ville"})
    assert replay.step(visit)[0] == obs
    assert replay.cost()["summarizer_calls"] == 0


def test_tasks_from_a_qa_file(web, tmp_path):
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"id": "c4", "question": "What is the capital of Country 4?",
                              "answers": ["City4ville"], "paragraphs": []}) + "\n")
    env = web_env(web, world=str(qa))
    obs, info = env.reset(seed=0)
    assert obs == "What is the capital of Country 4?" and info["task_id"] == "c4"
    no_file = web_env(web)
    with pytest.raises(ValueError, match="options=.*question"):
        no_file.reset()


@pytest.mark.parametrize("kwargs, message", [
    ({"backend": "web"}, "search_provider"),
    ({"backend": "web", "search_provider": "searxng"}, "search_url"),
    ({"backend": "web", "search_provider": "bing", "search_url": "x"}, "search_provider"),
    ({"backend": "web", "search_provider": "searxng", "search_url": "x",
      "cache_mode": "replay"}, "cache_path"),
    ({"cache_mode": "record", "cache_path": "x"}, "backend='web'"),
    ({"backend": "internet"}, "backend"),
    ({"backend": "web", "search_provider": "searxng", "search_url": "x",
      "allow_hosts": "127.0.0.1"}, "allow_hosts"),
])
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DeepResearchConfig.from_kwargs(**kwargs)


def test_training_configs_accept_the_web_fields():
    from trainers.config_utils import EnvSection

    section = EnvSection(backend="web", search_provider="searxng",
                         search_url="http://127.0.0.1:8888", allow_hosts=["127.0.0.1:8888"],
                         cache_mode="replay", cache_path="web.sqlite")
    kwargs = section.kwargs()
    assert kwargs["backend"] == "web" and kwargs["cache_mode"] == "replay"
    assert DeepResearchConfig.from_kwargs(**kwargs).allow_hosts == ["127.0.0.1:8888"]
