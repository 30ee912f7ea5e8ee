"""Correctness filter: metric judges, the BrowseComp LLM grader over a local HTTP server."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.test_data_fixtures import drvenus_record, search
from trainers.data.convert import convert_drvenus_record
from trainers.data.judge import (
    FilterTally,
    JudgeError,
    LLMJudge,
    MetricJudge,
    Verdict,
    filter_stream,
    parse_grader_reply,
)
from venus_gym.protocol import DEFAULT_TOOLS

# The group-1 trap: "yes" appears before the verdict line, which says no.
TRAP_REPLY = ("extracted_final_answer: Lyon\n"
              "reasoning: yes, the response names a French city, but Lyon is not Paris; one "
              "might even write incorrect: yes here.\n"
              "correct: no\n"
              "confidence: 90")
YES_REPLY = ("extracted_final_answer: Paris\nreasoning: Same city.\n"
             "**correct**: yes\nconfidence: 100")


def test_metric_judge_em_and_f1_with_thresholds():
    em = MetricJudge("em")
    assert em.judge("q", "the Paris!", ["paris"]) == Verdict(True, 1.0, "em=1.000")
    assert not em.judge("q", "Paris France", ["Paris"]).correct
    # "the cat sat" vs "cat sat on mat": P = 1, R = 1/2, F1 = 2/3.
    assert MetricJudge("f1", 0.6).judge("q", "the cat sat", ["cat sat on mat"]).correct
    assert not MetricJudge("f1", 0.7).judge("q", "the cat sat", ["cat sat on mat"]).correct
    with pytest.raises(ValueError, match="unknown metric"):
        MetricJudge("bleu")


def test_grader_reply_uses_group_one_of_the_verdict_line():
    assert parse_grader_reply(TRAP_REPLY) == (False, "Lyon", 90.0)
    # The known bug: reading group 0 (the whole match) and testing for "yes" anywhere in
    # the reply would call the trap correct; both naive readings must disagree with ours.
    assert "yes" in TRAP_REPLY.lower()
    assert re.search(r"correct\s*:\s*(yes|no)", TRAP_REPLY).group(0) == "correct: yes"
    assert parse_grader_reply(YES_REPLY) == (True, "Paris", 100.0)
    assert parse_grader_reply("<think>correct: yes?</think>\ncorrect: no")[0] is False
    with pytest.raises(JudgeError, match="no 'correct: yes\\|no' line"):
        parse_grader_reply("I think it is right.")


class _Grader(BaseHTTPRequestHandler):
    """A fake OpenAI-compatible endpoint: says yes when the response is "Paris"."""

    requests: list[dict] = []
    fail_with: int | None = None

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "body": body,
                                    "auth": self.headers.get("Authorization")})
        if self.fail_with is not None:
            self.send_response(self.fail_with)
            self.end_headers()
            return
        prompt = body["messages"][0]["content"]
        reply = YES_REPLY if "[response]: Paris\n" in prompt else TRAP_REPLY
        payload = json.dumps({"choices": [{"message": {"role": "assistant",
                                                       "content": reply}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def grader() -> Iterator[str]:
    _Grader.requests = []
    _Grader.fail_with = None
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Grader)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_llm_judge_sends_the_browsecomp_prompt_and_parses_verdicts(grader, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY_FOR_TEST", "secret")
    judge = LLMJudge(grader, "grader-model", api_key_env="JUDGE_KEY_FOR_TEST")
    assert judge.judge("Capital of France?", "Paris", ["Paris", "Paris, France"]).correct
    verdict = judge.judge("Capital of France?", "Lyon", ["Paris"])
    assert verdict == Verdict(False, 0.0, "extracted='Lyon' confidence=90.0")
    first = _Grader.requests[0]
    assert first["path"] == "/v1/chat/completions"
    assert first["auth"] == "Bearer secret"
    assert first["body"]["model"] == "grader-model"
    prompt = first["body"]["messages"][0]["content"]
    assert "[question]: Capital of France?" in prompt
    assert "[correct_answer]: Paris; or equivalently: Paris, France" in prompt
    assert "correct: Answer 'yes' if extracted_final_answer matches" in prompt


def test_llm_judge_failures_are_loud(grader):
    _Grader.fail_with = 500
    judge = LLMJudge(grader, "m", retries=1, backoff_s=0.0)
    with pytest.raises(JudgeError, match=r"HTTP 500.*\(after 2 attempts\)"):
        judge.judge("q", "Paris", ["Paris"])
    assert len(_Grader.requests) == 2
    with pytest.raises(JudgeError, match="unreachable"):
        LLMJudge("http://127.0.0.1:9/v1", "m", retries=0, timeout_s=2).judge("q", "a", ["a"])


def trajectories():
    def make(record_id, answer, gold="Paris"):
        return convert_drvenus_record(drvenus_record(record_id, [search("q")], answer, gold),
                                      "f", DEFAULT_TOOLS)
    return [make("right", "Paris"), make("wrong", "Lyon"), make("silent", None),
            make("nogold", "Paris", gold=None), make("right2", "paris")]


def test_filter_keeps_correct_and_counts_every_drop_reason():
    tally = FilterTally()
    kept = list(filter_stream(trajectories(), MetricJudge("em"), tally))
    assert [t.id for t in kept] == ["right", "right2"]
    assert tally.kept == 2
    assert tally.dropped == {"judged incorrect": 1, "no final answer": 1, "no gold answer": 1}
    assert kept[0].metadata["judge"] == {"judge": "em>=0.5", "correct": True, "score": 1.0,
                                         "detail": "em=1.000"}


def test_filter_with_llm_judge_concurrently_keeps_input_order(grader):
    tally = FilterTally()
    kept = list(filter_stream(trajectories(), LLMJudge(grader, "m"), tally, workers=3, chunk=2))
    assert [t.id for t in kept] == ["right"]  # the fake grader only accepts "Paris" exactly
    assert tally.dropped["judged incorrect"] == 2


def test_judge_errors_fail_or_are_kept_and_reported(grader):
    _Grader.fail_with = 503
    judge = LLMJudge(grader, "m", retries=0)
    with pytest.raises(JudgeError, match=r"trajectory 'right': .*HTTP 503"):
        list(filter_stream(trajectories(), judge, FilterTally()))
    tally = FilterTally()
    kept = list(filter_stream(trajectories(), judge, tally, on_error="keep"))
    assert [t.id for t in kept] == ["right", "wrong", "right2"]
    assert len(tally.kept_on_error) == 3 and tally.kept_on_error[0].startswith("right: ")
    assert kept[0].metadata["judge"]["correct"] is None
    assert "HTTP 503" in kept[0].metadata["judge"]["error"]
