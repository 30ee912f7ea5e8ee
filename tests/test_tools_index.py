"""LocalSearchIndex (tantivy BM25) and the Search-R1 retrieval-server client/server."""

from __future__ import annotations

import json
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from venus_gym.corpus import Corpus, Page
from venus_gym.tools import (
    LocalSearchIndex,
    RetrievalServerBackend,
    SearchHit,
    ToolBackendError,
    serve_index,
)

REPO = Path(__file__).resolve().parents[1]
HOTPOT_FILES = (REPO / "venus_gym" / "data" / "hotpotqa_dev_distractor_500.jsonl",)

_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
_FILLER = ("river city market harbour valley school temple castle bridge museum library "
           "station garden forest mountain island village tower").split()


def _name(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


def make_pages(n: int, seed: int = 0) -> list[Page]:
    """Pages with unique two-word titles and filler text mentioning other entities."""
    rng = random.Random(seed)
    titles: list[str] = []
    seen = set()
    while len(titles) < n:
        title = f"{_name(rng)} {_name(rng)}"
        if title not in seen:
            seen.add(title)
            titles.append(title)
    pages = []
    for i, title in enumerate(titles):
        other = titles[rng.randrange(n)]
        text = (f"{title} is a {rng.choice(_FILLER)} near the {rng.choice(_FILLER)}. "
                f"It was founded in {1800 + i % 200} by {other}. "
                f"Visitors describe the {rng.choice(_FILLER)} and the {rng.choice(_FILLER)}.")
        pages.append(Page(url=f"https://test.local/{i}", title=title, text=text))
    return pages


@pytest.fixture(scope="module")
def pages() -> list[Page]:
    return make_pages(300)


@pytest.fixture(scope="module")
def index(pages: list[Page]) -> LocalSearchIndex:
    return LocalSearchIndex(Corpus(pages))


def test_title_query_ranks_its_page_first(pages, index):
    for page in pages:
        hits = index.search(page.title, 5)
        assert hits[0].url == page.url, (page.title, [h.title for h in hits])


def test_hits_are_ranked_search_hits_and_k_is_respected(index):
    hits = index.search("river market founded", 7)
    assert 0 < len(hits) <= 7
    assert all(isinstance(h, SearchHit) for h in hits)
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True) and scores[-1] > 0
    assert index.search("river", 0) == []


def test_snippet_is_the_page_snippet_else_the_start_of_its_text():
    long_text = "Alpha word " + " ".join(f"filler{i}" for i in range(100))
    idx = LocalSearchIndex([
        Page("u:a", "Alpha One", long_text),
        Page("u:b", "Alpha Two", "Alpha is short here.", snippet="A curated snippet."),
    ])
    by_url = {h.url: h for h in idx.search("alpha", 5)}
    assert by_url["u:b"].snippet == "A curated snippet."
    fallback = by_url["u:a"].snippet
    assert fallback.endswith(" ...") and len(fallback) <= 204
    assert long_text.startswith(fallback[:-4])
    assert fallback[:-4].split()[-1] in long_text.split()  # cut at a word boundary


@pytest.mark.parametrize("query", [
    "", "   ", "\n\t", "!!!", "the", "()", '"', "title:", "*", "?"])
def test_queries_without_searchable_words_return_nothing(index, query):
    assert index.search(query, 10) == []


@pytest.mark.parametrize("query", [
    'title:"unclosed', "a AND (b OR", "NOT river", "river^3 -market +city", "river~2",
    "field:[1 TO 5]", "{}[]<>=!\\/", "ünïcödé café 中文 ☃ 🚀", "\x00river\x00",
    "r" * 500, " ".join(["river"] * 5000), "' OR 1=1 --", "/regex.*/"])
def test_llm_style_queries_never_raise(index, query):
    hits = index.search(query, 10)
    assert len(hits) <= 10


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300))
def test_any_string_is_a_valid_query(index, query):
    hits = index.search(query, 5)
    assert len(hits) <= 5
    assert all(h.score > 0 for h in hits)


def test_query_operators_are_plain_words(pages, index):
    target = pages[17]
    first, second = target.title.split()
    # Were NOT an operator, the target page would be excluded.
    assert index.search(f"NOT {first} {second}", 3)[0].url == target.url
    assert index.search(f'title:"{first}" AND ({second})', 3)[0].url == target.url


def test_stemming_matches_inflected_forms():
    idx = LocalSearchIndex([Page("u:1", "Zorblat", "Zorblat directed three films."),
                            Page("u:2", "Quenzo", "Quenzo sings.")])
    assert [h.url for h in idx.search("film", 5)] == ["u:1"]
    assert [h.url for h in idx.search("FILMS directing", 5)] == ["u:1"]


def test_exact_title_beats_longer_titles_and_stopword_titles_are_found():
    idx = LocalSearchIndex([
        Page("u:film", "Ed Wood (film)", "Ed Wood is a film about Ed Wood, by Ed Wood fans."),
        Page("u:ed", "Ed Wood", "Ed Wood was a director."),
        Page("u:it", "It", "A novel."),
    ])
    assert idx.search("ed wood", 2)[0].url == "u:ed"
    assert idx.search("  ED   WOOD ", 2)[0].url == "u:ed"
    assert [h.url for h in idx.search("It", 3)] == ["u:it"]  # "it" is a stopword


def test_ties_are_broken_by_corpus_order():
    clones = [Page(f"u:{c}", "Same Title", "identical text about zebras") for c in "qwertyuiop"]
    idx = LocalSearchIndex(clones + make_pages(20))
    assert [h.url for h in idx.search("zebras", 4)] == ["u:q", "u:w", "u:e", "u:r"]
    reversed_idx = LocalSearchIndex(list(reversed(clones)))
    assert [h.url for h in reversed_idx.search("zebras", 3)] == ["u:p", "u:o", "u:i"]


def _tantivy_order(index: LocalSearchIndex, query: str, k: int) -> list[int]:
    """Page positions in the order tantivy alone returns them (ties by segment order)."""
    hits = index._searcher.search(index._query(query), k, count=False).hits
    return index._searcher.fast_field_values("pid", [addr for _, addr in hits])


def test_multi_segment_index_ranks_exactly_like_a_single_segment():
    # The smallest writer heap (15 MB) splits 4,500 pages of 150 random words into three
    # segments, whose order tantivy does not keep; identical clones in every segment create
    # ties that tantivy alone would cut in segment order.
    rng = random.Random(3)
    vocab = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4)))
             for _ in range(5000)]
    base = [Page(f"u:{i}", f"{_name(rng)} {_name(rng)}", " ".join(rng.choices(vocab, k=150)))
            for i in range(4500)]
    clones = [Page(f"u:clone{i}", "Twin Page", "twin zebra text") for i in range(40)]
    pages = base[:1000] + clones[:15] + base[1000:3000] + clones[15:30] + base[3000:] \
        + clones[30:]
    first_clones = [pages.index(c) for c in clones[:20]]
    # Segment order is random per build: retry until it differs from corpus order, so the
    # tie handling is really exercised (each build fails to do so with chance <= 1/2).
    for _ in range(10):
        small_heap = LocalSearchIndex(pages, heap_bytes=15_000_000)
        assert small_heap.num_segments > 1
        if _tantivy_order(small_heap, "zebra", 20) != first_clones:
            break
    else:
        pytest.fail("segment order matched corpus order in 10 builds")
    single = LocalSearchIndex(pages)
    assert single.num_segments == 1
    assert [h.url for h in small_heap.search("zebra", 20)] == [c.url for c in clones[:20]]
    queries = ["zebra", "twin", "Twin Page", " ".join(vocab[:3]), vocab[7]]
    queries += [rng.choice(pages).title for _ in range(20)]
    for q in queries:
        for k in (1, 10, 25):
            assert small_heap.search(q, k) == single.search(q, k), (q, k)


def test_common_words_are_pruned_only_when_a_distinctive_word_exists():
    # 1,500 page texts say "river"; pruning matches "river" against titles only in
    # "Quexotl river" (it is in more than max(5% of pages, 1000) texts).
    pages = [Page(f"u:{i}", f"Place {i}", f"A river town number {i}.") for i in range(1500)]
    pages += [Page("u:q", "Quexotl", "Quexotl lies on no river at all."),
              Page("u:zu", "Zorvex University", "Zorvex University is by a river."),
              Page("u:zr", "Zorvex River", "Zorvex River is a river.")]
    idx = LocalSearchIndex(pages)
    # Not the 1,500 "river" texts: only the distinctive page and a "river" title.
    assert [h.url for h in idx.search("Quexotl river", 10)] == ["u:q", "u:zr"]
    # The common word still separates pages that share the distinctive one, via titles.
    assert [h.url for h in idx.search("river Zorvex", 10)] == ["u:zr", "u:zu"]
    # Typo: no distinctive word occurs, so the common word is searched in texts after all.
    assert len(idx.search("Quexotlll river", 10)) == 10
    assert len(idx.search("river town", 10)) == 10
    idx.common_term_ratio = None  # plain BM25 over every word
    assert len(idx.search("Quexotl river", 10)) == 10
    assert idx.search("Quexotl river", 10)[0].url == "u:q"


def test_on_disk_index_is_reused_rebuilt_or_refused(tmp_path, pages):
    where = tmp_path / "idx"
    first = LocalSearchIndex(pages, path=where)
    assert not first.reopened and (where / "venus_index.json").is_file()
    again = LocalSearchIndex(pages, path=where)
    assert again.reopened
    assert again.search(pages[3].title, 5) == first.search(pages[3].title, 5)
    del first, again

    changed = pages[:-1] + [Page("u:new", "Brandnew Entry", "a brandnew page")]
    rebuilt = LocalSearchIndex(changed, path=where)
    assert not rebuilt.reopened
    assert rebuilt.search("brandnew", 5)[0].url == "u:new"

    foreign = tmp_path / "not_an_index"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        LocalSearchIndex(pages, path=foreign)
    assert (foreign / "notes.txt").read_text() == "mine"


def _hotpot_file() -> Path | None:
    return next((p for p in HOTPOT_FILES if p.is_file()), None)


@pytest.mark.skipif(_hotpot_file() is None,
                    reason="HotpotQA dev subset not found in venus_gym/data")
def test_hotpotqa_supporting_titles_are_found():
    by_key: dict[tuple[str, str], Page] = {}
    supporting: list[Page] = []
    with _hotpot_file().open(encoding="utf-8") as f:
        for line in f:
            for para in json.loads(line)["paragraphs"]:
                key = (para["title"], para["text"])
                page = by_key.setdefault(key, Page(f"hp:{len(by_key)}", *key))
                if para["is_supporting"]:
                    supporting.append(page)
    idx = LocalSearchIndex(by_key.values())
    top5 = sum(p.url in [h.url for h in idx.search(p.title, 5)] for p in supporting)
    top1 = sum(idx.search(p.title, 1)[0].url == p.url for p in supporting)
    assert len(supporting) == 1000
    assert top5 / len(supporting) >= 0.95
    assert top1 / len(supporting) >= 0.95


# --- retrieval server protocol ----------------------------------------------------------------

@pytest.fixture
def served(index):
    server, thread, url = serve_index(index)
    yield url
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_client_against_served_index_returns_the_index_hits(served, index, pages):
    client = RetrievalServerBackend(served, timeout_s=5)
    for q in (pages[5].title, "river market", "founded 1850"):
        remote, local = client.search(q, 6), index.search(q, 6)
        assert [(h.title, h.url, h.snippet) for h in remote] == \
            [(h.title, h.url, h.snippet) for h in local]
        assert [h.score for h in remote] == pytest.approx([h.score for h in local], rel=1e-6)
    assert client.search("", 5) == []
    # Documents it returned can be visited through the same object.
    page = client.fetch(pages[5].url)
    assert page is not None and page.text == pages[5].text and page.title == pages[5].title
    assert client.fetch("https://never.returned/") is None


def test_served_index_speaks_search_r1_batches(served, pages):
    import urllib.request
    body = json.dumps({"queries": [pages[1].title + " river", "market"], "topk": 2}).encode()
    request = urllib.request.Request(served + "/retrieve", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        result = json.loads(response.read())["result"]
    assert len(result) == 2 and all(len(r) == 2 for r in result)
    doc = result[0][0]  # return_scores defaults to false: bare documents
    assert doc["contents"] == f'"{pages[1].title}"\n{pages[1].text}'


def test_client_reports_server_errors_as_tool_backend_errors(served):
    with pytest.raises(ToolBackendError, match="HTTP 404"):
        RetrievalServerBackend(served + "/elsewhere/").search("x", 3)
    # Nothing listens on port 9 (discard) of localhost in a test sandbox.
    with pytest.raises(ToolBackendError, match="unreachable"):
        RetrievalServerBackend("http://127.0.0.1:9", timeout_s=2).search("x", 3)


class _FakeRetriever(BaseHTTPRequestHandler):
    """A Search-R1-style server: documents are {"id", "contents"}, no url or snippet."""

    reply: object = None

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps(self.reply).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def fake_retriever():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeRetriever)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_client_parses_search_r1_documents_defensively(fake_retriever):
    url = f"http://127.0.0.1:{fake_retriever.server_address[1]}"
    _FakeRetriever.reply = {"result": [[
        {"document": {"id": "42", "contents": '"Paris"\nParis is the capital of France.'},
         "score": 3.5},
        {"document": {"contents": "no title line here"}, "score": "n/a"},
        "\"Plain\"\nA bare string document.",
    ]]}
    hits = RetrievalServerBackend(url, timeout_s=5).search("capital", 5)
    assert [h.title for h in hits][0] == "Paris" and hits[0].url == "retrieval://doc/42"
    assert hits[0].snippet == "Paris is the capital of France." and hits[0].score == 3.5
    assert hits[1].snippet == "no title line here" and hits[1].score == 0.0
    assert hits[1].url.startswith("retrieval://doc/") and hits[1].title == hits[1].url
    assert hits[2].title == "Plain"

    _FakeRetriever.reply = {"result": [{"contents": '"Flat"\nsingle-query variant'}]}
    assert RetrievalServerBackend(url).search("q", 3)[0].title == "Flat"

    _FakeRetriever.reply = {"unexpected": True}
    with pytest.raises(ToolBackendError, match="no 'result' list"):
        RetrievalServerBackend(url).search("q", 3)
