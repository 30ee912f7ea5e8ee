"""Hostile strings in the environment, the tools and the `/retrieve` server.

Observations never hold a C0 control but tab and newline, DEL, a C1 control or a lone
surrogate, whatever the action, the question or the page text; a query with a lone
surrogate is searched; the retrieval server validates its request fields.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import venus_gym  # noqa: F401  (registers the environments)
from envs.wrappers import ChatHistory
from venus_gym.corpus import Corpus, Page
from venus_gym.protocol import clean_text, sanitize_observation
from venus_gym.tools import CorpusPageStore, ExtractiveSummarizer, LocalSearchIndex, Toolbox
from venus_gym.tools.retrieval_server import serve_index

UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
HOSTILE = ["\x1b[31m", "\x1b]0;title\x07", "\x00", "\x7f", "\x85", "\x9b", "\r", "\r\n",
           "\ud800", "\udfff", "\u2028", "<|im_end|>", "</tool_response>", "\t", "\n"]
hostile_text = st.lists(st.one_of(st.sampled_from(HOSTILE), st.characters(), st.text(max_size=5)),
                        max_size=12).map("".join)
PROPERTY = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


def assert_clean(text: str) -> None:
    assert not UNSAFE.search(text), repr(text)
    text.encode("utf-8")


def tool_turn(name: str, arguments: object) -> str:
    # json.dumps escapes: control characters and surrogates arrive as \u escapes, as a model
    # would have to write them.
    payload = json.dumps({"name": name, "arguments": arguments})
    return f"<think>\nlook\n</think>\n<tool_call>\n{payload}\n</tool_call>"


@pytest.fixture(scope="module")
def env():
    return gym.make("DeepResearch-v0", world_size=300, world_seed=3).unwrapped


# --- the one cleaning function ----------------------------------------------------------------
@pytest.mark.parametrize("raw,clean", [
    ("a\x1b[31mb", "a\ufffd[31mb"), ("nul\x00", "nul\ufffd"), ("del\x7f", "del\ufffd"),
    ("c1\x85\x9b\x9f", "c1\ufffd\ufffd\ufffd"), ("x\ud800y\udfff", "x\ufffdy\ufffd"),
    ("crlf\r\nline\rend", "crlf\nline\nend"), ("tab\tnew\nline", "tab\tnew\nline"),
    ("é 東京 \U0001F600 \u00a0", "é 東京 \U0001F600 \u00a0"),
])
def test_clean_text_replaces_controls_and_lone_surrogates(raw, clean):
    assert clean_text(raw) == clean
    assert sanitize_observation(raw) == clean


@given(hostile_text)
def test_sanitize_observation_output_is_always_clean(text):
    cleaned = sanitize_observation(text)
    assert_clean(cleaned)
    assert "<|im_end|>" not in cleaned and "</tool_response>" not in cleaned


# --- the environment ----------------------------------------------------------------------------
@PROPERTY
@given(actions=st.lists(st.one_of(
    hostile_text,
    st.lists(hostile_text, min_size=1, max_size=3).map(
        lambda qs: tool_turn("search", {"query": qs})),
    st.tuples(st.lists(hostile_text, min_size=1, max_size=2), hostile_text).map(
        lambda ug: tool_turn("visit", {"url": ug[0], "goal": ug[1]})),
    hostile_text.map(lambda k: tool_turn("search", {"query": ["q"], k: 1})),
), min_size=1, max_size=4))
def test_observations_are_clean_for_any_actions(env, actions):
    obs, _ = env.reset(seed=0)
    assert_clean(obs)
    for action in actions:
        obs, _, terminated, truncated, info = env.step(action)
        assert_clean(obs)
        if terminated or truncated:
            break


def _search(env, *queries: str):
    env.reset(seed=0)
    return env.step(tool_turn("search", {"query": list(queries)}))


@pytest.mark.parametrize("hostile", ["\x1b[2J", "\x00", "\x7f", "\x9b", "\ud800", "\r"])
def test_each_hostile_character_in_a_query_url_and_goal_is_cleaned(env, hostile):
    obs, *_ = _search(env, f"bridge{hostile}river")
    assert_clean(obs)
    expected = "bridge\n" if hostile == "\r" else f"bridge\ufffd{hostile[1:]}"
    assert f"'{expected}river'" in obs
    env.reset(seed=0)
    obs, *_ = env.step(tool_turn("visit", {"url": [f"https://x/{hostile}"],
                                           "goal": f"goal{hostile}"}))
    assert_clean(obs)


def test_a_query_with_a_lone_surrogate_is_searched_not_a_tool_failure(env):
    title = env.world.corpus.pages[0].title
    obs, _, _, _, info = _search(env, f"{title}\ud800")
    call = info["tool_calls"][0]
    assert call["ok"] and call["error"] is None and env.world.corpus.pages[0].url in call["urls"]
    assert "failed" not in obs


def test_toolbox_hands_backends_clean_queries_urls_and_goals():
    seen: list[str] = []

    class Recording:
        def search(self, query, k):
            seen.append(query)
            return []

    class Pages:
        def fetch(self, url):
            seen.append(url)
            return Page(url, "T", "Text.")

    class Summaries(ExtractiveSummarizer):
        def summarize(self, page, goal):
            seen.append(goal)
            return super().summarize(page, goal)

    toolbox = Toolbox(Recording(), Pages(), Summaries())
    assert toolbox.search(["a\ud800\x1b"]).ok
    assert toolbox.visit(["u\x00"], "g\x9b").ok
    assert seen == ["a\ufffd\ufffd", "u\ufffd", "g\ufffd"]


def test_question_and_page_text_with_control_characters_give_clean_observations(tmp_path):
    record = {"id": "c", "question": "Where\x1b[31m is\x00 Alpha\x9b?", "answers": ["Lumen"],
              "paragraphs": [{"title": "Alpha\x07", "text": "Alpha\x1b[0m is in\r\nLumen\x85.",
                              "is_supporting": True}]}
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps(record) + "\n" + json.dumps({**record, "id": "d"}) + "\n",
                    encoding="utf-8")
    env = ChatHistory(gym.make("DeepResearch-v0", world=str(path), world_seed=0))
    messages, _ = env.reset(seed=0)
    for message in messages:
        assert_clean(message["content"])
    page = env.unwrapped.world.corpus.pages[0]
    messages, *_ = env.step(tool_turn("search", {"query": ["Alpha Lumen"]}))
    messages, *_ = env.step(tool_turn("visit", {"url": [page.url], "goal": "where\x1b"}))
    for message in messages:
        if message["role"] != "assistant":  # the actions are the policy's own tokens
            assert_clean(message["content"])
    assert "Lumen" in messages[-1]["content"]


# --- the /retrieve server -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def served():
    pages = [Page(f"https://w/{i}", f"River town {i}", f"River town {i} has a market {i}.")
             for i in range(12)]
    index = LocalSearchIndex(Corpus(pages))
    server, thread, url = serve_index(index)
    yield url + "/retrieve"
    server.shutdown()
    server.server_close()
    thread.join(5)


def post(url: str, body: object) -> tuple[int, object]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("topk,hits", [(None, 3), (0, 3), ("missing", 3), (2, 2), ("5", 5),
                                       (4.0, 4), (1000, 12)])
def test_retrieve_topk_null_and_zero_mean_the_default(served, topk, hits):
    body = {"queries": ["river town market"]}
    if topk != "missing":
        body["topk"] = topk
    status, reply = post(served, body)
    assert status == 200 and len(reply["result"][0]) == hits


@pytest.mark.parametrize("topk", [-1, "ten", True, 2.5, [3], {"k": 3}])
def test_retrieve_rejects_other_topk_values_with_a_reason(served, topk):
    status, reply = post(served, {"queries": ["river"], "topk": topk})
    assert status == 400 and "'topk' must be a positive integer" in reply["error"]


@pytest.mark.parametrize("flag,scored", [(True, True), (False, False), ("true", True),
                                         ("false", False), ("False", False), (None, False)])
def test_retrieve_return_scores_accepts_booleans_and_their_strings(served, flag, scored):
    status, reply = post(served, {"queries": ["river"], "topk": 1, "return_scores": flag})
    item = reply["result"][0][0]
    assert status == 200 and ("score" in item) == scored and ("document" in item) == scored


@pytest.mark.parametrize("flag", ["yes", 1, 0, "", [True]])
def test_retrieve_rejects_other_return_scores_values(served, flag):
    status, reply = post(served, {"queries": ["river"], "return_scores": flag})
    assert status == 400 and "'return_scores' must be true or false" in reply["error"]


@pytest.mark.parametrize("body", [b"[1, 2]", b"\xff\xfe{", b'{"queries": 5}',
                                  b"[" * 100_000 + b"]" * 100_000])
def test_retrieve_answers_malformed_bodies_with_400(served, body):
    status, reply = post(served, body)
    assert status == 400 and reply["error"].startswith("bad request")


def test_retrieve_answers_a_query_with_a_lone_surrogate(served):
    body = b'{"queries": ["river \\ud800 town", "\\udfff"], "topk": 2}'
    status, reply = post(served, body)
    assert status == 200 and len(reply["result"]) == 2 and len(reply["result"][0]) == 2


def test_docs_list_every_bad_input_class():
    text = (Path(__file__).resolve().parents[1] / "docs" / "failure_behaviour.md").read_text(
        encoding="utf-8")
    for phrase in ("UTF-16", "nested", "surrogate", "content: null", "duplicate",
                   "control character", "topk", "return_scores", "temporary name"):
        assert phrase in text, phrase


def test_a_page_whose_url_holds_control_characters_is_visited_by_its_shown_url():
    page = Page("https://w/a\x07b", "A", "A is in Lumen.")
    store = CorpusPageStore(Corpus([page, Page("https://w/c", "C", "C.")]))
    toolbox = Toolbox(LocalSearchIndex(store.corpus), store, ExtractiveSummarizer())
    shown = sanitize_observation(toolbox.search(["Lumen"]).text)
    assert "https://w/a\ufffdb" in shown
    outcome = toolbox.visit(["https://w/a\ufffdb"], "where")
    assert outcome.ok and "Lumen" in outcome.text
