"""`venus-gym serve-retrieval` and the /retrieve server: every dialect the peers' clients
send (Search-R1 lists, SkyRL's single query, GEM's msgpack), keep-alive, and a reply to
every hostile request. SkyRL-gym's and GEM's own search clients run against it unmodified
when those packages are installed."""

from __future__ import annotations

import http.client
import importlib
import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from venus_gym.corpus import Corpus, Page
from venus_gym.tools import LocalSearchIndex, serve_index
from venus_gym.worlds import load_world

REPO = Path(__file__).resolve().parents[1]
PAGES = [Page(f"https://w/{i}", f"River town {i}", f"River town {i} has a market {i}.")
         for i in range(12)] + [Page("https://w/lumen", "Lumen Bridge",
                                     "The Lumen Bridge was built by Ada Varga in 1871.")]


@pytest.fixture(scope="module")
def server():
    srv, thread, url = serve_index(LocalSearchIndex(Corpus(PAGES)), max_topk=5,
                                   max_body_bytes=1 << 20)
    yield srv.server_address[1], url
    srv.shutdown()
    srv.server_close()
    thread.join(5)


def request(conn: http.client.HTTPConnection, body: bytes, content_type: str | None =
            "application/json", path: str = "/retrieve", method: str = "POST",
            headers: dict | None = None) -> tuple[int, dict, bytes]:
    all_headers = dict(headers or {})
    if content_type is not None:
        all_headers["Content-Type"] = content_type
    conn.request(method, path, body=body, headers=all_headers)
    response = conn.getresponse()
    return response.status, dict(response.getheaders()), response.read()


HOSTILE = [  # (name, body, content type, expected status)
    ("lone surrogate", b'{"queries": ["river \\ud800 town"]}', "application/json", 200),
    ("control characters", json.dumps({"query": "river\x00\x1b[2J\x7f\x85"}).encode(),
     "application/json", 200),
    ("1 MB query", json.dumps({"query": "a" * 1_000_000}).encode(), "application/json", 400),
    ("over max_body_bytes", json.dumps({"query": "a" * 1_100_000}).encode(),
     "application/json", 413),
    ("query a number", b'{"query": 5}', "application/json", 400),
    ("queries a dict", b'{"queries": {"a": 1}}', "application/json", 400),
    ("list with a null", b'{"queries": ["a", null]}', "application/json", 400),
    ("both forms", b'{"queries": ["a"], "query": "b"}', "application/json", 400),
    ("no query", b'{"topk": 3}', "application/json", 400),
    ("malformed JSON", b'{"queries": ["a"', "application/json", 400),
    ("invalid UTF-8", b'{"query": "\xff\xfe"}', "application/json", 400),
    ("empty body", b"", "application/json", 400),
    ("wrong content type", b'{"query": "river"}', "text/html", 415),
    ("multipart", b"--x\r\n", "multipart/form-data; boundary=x", 415),
    ("msgpack garbage", b"\xc1\xc1\xc1", "application/msgpack", 400),
    ("msgpack not a map", b"\x93\x01\x02\x03", None, 400),
    ("deep nesting", b'{"query": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
     "application/json", 400),
    ("topk negative", b'{"query": "river", "topk": -3}', "application/json", 400),
    ("topk a list", b'{"query": "river", "topk": [3]}', "application/json", 400),
]


@pytest.mark.parametrize("name,body,content_type,status", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_every_hostile_request_gets_an_http_reply_with_a_reason(server, name, body,
                                                                content_type, status):
    port, _ = server
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    got, headers, raw = request(conn, body, content_type)
    assert got == status, raw[:300]
    assert int(headers["Content-Length"]) == len(raw)
    if headers["Content-Type"] == "application/msgpack":  # replies speak the request's encoding
        reply = pytest.importorskip("msgpack").unpackb(raw)
    else:
        reply = json.loads(raw)
    if status >= 400:
        assert reply["error"]
    else:
        assert isinstance(reply["result"], list)
    # The connection still serves a good request after the bad one.
    got, _, raw = request(conn, json.dumps({"query": "Lumen Bridge"}).encode())
    assert got == 200 and json.loads(raw)["result"][0][0]["url"] == "https://w/lumen"
    conn.close()


def test_other_paths_methods_and_headers_are_answered(server):
    port, _ = server
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    assert request(conn, b'{"query": "x"}', path="/search")[0] == 404
    assert request(conn, b"", method="GET")[0] == 405
    status, headers, raw = request(conn, b"", headers={"Content-Length": "abc"})
    assert status == 400 and "Content-Length" in json.loads(raw)["error"]
    conn.close()


def test_keep_alive_two_requests_on_one_connection(server):
    port, _ = server
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    first = request(conn, json.dumps({"queries": ["Lumen Bridge"], "topk": 1}).encode())
    sock = conn.sock
    second = request(conn, json.dumps({"queries": ["River town 3"], "topk": 1}).encode())
    assert conn.sock is sock and sock is not None  # not reopened
    assert first[0] == second[0] == 200
    assert json.loads(first[2])["result"][0][0]["url"] == "https://w/lumen"
    assert json.loads(second[2])["result"][0][0]["url"] == "https://w/3"
    conn.close()


def test_several_queries_in_one_request_and_the_single_query_form(server):
    port, _ = server
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    _, _, raw = request(conn, json.dumps({"queries": ["Lumen Bridge", "River town 7", "zzzq"],
                                          "topk": 2, "return_scores": True}).encode())
    result = json.loads(raw)["result"]
    assert [r[0]["document"]["url"] for r in result[:2]] == ["https://w/lumen", "https://w/7"]
    assert result[2] == [] and all("score" in item for item in result[0])
    _, _, raw = request(conn, json.dumps({"query": "Lumen Bridge", "topk": 1}).encode())
    assert json.loads(raw)["result"] == [[json.loads(raw)["result"][0][0]]]  # still nested
    conn.close()


def test_topk_over_the_servers_maximum_is_cut_and_the_reply_says_so(server):
    port, _ = server
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    _, _, raw = request(conn, json.dumps({"query": "river town", "topk": 50}).encode())
    reply = json.loads(raw)
    assert len(reply["result"][0]) == 5 and reply["topk"] == 5 and "max_topk" in reply["warning"]
    conn.close()


def test_gem_msgpack_dialect_gets_a_flat_msgpack_list(server):
    msgpack = pytest.importorskip("msgpack")
    port, _ = server
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    body = msgpack.packb({"query": "Lumen Bridge", "topk": 2, "return_scores": True})
    status, headers, raw = request(conn, body, content_type=None)  # as requests(data=bytes)
    reply = msgpack.unpackb(raw)
    assert status == 200 and headers["Content-Type"] == "application/msgpack"
    assert reply["result"][0]["document"]["contents"].startswith('"Lumen Bridge"\n')
    body = msgpack.packb({"queries": ["Lumen Bridge", "River town 2"], "topk": 1})
    reply = msgpack.unpackb(request(conn, body, "application/msgpack")[2])
    assert [r[0]["url"] for r in reply["result"]] == ["https://w/lumen", "https://w/2"]
    conn.close()


def test_skyrl_gym_search_client_unmodified(server):
    pytest.importorskip("skyrl_gym")
    from skyrl_gym.tools.search import SearchToolGroup

    _, url = server
    tool = SearchToolGroup(search_url=url + "/retrieve", topk=2, log_requests=False)
    text = json.loads(tool.search("Lumen Bridge"))["result"]
    assert "Ada Varga in 1871" in text and "error" not in text.lower()


@pytest.fixture
def gem_search_tool(monkeypatch):
    """GEM's SearchTool class, loaded from the installed package without running
    `gem/__init__`, which imports all of GEM's environments (reasoning-gym, nltk, ...)."""
    spec = importlib.util.find_spec("gem")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("gem-llm is not installed")
    pytest.importorskip("msgspec")
    root = list(spec.submodule_search_locations)[0]
    for name, path in (("gem", root), ("gem.tools", f"{root}/tools")):
        package = types.ModuleType(name)
        package.__path__ = [path]
        monkeypatch.setitem(sys.modules, name, package)
    for name in ("gem.tools.base_tool", "gem.tools.search_tool"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    module = importlib.import_module("gem.tools.search_tool")
    yield module.SearchTool
    for name in ("gem.tools.base_tool", "gem.tools.search_tool"):
        sys.modules.pop(name, None)


def test_gem_search_client_unmodified(server, gem_search_tool):
    _, url = server
    tool = gem_search_tool(search_url=url + "/retrieve", topk=2)
    valid, has_error, observation, _ = tool.execute_action(
        "<think>find it</think><search>Lumen Bridge</search>")
    assert valid and not has_error, observation
    assert 'Doc 1(Title: "Lumen Bridge")' in observation and "Ada Varga" in observation


def test_serve_retrieval_command_serves_a_world(tmp_path):
    command = [sys.executable, "-m", "trainers.cli", "serve-retrieval", "--world", "synthetic",
               "--world-size", "100", "--port", "0"]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True,
                               env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    try:
        first = process.stdout.readline().split()
        assert first[0] == "serving" and first[1].endswith("/retrieve"), first
        host_port = first[1].split("//")[1].split("/")[0]
        host, port = host_port.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=20)
        page = list(load_world("synthetic", n_pages=100, seed=0).corpus)[7]
        status, _, raw = request(conn, json.dumps({"queries": [page.title], "topk": 2}).encode())
        assert status == 200 and json.loads(raw)["result"][0][0]["url"] == page.url
        conn.close()
    finally:
        process.terminate()
        process.wait(10)


def test_a_search_call_with_several_queries_is_one_request_with_the_same_observation(server):
    from venus_gym.corpus import Corpus as _Corpus
    from venus_gym.tools import (
        CorpusPageStore,
        ExtractiveSummarizer,
        RetrievalServerBackend,
        Toolbox,
    )

    _, url = server
    posts = []

    class Counting(RetrievalServerBackend):
        def _post(self, payload):
            posts.append(payload)
            return super()._post(payload)

    class Broken(Counting):
        def search_many(self, queries, k):
            raise ConnectionResetError("batch refused")

    queries = ["Lumen Bridge", "River town 4", "zzzq"]
    store = CorpusPageStore(_Corpus(PAGES))
    local = Toolbox(LocalSearchIndex(_Corpus(PAGES)), store, ExtractiveSummarizer(), top_k=2)
    remote = Toolbox(Counting(url, timeout_s=5), store, ExtractiveSummarizer(), top_k=2)
    fallback = Toolbox(Broken(url, timeout_s=5), store, ExtractiveSummarizer(), top_k=2)
    expected = local.search(queries)
    got = remote.search(queries)
    assert len(posts) == 1 and posts[0]["queries"] == queries
    assert got.text == expected.text and got.urls == expected.urls and got.ok
    posts.clear()
    again = fallback.search(queries)  # the batch fails: one request per query instead
    assert len(posts) == 3 and again.text == expected.text and again.ok
