"""Visit summarizers: the extractive default and the OpenAI-compatible LLM client."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from venus_gym.corpus import Page
from venus_gym.tools import (
    ExtractiveSummarizer,
    OpenAISummarizer,
    PageSummary,
    ToolBackendError,
    parse_summary_reply,
    split_sentences,
)

PAGE = Page(
    url="https://venus.world/wiki/Jekdei_Saikvror",
    title="Jekdei Saikvror",
    text=("This article is a biography of Jekdei Saikvror. Jekdei Saikvror plays the harp. "
          "Jekdei Saikvror studied at Leisto College. Jekdei Saikvror was born in 1892.\n\n"
          "Jekdei Saikvror works for Roujaes Ventures. Readers often mix it up with Nalne "
          "Penuth, who was born in 1926. Jekdei Saikvror directed the film Red Harbour. "
          "Jekdei Saikvror is 197 cm tall."),
)


def test_split_sentences_respects_abbreviations_initials_and_lines():
    text = ("Dr. Smith went to Washington. He was born in the U.S. in 1950. "
            "J. R. R. Tolkien wrote books, e.g. The Hobbit. Is it? Yes!\n"
            "A new line (no period)\nMt. Everest is high.")
    assert split_sentences(text) == [
        "Dr. Smith went to Washington.", "He was born in the U.S. in 1950.",
        "J. R. R. Tolkien wrote books, e.g. The Hobbit.", "Is it?", "Yes!",
        "A new line (no period)", "Mt. Everest is high."]
    long = "word " * 500
    pieces = split_sentences(long, max_chars=300)
    assert len(pieces) > 1 and all(len(p) <= 300 for p in pieces)
    assert split_sentences("") == [] and split_sentences(" \n \n") == []


def test_evidence_is_the_goal_relevant_sentences_in_page_order():
    s = ExtractiveSummarizer(max_evidence_sentences=2).summarize(
        PAGE, "Find the year Jekdei Saikvror was born")
    # "born" is rare on the page, the name is everywhere: both born-sentences win, in page
    # order, and the one naming the subject outranks the distractor's for the summary.
    assert s.evidence.split("\n") == [
        "Jekdei Saikvror was born in 1892.",
        "Readers often mix it up with Nalne Penuth, who was born in 1926."]
    assert s.summary == "Jekdei Saikvror was born in 1892."
    assert "born" in s.rational and "jekdei" in s.rational


def test_light_stemming_joins_word_forms():
    s = ExtractiveSummarizer(max_evidence_sentences=1).summarize(
        PAGE, "Which films did the director Jekdei Saikvror make?")
    assert s.evidence == "Jekdei Saikvror directed the film Red Harbour."


def test_no_match_gives_opening_sentences_and_says_so():
    s = ExtractiveSummarizer(max_evidence_sentences=2).summarize(PAGE, "population of Mars")
    assert s.evidence.split("\n") == split_sentences(PAGE.text)[:2]
    assert s.summary.startswith("No information specific to the goal")
    assert "population" in s.rational and "mars" in s.rational
    empty_goal = ExtractiveSummarizer().summarize(PAGE, "the of and ???")
    assert "no content words" in empty_goal.rational
    assert empty_goal.evidence.split("\n") == split_sentences(PAGE.text)[:3]


def test_empty_page():
    s = ExtractiveSummarizer().summarize(Page("u", "Blank", ""), "anything")
    assert s.evidence == "" and "empty" in s.summary


def test_extractive_is_deterministic_and_ties_prefer_earlier_sentences():
    page = Page("u", "T", "Alpha one. Beta two. Alpha three. Alpha four.")
    summarizer = ExtractiveSummarizer(max_evidence_sentences=2)
    first = summarizer.summarize(page, "alpha")
    assert first == summarizer.summarize(page, "alpha")
    assert first.evidence == "Alpha one.\nAlpha three."
    assert first.summary == "Alpha one."


@pytest.mark.parametrize("reply, evidence", [
    ('{"rational": "r", "evidence": "e", "summary": "s"}', "e"),
    ('Sure! ```json\n{"rational": "r", "evidence": "e", "summary": "s"}\n``` Hope it helps.',
     "e"),
    ('<think>{"evidence": "not this"}</think>\n{"evidence": ["a", "b"], "summary": "s"}',
     "a\nb"),
    ('thinking without an opening tag</think>{"summary": "s", "evidence": "e2"}', "e2"),
    ('Here: {"note": 1} and then {"rational": "r", "evidence": "x {y}", "summary": "s"} ok',
     "x {y}"),
])
def test_parse_summary_reply_tolerates_wrapping(reply, evidence):
    parsed = parse_summary_reply(reply)
    assert parsed is not None and parsed.evidence == evidence and parsed.summary == "s"


@pytest.mark.parametrize("reply", ["", "no json here", '{"other": 1}', '{"evidence": '])
def test_parse_summary_reply_rejects_replies_without_the_object(reply):
    assert parse_summary_reply(reply) is None


# --- OpenAI-compatible endpoint, against a real HTTP server on 127.0.0.1 -----------------------

class _LLM(BaseHTTPRequestHandler):
    mode = "ok"
    requests: list[tuple[str, dict, dict]] = []
    release = threading.Event()  # a "slow" request waits for it (at most 10 s)
    answered_slow = False

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _LLM.requests.append((self.path, dict(self.headers), body))
        if _LLM.mode == "slow":
            _LLM.release.wait(10.0)
            _LLM.answered_slow = True
        if _LLM.mode == "error":
            payload, status = b'{"error": "model overloaded"}', 500
        else:
            content = ("<think>reading</think>```json\n" + json.dumps(
                {"rational": "found it", "evidence": "born in 1892", "summary": "1892"})
                + "\n```") if _LLM.mode in ("ok", "slow") else "I cannot help with that."
            payload = json.dumps({"choices": [{"message": {"role": "assistant",
                                                           "content": content}}]}).encode()
            status = 200
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        try:
            self.wfile.write(payload)
        except OSError:  # the client gave up (timeout test)
            pass


@pytest.fixture
def llm():
    _LLM.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _LLM)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_openai_summarizer_success(llm):
    _LLM.mode = "ok"
    summarizer = OpenAISummarizer(llm + "/", "qwen3-30b", api_key="k-123", max_page_chars=60,
                                  extra_body={"temperature": 0.0})
    summary = summarizer.summarize(PAGE, "Find the birth year")
    assert summary == PageSummary("found it", "born in 1892", "1892")
    path, headers, body = _LLM.requests[-1]
    assert path == "/v1/chat/completions"
    assert headers["Authorization"] == "Bearer k-123"
    assert body["model"] == "qwen3-30b" and body["temperature"] == 0.0
    prompt = body["messages"][0]["content"]
    assert "Find the birth year" in prompt and PAGE.url in prompt
    assert PAGE.text[:60] in prompt and PAGE.text[:61] not in prompt  # truncated
    assert "[... page truncated ...]" in prompt


def test_openai_summarizer_malformed_reply(llm):
    _LLM.mode = "malformed"
    with pytest.raises(ToolBackendError, match="no JSON object"):
        OpenAISummarizer(llm, "m").summarize(PAGE, "goal")


def test_openai_summarizer_http_error(llm):
    _LLM.mode = "error"
    with pytest.raises(ToolBackendError, match="HTTP 500.*overloaded"):
        OpenAISummarizer(llm, "m").summarize(PAGE, "goal")


def test_openai_summarizer_timeout(llm):
    _LLM.mode, _LLM.answered_slow = "slow", False
    _LLM.release.clear()
    try:
        with pytest.raises(ToolBackendError, match="did not answer within 0.3 s"):
            OpenAISummarizer(llm, "m", timeout_s=0.3).summarize(PAGE, "goal")
        assert not _LLM.answered_slow  # the client gave up before the server answered
    finally:
        _LLM.release.set()


def test_openai_summarizer_unreachable():
    with pytest.raises(ToolBackendError, match="unreachable"):
        OpenAISummarizer("http://127.0.0.1:9/v1", "m", timeout_s=2).summarize(PAGE, "goal")
