"""An evaluation run (trainers.evaluation.evaluate.evaluate with a scripted engine) on the web
backend: recorded against a fake web on 127.0.0.1, then replayed without it, token for
token."""

from __future__ import annotations

import json
import re

from tests.web_fixtures import FakeWeb, country_page
from trainers.engines.scripted import ScriptedEngine
from trainers.evaluation.evaluate import evaluate
from trainers.modeling.models import build_chatml_tokenizer
from trainers.modeling.tokenization import ChatTokenizer
from trainers.rollout import text_token_counter

LINK = re.compile(r"\]\((http[^)\s]+)\)")
CAPITAL = re.compile(r"is (City\d+ville)")


def respond(observations: list[str]) -> str:
    """Search the question, visit the first hit, answer what the page says."""
    def call(name, **arguments):
        return (f"<think>{name}</think>\n<tool_call>"
                f"{json.dumps({'name': name, 'arguments': arguments})}</tool_call>")

    if len(observations) == 1:
        return call("search", query=[observations[0]])
    if len(observations) == 2:
        links = LINK.findall(observations[1])
        return call("visit", url=links[:1] or ["http://none.invalid/"], goal=observations[0])
    found = CAPITAL.search(observations[-1])
    return f"<think>done</think>\n<answer>{found.group(1) if found else 'unknown'}</answer>"


def test_evaluation_records_then_replays_on_the_web_backend(tmp_path):
    web = FakeWeb()
    qa = tmp_path / "qa.jsonl"
    golds = [f"City{i}ville" if i != 2 else "Atlantis" for i in range(4)]
    qa.write_text("".join(json.dumps({"id": f"c{i}", "question": f"What is the capital of "
                                      f"Country {i}?", "answers": [gold]}) + "\n"
                          for i, gold in enumerate(golds)))
    texts = [country_page(i) for i in range(4)] + [web.url, "search visit answer think"]
    chat = ChatTokenizer(build_chatml_tokenizer(texts * 3, vocab_size=500))
    engine = ScriptedEngine(chat.tokenizer, respond, chat.end_of_turn_id)

    def run(mode: str):
        env = {"backend": "web", "search_provider": "searxng",
               "search_url": web.url + "/searxng", "allow_hosts": [f"127.0.0.1:{web.port}"],
               "tool_retries": 0, "world": str(qa), "cache_mode": mode,
               "cache_path": str(tmp_path / "eval.sqlite"), "max_turns": 6,
               "token_counter": text_token_counter(chat), "prompt_style": "compact"}
        return evaluate(engine, chat, env, task_split="all")

    try:
        recorded = run("record")
    finally:
        web.close()
    replayed = run("replay")
    summary = recorded.summary()
    assert summary["tasks"] == 4.0 and summary["accuracy"] == 0.75
    for a, b in zip(recorded.trajectories, replayed.trajectories, strict=True):
        assert a.input_ids == b.input_ids and a.outcome == b.outcome
        assert a.turn_kinds == ["search", "visit", "answer"]
    assert replayed.summary() == summary
