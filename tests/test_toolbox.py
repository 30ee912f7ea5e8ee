"""Toolbox: rendering, dispatch, limits, retries, timeouts and failure handling."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

import venus_gym.tools.toolbox as toolbox_module
from venus_gym.corpus import Corpus, Page
from venus_gym.tools import (
    SEPARATOR,
    VISIT_FAILED_EVIDENCE,
    VISIT_FAILED_SUMMARY,
    CorpusPageStore,
    ExtractiveSummarizer,
    LocalSearchIndex,
    PageSummary,
    SearchHit,
    ToolBackendError,
    Toolbox,
)

PAGES = [
    Page("https://w/alpha", "Alpha Tower", "Alpha Tower is in Lumen. It was built in 1901.",
         snippet="A tower in Lumen."),
    Page("https://w/beta", "Beta Bridge", "Beta Bridge crosses the Vale. It opened in 1950."),
]
CORPUS = Corpus(PAGES)


class FixedSearch:
    """Two hits for any query except 'nothing'; records the queries it got."""

    def __init__(self):
        self.queries: list[str] = []
        self.threads: list[threading.Thread] = []

    def search(self, query: str, k: int) -> list[SearchHit]:
        self.queries.append(query)
        self.threads.append(threading.current_thread())
        if query == "nothing":
            return []
        return [SearchHit("Alpha Tower", "https://w/alpha", "A tower in Lumen.", 2.0),
                SearchHit("Beta Bridge", "https://w/beta", "", 1.0)][:k]


class FlakySearch(FixedSearch):
    def __init__(self, failures: int):
        super().__init__()
        self.failures = failures

    def search(self, query: str, k: int) -> list[SearchHit]:
        if self.failures > 0:
            self.failures -= 1
            self.queries.append(query)
            raise ToolBackendError("HTTP 503 from the search API")
        return super().search(query, k)


class SlowSearch(FixedSearch):
    """Hangs until the test releases it (at most 10 s), then answers."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()
        self.answered = False

    def search(self, query: str, k: int) -> list[SearchHit]:
        self.release.wait(10.0)
        self.answered = True
        return super().search(query, k)


class FixedSummarizer:
    def summarize(self, page: Page, goal: str) -> PageSummary:
        return PageSummary("r", f"evidence of {page.title}", f"summary for {goal}")


class BrokenSummarizer:
    def summarize(self, page: Page, goal: str) -> PageSummary:
        raise ValueError("model returned garbage")


def toolbox(search=None, summarizer=None, **kwargs) -> Toolbox:
    return Toolbox(search or FixedSearch(), CorpusPageStore(CORPUS),
                   summarizer or FixedSummarizer(), **kwargs)


def test_search_rendering_matches_the_dr_venus_format():
    out = toolbox().search(["alpha", "nothing"])
    assert out.ok and out.error is None
    assert out.text == (
        "A search for 'alpha' found 2 results:\n\n"
        "1. [Alpha Tower](https://w/alpha)\nA tower in Lumen.\n\n"
        "2. [Beta Bridge](https://w/beta)"
        + SEPARATOR
        + "No results found for 'nothing'. Try a shorter or different query.")
    assert out.urls == ("https://w/alpha", "https://w/beta")
    assert [h.title for h in out.hits] == ["Alpha Tower", "Beta Bridge"]


def test_top_k_limits_hits_per_query():
    out = toolbox(top_k=1).search(["a", "b"])
    assert out.text.count("found 1 results") == 2 and len(out.hits) == 2


def test_visit_rendering_and_unknown_urls():
    out = toolbox().visit(["https://w/beta", "https://w/missing"], "when it opened")
    assert out.text == (
        "The useful information in https://w/beta for user goal when it opened as follows: \n\n"
        "Evidence in page: \nevidence of Beta Bridge\n\nSummary: \nsummary for when it opened\n"
        + SEPARATOR
        + "The useful information in https://w/missing for user goal when it opened as "
          "follows: \n\nEvidence in page: \n" + VISIT_FAILED_EVIDENCE + "\n\nSummary: \n"
        + VISIT_FAILED_SUMMARY + "\n")
    assert not out.ok and "https://w/missing" in out.error and "no such page" in out.error
    assert out.urls == ("https://w/beta",)


def test_retries_recover_from_transient_failures():
    flaky = FlakySearch(failures=2)
    out = toolbox(flaky, retries=2, backoff_s=0).search(["alpha"])
    assert out.ok and "found 2 results" in out.text
    assert len(flaky.queries) == 3


def test_too_few_retries_yield_an_error_observation():
    flaky = FlakySearch(failures=2)
    out = toolbox(flaky, retries=1, backoff_s=0).search(["alpha", "beta"])
    assert not out.ok
    # First query: two failures exhaust retries=1. The second query then succeeds.
    assert "The search for 'alpha' failed" in out.text
    assert "A search for 'beta' found 2 results" in out.text
    assert "HTTP 503" in out.error and "after 2 attempts" in out.error
    assert "beta" not in out.error


def test_backoff_doubles_and_is_capped(monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr(toolbox_module, "time", SimpleNamespace(sleep=waits.append))
    flaky = FlakySearch(failures=3)
    out = toolbox(flaky, retries=3, backoff_s=0.05, max_backoff_s=0.08).search(["q"])
    assert out.ok and len(flaky.queries) == 4
    assert waits == [0.05, 0.08, 0.08]  # 0.05, then 0.1 and 0.2 capped at 0.08


def test_timeout_turns_a_hung_backend_into_an_error_without_waiting_for_it():
    slow = SlowSearch()
    try:
        out = toolbox(slow, timeout_s=0.2).call("search", {"query": ["alpha"]})
        assert not slow.answered  # the call gave up on the backend, which is still hanging
    finally:
        slow.release.set()
    assert not out.ok and "within 0.2 s" in out.error
    assert "failed" in out.text


def test_backends_run_inline_without_a_timeout_and_in_a_worker_with_one():
    inline, threaded = FixedSearch(), FixedSearch()
    toolbox(inline).search(["a"])
    toolbox(threaded, timeout_s=5).search(["a"])
    assert inline.threads == [threading.main_thread()]
    assert threaded.threads[0] is not threading.main_thread()


def test_summarizer_exception_becomes_the_failure_text():
    out = toolbox(summarizer=BrokenSummarizer(), retries=1, backoff_s=0).visit(
        ["https://w/alpha"], "anything")
    assert not out.ok and out.urls == ()
    assert VISIT_FAILED_EVIDENCE in out.text and VISIT_FAILED_SUMMARY in out.text
    # A ValueError is not transient: reported at once, not retried after a sleep.
    assert out.error.endswith("ValueError: model returned garbage")


def test_wrong_return_types_from_backends_are_failures_not_crashes():
    class Bad:
        def search(self, query, k):
            return ["not a hit"]

        def summarize(self, page, goal):
            return {"evidence": "dict, not PageSummary"}

    box = Toolbox(Bad(), CorpusPageStore(CORPUS), Bad())
    assert not box.search(["x"]).ok
    assert not box.visit(["https://w/alpha"], "g").ok


def test_unknown_tool_and_bad_arguments_are_outcomes():
    box = toolbox()
    unknown = box.call("browse", {"url": ["x"]})
    assert not unknown.ok and "Unknown tool 'browse'" in unknown.text
    assert "search, visit" in unknown.text
    for name, args, fragment in [
        ("search", {}, "missing 'query'"),
        ("search", {"query": []}, "non-empty list of strings"),
        ("search", {"query": ["ok", 3]}, "non-empty list of strings"),
        ("search", ["not", "a", "dict"], "JSON object"),
        ("visit", {"goal": "g"}, "missing 'url'"),
        ("visit", {"url": ["https://w/alpha"]}, "missing 'goal'"),
        ("visit", {"url": ["https://w/alpha"], "goal": 5}, "'goal' must be a string"),
        ("visit", {"url": None, "goal": "g"}, "'url' must be"),
    ]:
        out = box.call(name, args)
        assert not out.ok and fragment in out.text and out.error == out.text, (name, args)


def test_a_bare_string_is_accepted_for_list_arguments():
    box = toolbox()
    assert box.call("search", {"query": "alpha"}).text.startswith("A search for 'alpha'")
    assert box.call("visit", {"url": "https://w/alpha", "goal": "g"}).ok


def test_max_queries_and_max_urls_are_enforced_with_a_note():
    search = FixedSearch()
    box = toolbox(search, max_queries=2, max_urls=1)
    out = box.search(["q1", "q2", "q3", "q4"])
    assert search.queries == ["q1", "q2"]
    assert out.text.count("A search for") == 2
    assert out.text.endswith("Note: only the first 2 of 4 queries were run; a call may carry "
                             "at most 2 queries.")
    visit = box.visit(["https://w/alpha", "https://w/beta"], "g")
    assert visit.urls == ("https://w/alpha",) and "https://w/beta" not in visit.text.split(
        "Note:")[0]
    assert "only the first 1 of 2 urls" in visit.text


def test_constructor_rejects_nonsense_settings():
    for kwargs in ({"top_k": 0}, {"retries": -1}, {"timeout_s": 0}, {"max_urls": 0}):
        with pytest.raises(ValueError):
            toolbox(**kwargs)


def test_end_to_end_with_the_local_backends():
    box = Toolbox(LocalSearchIndex(CORPUS), CorpusPageStore(CORPUS), ExtractiveSummarizer())
    found = box.call("search", {"query": ["Beta Bridge"]})
    assert found.ok and found.urls[0] == "https://w/beta"
    read = box.call("visit", {"url": [found.urls[0]], "goal": "When did Beta Bridge open?"})
    assert read.ok and read.urls == ("https://w/beta",)
    assert "It opened in 1950." in read.text
