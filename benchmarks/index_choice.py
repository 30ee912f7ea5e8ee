"""Which engine backs the local `search` tool: tantivy or bm25s (rank-bm25 as slow baseline)?

Run:  python benchmarks/index_choice.py            (50,000 synthetic pages, ~1-2 min)
      python benchmarks/index_choice.py --pages 100000 --skip-rank-bm25

What it measures, all in one process so the ratios are fair:
- build time of each index over N synthetic pages (entity-like titles, ~8 sentences of
  Zipf-distributed words from a vocabulary of a few thousand words);
- single-query latency / QPS for 1-5 word queries, one query at a time as the environment
  issues them (titles' words mixed with words of the page text, top 10);
- quality on real data: every paragraph of HotpotQA dev (distractor, 500 questions) becomes
  a page (deduplicated by title+text); each supporting paragraph's title is searched and must
  come back in the top 5 (recall@5). As a harder, secondary check the question itself is
  searched and its supporting paragraphs must be in the top 10 (question recall@10).

tantivy is measured through the product class `venus_gym.tools.LocalSearchIndex` (so its
numbers include our Python overhead: query analysis, hit objects), twice: as shipped
("tantivy", with common-word pruning) and as plain BM25 over every query word
("tantivy_exact", `common_term_ratio=None`), which is the like-for-like engine comparison.
bm25s and rank-bm25 have no fields, so their documents are "title title text" (the title
counted twice, as the product's separate title field does), tokenised with bm25s's own
tokenizer (English stopwords removed, no stemmer installed).
bm25s is queried with `get_scores` + `argpartition`, its fastest single-query path; its
`retrieve()` call is timed too, since that is the API most users reach for.

Last, if the embedded world generator is importable, the same is timed on its 50k-page
world with the queries an agent sends there (task questions, entity names, hop goals),
with the share of queries whose top hit is unchanged by pruning.

Output: `RESULT <name>=<value>` lines (plus a short human-readable log on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from venus_gym.corpus import Page  # noqa: E402
from venus_gym.tools import LocalSearchIndex  # noqa: E402

HOTPOT_CANDIDATES = (
    Path(__file__).resolve().parents[1] / "venus_gym" / "data" / "hotpotqa_dev_distractor_500.jsonl",
    Path("/work/shared/data/hotpotqa_dev_distractor_500.jsonl"),
)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def result(name: str, value: float | int | str) -> None:
    if isinstance(value, float):
        value = f"{value:.4g}"
    print(f"RESULT {name}={value}", flush=True)


# --- data --------------------------------------------------------------------------------

def synthetic_pages(n: int, seed: int = 0, vocab_size: int = 5000, sentences: int = 8,
                    words_per_sentence: int = 12) -> list[Page]:
    """N pages of made-up words; Zipf word frequencies so a few words are in every page
    (like "the") and most are rare, as in real text. Vectorised: ~1 s for 50k pages."""
    rng = np.random.default_rng(seed)
    syllables = [c + v + e for c in "bcdfghjklmnprstvwz" for v in "aeiou" for e in ("", "n", "r", "l", "s")]

    def words(m: int, lo: int, hi: int) -> list[str]:
        lengths = rng.integers(lo, hi + 1, size=m).tolist()
        parts = rng.integers(0, len(syllables), size=(m, hi)).tolist()
        return ["".join(syllables[s] for s in p[:length]) for p, length in zip(parts, lengths)]

    vocab = sorted(set(words(vocab_size, 1, 3)))
    rng.shuffle(vocab)  # so that frequency rank is unrelated to spelling
    weights = 1.0 / np.arange(1, len(vocab) + 1)
    names = [w.capitalize() for w in words(8000, 2, 3)]
    first = rng.integers(0, len(names), n).tolist()
    last = rng.integers(0, len(names), n).tolist()
    per_page = sentences * words_per_sentence
    flat = [vocab[i] for i in rng.choice(len(vocab), size=n * per_page,
                                         p=weights / weights.sum()).tolist()]
    pages = []
    for i in range(n):
        title = f"{names[first[i]]} {names[last[i]]}"
        base = i * per_page
        sents = [" ".join(flat[base + j * words_per_sentence: base + (j + 1) * words_per_sentence])
                 for j in range(sentences)]
        text = f"{title} is a {sents[0]}. " + ". ".join(s.capitalize() for s in sents[1:]) + "."
        pages.append(Page(url=f"https://synthetic.local/wiki/{i}", title=title, text=text))
    return pages


def synthetic_queries(pages: list[Page], n: int, seed: int = 1) -> list[str]:
    """1-5 word queries mixing a page's title words with distinct words of its text."""
    rng = random.Random(seed)
    queries = []
    for _ in range(n):
        page = pages[rng.randrange(len(pages))]
        distinct = sorted(set(page.text.replace(".", "").lower().split()))
        pool = page.title.split() + rng.sample(distinct, 6)
        queries.append(" ".join(rng.sample(pool, rng.randint(1, 5))))
    return queries


def hotpot_data(path: Path) -> tuple[list[Page], list[Page], list[tuple[str, set[str]]]]:
    """(pages, supporting pages, [(question, supporting urls)]), deduplicated by title+text."""
    by_key: dict[tuple[str, str], Page] = {}
    supporting: list[Page] = []
    questions = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            gold = set()
            for para in record["paragraphs"]:
                key = (para["title"], para["text"])
                if key not in by_key:
                    by_key[key] = Page(url=f"https://hotpot.local/{len(by_key)}",
                                       title=para["title"], text=para["text"])
                if para["is_supporting"]:
                    supporting.append(by_key[key])
                    gold.add(by_key[key].url)
            questions.append((record["question"], gold))
    return list(by_key.values()), supporting, questions


# --- engines -----------------------------------------------------------------------------
# Each engine: build(pages) -> search(query, k) -> list of urls, best first.

Search = Callable[[str, int], list[str]]


def tantivy_engines(pages: list[Page]) -> tuple[Search, Search]:
    """(as shipped, plain BM25 over every query word), sharing one index."""
    index = LocalSearchIndex(pages)
    shipped_ratio = index.common_term_ratio

    def search(query: str, k: int) -> list[str]:
        index.common_term_ratio = shipped_ratio
        return [h.url for h in index.search(query, k)]

    def search_exact(query: str, k: int) -> list[str]:
        index.common_term_ratio = None
        return [h.url for h in index.search(query, k)]
    return search, search_exact


def _bm25_docs(pages: list[Page]) -> list[list[str]]:
    import bm25s
    return bm25s.tokenize([f"{p.title} {p.title} {p.text}" for p in pages], stopwords="en",
                          return_ids=False, show_progress=False)


def bm25s_engine(pages: list[Page]) -> tuple[Search, Search]:
    import bm25s
    retriever = bm25s.BM25()
    retriever.index(_bm25_docs(pages), show_progress=False)
    vocab = retriever.vocab_dict

    def tokens(query: str) -> list[str]:
        toks = bm25s.tokenize(query, stopwords="en", return_ids=False, show_progress=False)[0]
        return [t for t in toks if t in vocab]

    def search(query: str, k: int) -> list[str]:
        toks = tokens(query)
        if not toks:
            return []
        scores = retriever.get_scores(toks)
        top = np.argpartition(-scores, min(k, len(scores) - 1))[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [pages[i].url for i in top if scores[i] > 0]

    def search_retrieve(query: str, k: int) -> list[str]:
        toks = tokens(query)
        if not toks:
            return []
        docs, _ = retriever.retrieve([toks], k=k, show_progress=False, n_threads=1)
        return [pages[i].url for i in docs[0]]
    return search, search_retrieve


def rank_bm25_engine(pages: list[Page]) -> Search:
    import bm25s
    from rank_bm25 import BM25Okapi
    bm25 = BM25Okapi(_bm25_docs(pages))

    def search(query: str, k: int) -> list[str]:
        toks = bm25s.tokenize(query, stopwords="en", return_ids=False, show_progress=False)[0]
        scores = bm25.get_scores(toks)
        top = np.argsort(-scores, kind="stable")[:k]
        return [pages[i].url for i in top if scores[i] > 0]
    return search


# --- measurements ------------------------------------------------------------------------

def timed_build(name: str, build: Callable[[list[Page]], object], pages: list[Page]):
    t0 = time.perf_counter()
    engine = build(pages)
    seconds = time.perf_counter() - t0
    log(f"{name}: built over {len(pages)} pages in {seconds:.2f} s")
    return engine, seconds


def qps(search: Search, queries: list[str], k: int = 10, rounds: int = 3) -> tuple[float, float]:
    """(queries per second, median latency in microseconds), best of `rounds` passes."""
    best, median = 0.0, 0.0
    for _ in range(rounds):
        lat = []
        t_all = time.perf_counter()
        for q in queries:
            t0 = time.perf_counter()
            search(q, k)
            lat.append(time.perf_counter() - t0)
        rate = len(queries) / (time.perf_counter() - t_all)
        if rate > best:
            best, median = rate, float(np.median(lat)) * 1e6
    return best, median


def hotpot_recall(search: Search, supporting: list[Page],
                  questions: list[tuple[str, set[str]]]) -> tuple[float, float]:
    title_r5 = sum(p.url in search(p.title, 5) for p in supporting) / len(supporting)
    found = total = 0
    for question, gold in questions:
        top = set(search(question, 10))
        found += len(gold & top)
        total += len(gold)
    return title_r5, found / total


def world_queries(n_pages: int) -> tuple[list[Page], list[str]] | None:
    try:
        from venus_gym.worlds import load_world
    except ImportError:
        return None
    world = load_world("synthetic", n_pages=n_pages, seed=0)
    tasks = random.Random(0).sample(world.tasks, min(1000, len(world.tasks)))  # all hop counts
    queries = [t.question for t in tasks]
    for t in tasks:
        for hop in t.gold_path:
            queries += [hop["entity"], hop["goal"]] if "goal" in hop else [hop["entity"]]
    return world.corpus.pages, queries


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=50_000)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--rank-bm25-queries", type=int, default=30,
                    help="rank-bm25 scores every page in Python; a few queries suffice")
    ap.add_argument("--skip-rank-bm25", action="store_true")
    ap.add_argument("--skip-bm25s", action="store_true")
    ap.add_argument("--skip-world", action="store_true")
    ap.add_argument("--hotpot", type=Path, default=None)
    args = ap.parse_args()

    result("machine", f"{platform.machine()}-{os.cpu_count()}cpu-py{platform.python_version()}")
    t0 = time.perf_counter()
    pages = synthetic_pages(args.pages)
    queries = synthetic_queries(pages, args.queries)
    log(f"generated {len(pages)} pages, {len(queries)} queries in {time.perf_counter() - t0:.1f} s")
    result("pages", len(pages))

    (shipped, exact), build_s = timed_build("tantivy", tantivy_engines, pages)
    shipped_qps, shipped_lat = qps(shipped, queries)
    exact_qps, exact_lat = qps(exact, queries)
    result("tantivy_build_s", build_s)
    result("tantivy_qps", shipped_qps)
    result("tantivy_median_us", shipped_lat)
    result("tantivy_exact_qps", exact_qps)
    result("tantivy_exact_median_us", exact_lat)
    del shipped, exact

    if not args.skip_bm25s:
        (bm25s_search, bm25s_retrieve), bm25s_build = timed_build("bm25s", bm25s_engine, pages)
        bm25s_qps, bm25s_lat = qps(bm25s_search, queries)
        retrieve_qps, _ = qps(bm25s_retrieve, queries[:200], rounds=1)
        result("bm25s_build_s", bm25s_build)
        result("bm25s_qps", bm25s_qps)
        result("bm25s_median_us", bm25s_lat)
        result("bm25s_retrieve_api_qps", retrieve_qps)
        result("tantivy_exact_vs_bm25s_qps_ratio", exact_qps / bm25s_qps)
        result("tantivy_vs_bm25s_qps_ratio", shipped_qps / bm25s_qps)
        del bm25s_search, bm25s_retrieve

    if not args.skip_rank_bm25:
        rank_search, rank_build = timed_build("rank-bm25", rank_bm25_engine, pages)
        rank_qps, rank_lat = qps(rank_search, queries[: args.rank_bm25_queries], rounds=1)
        result("rank_bm25_build_s", rank_build)
        result("rank_bm25_qps", rank_qps)
        result("rank_bm25_median_us", rank_lat)
        result("tantivy_exact_vs_rank_bm25_qps_ratio", exact_qps / rank_qps)
        result("tantivy_vs_rank_bm25_qps_ratio", shipped_qps / rank_qps)
        del rank_search

    hotpot = args.hotpot or next((p for p in HOTPOT_CANDIDATES if p.is_file()), None)
    if hotpot is None or not hotpot.is_file():
        log("HotpotQA file not found; skipping the quality check")
    else:
        hp_pages, supporting, questions = hotpot_data(hotpot)
        result("hotpot_pages", len(hp_pages))
        result("hotpot_supporting", len(supporting))
        (shipped, exact), _ = timed_build("tantivy (hotpot)", tantivy_engines, hp_pages)
        engines: list[tuple[str, Search]] = [("tantivy", shipped), ("tantivy_exact", exact)]
        if not args.skip_bm25s:
            engines.append(("bm25s", bm25s_engine(hp_pages)[0]))
        if not args.skip_rank_bm25:
            engines.append(("rank_bm25", rank_bm25_engine(hp_pages)))
        for name, search in engines:
            title_r5, question_r10 = hotpot_recall(search, supporting, questions)
            result(f"{name}_hotpot_title_recall@5", title_r5)
            result(f"{name}_hotpot_question_recall@10", question_r10)

    world = None if args.skip_world else world_queries(args.pages)
    if world is not None:
        w_pages, w_queries = world
        (shipped, exact), build_s = timed_build("tantivy (embedded world)", tantivy_engines,
                                                w_pages)
        result("world_pages", len(w_pages))
        result("world_queries", len(w_queries))
        result("world_tantivy_build_s", build_s)
        result("world_tantivy_qps", qps(shipped, w_queries)[0])
        result("world_tantivy_exact_qps", qps(exact, w_queries)[0])
        same = sum(shipped(q, 1) == exact(q, 1) for q in w_queries) / len(w_queries)
        result("world_pruning_top1_agreement", same)


if __name__ == "__main__":
    main()
