"""Worlds and tool stacks shared between environment copies.

Building a world and its search index is the slow part of making an environment (seconds
for 50k pages); stepping is fast. Environments made with the same world settings in one
process therefore share one world and one index through a small LRU cache, so a group of
G environments (or `gym.make` in a loop) builds them once.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from venus_gym.corpus import Corpus, DataFormatError, Task, World, read_jsonl
from venus_gym.tools import (
    ChainedPageStore,
    CorpusPageStore,
    ExtractiveSummarizer,
    LocalSearchIndex,
    OpenAISummarizer,
    RetrievalServerBackend,
    Toolbox,
)
from venus_gym.tools.cache import (
    CachedPageStore,
    CachedSearch,
    CachedSummarizer,
    CostMeter,
    ToolCache,
)
from venus_gym.tools.fetch import GuardedFetcher
from venus_gym.tools.mcp_tools import is_mcp_spec
from venus_gym.tools.summarize import ChunkedSummarizer
from venus_gym.tools.web_search import JsonClient, make_search_provider
from venus_gym.worlds import load_world

from .config import DeepResearchConfig

_CACHE_SIZE = 4
_cache: OrderedDict[tuple, tuple[World, Any]] = OrderedDict()
_lock = threading.Lock()


def _world_key(cfg: DeepResearchConfig) -> tuple:
    if isinstance(cfg.world, World):
        return ("object", id(cfg.world), cfg.search_backend)
    spec = str(cfg.world)
    if Path(spec).exists():
        spec = str(Path(spec).resolve())
    return ("spec", spec, cfg.world_size, cfg.world_seed, cfg.search_backend, cfg.backend)


def world_and_index(cfg: DeepResearchConfig) -> tuple[World, Any]:
    """The world named by `cfg` and a local search index over it (cached per process)."""
    key = _world_key(cfg)
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    if cfg.backend == "web":
        world = _web_world(cfg)
    elif isinstance(cfg.world, World):
        world = cfg.world
    elif cfg.world == "synthetic":
        world = load_world("synthetic", n_pages=cfg.world_size, seed=cfg.world_seed)
    else:
        world = load_world(cfg.world)
    if not world.tasks and cfg.backend != "web":
        raise ValueError(f"world {world.name!r} has no tasks")
    index = (LocalSearchIndex(world.corpus)
             if cfg.search_backend == "local" and cfg.backend != "web" else None)
    with _lock:
        _cache[key] = (world, index)
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return world, index


def _web_world(cfg: DeepResearchConfig) -> World:
    """The tasks of a web environment (no pages: the web is the corpus). The default world
    means none: reset(options={"question": ..., "answer": ...}) supplies them."""
    if isinstance(cfg.world, World):
        tasks = list(cfg.world.tasks)
    elif cfg.world == "synthetic":
        tasks = []
    elif str(cfg.world).endswith(".jsonl") and Path(cfg.world).is_file():
        tasks = _web_tasks(Path(cfg.world))
    else:
        tasks = list(load_world(cfg.world).tasks)
    return World(name="web", corpus=Corpus([]), tasks=tasks, meta={"backend": "web"})


def _web_tasks(path: Path) -> list[Task]:
    """Tasks of a QA JSONL file (docs/worlds.md) for the web: "paragraphs" may be left out,
    since the pages come from the web."""
    tasks = []
    for lineno, record in read_jsonl(path):
        question, answers = record.get("question"), record.get("answers")
        if not isinstance(question, str) or not question.strip() or not isinstance(
                answers, list) or not answers or not all(
                isinstance(a, str) and a.strip() for a in answers):
            raise DataFormatError(f"{path}:{lineno}: a web task needs 'question' (a string) "
                                  f"and 'answers' (a non-empty list of strings)")
        raw_id = record.get("id")
        task_id = str(raw_id) if raw_id not in (None, "") else f"{path.stem}:{lineno}"
        hops = record.get("hops") if isinstance(record.get("hops"), int) else 0
        tasks.append(Task(id=task_id, question=question, answers=tuple(answers), hops=hops,
                          source=str(record.get("source") or path.name)))
    return tasks


def _key_from_env(variable: str | None) -> str | None:
    if not variable:
        return None
    key = os.environ.get(variable, "").strip()
    if not key:
        raise ValueError(f"summarizer_api_key_env names {variable}, which is not set in the "
                         f"environment (export {variable}=...)")
    return key


class _NotInReplay:
    """Stands for a live backend in replay mode, where none may be called."""

    def search(self, query: str, k: int) -> Any:
        raise AssertionError("replay mode called a live search backend")

    def fetch(self, url: str) -> Any:
        raise AssertionError("replay mode called a live page fetcher")


def build_web_toolbox(cfg: DeepResearchConfig) -> Toolbox:
    """search = the configured provider, visit = the guarded fetcher and the summarizer,
    all behind the record/replay cache, with one CostMeter (`toolbox.cost_meter`).

    Retries happen inside the providers and the fetcher (429/5xx/timeouts, with backoff);
    the toolbox itself does not retry, so a replayed run makes exactly the recorded calls.
    """
    meter = CostMeter()
    cache = ToolCache(cfg.cache_path, cfg.cache_mode, meter=meter)
    timeout = cfg.tool_timeout_s or 30.0
    provider = str(cfg.search_provider)
    endpoint = cfg.search_url or ""
    if cfg.cache_mode == "replay":  # no network and no keys needed
        search: Any = _NotInReplay()
        pages: Any = _NotInReplay()
    else:
        client = JsonClient(f"{provider} search", timeout_s=timeout, retries=cfg.tool_retries,
                            min_interval_s=cfg.search_min_interval_s, meter=meter)
        search = make_search_provider(provider, cfg.search_url, client,
                                      api_key_env=cfg.search_api_key_env)
        pages = GuardedFetcher(allow_hosts=cfg.allow_hosts, max_bytes=cfg.fetch_max_bytes,
                               timeout_s=cfg.fetch_timeout_s, allow_pdf=cfg.fetch_allow_pdf,
                               retries=cfg.tool_retries, meter=meter)
        if provider == "retrieve":  # its hits name its own documents (retrieval://doc/...)
            pages = ChainedPageStore(search, pages)
    if cfg.summarizer == "openai":
        def on_usage(prompt_tokens: int, completion_tokens: int) -> None:
            meter.add(summarizer_calls=1, summarizer_prompt_tokens=prompt_tokens,
                      summarizer_completion_tokens=completion_tokens)

        llm = None if cfg.cache_mode == "replay" else OpenAISummarizer(
            cfg.summarizer_url, cfg.summarizer_model, timeout_s=timeout,
            api_key=_key_from_env(cfg.summarizer_api_key_env), on_usage=on_usage)
        summarizer: Any = CachedSummarizer(
            ChunkedSummarizer(llm, chunk_chars=cfg.summarizer_chunk_chars),
            cache, identity=f"{cfg.summarizer_url}|{cfg.summarizer_model}|"
                            f"{cfg.summarizer_chunk_chars}")
    else:
        summarizer = ExtractiveSummarizer()  # deterministic: nothing to record
    return Toolbox(CachedSearch(search, cache, provider, endpoint),
                   CachedPageStore(pages, cache), summarizer,
                   top_k=cfg.search_top_k, timeout_s=cfg.tool_timeout_s, retries=0,
                   max_queries=cfg.max_queries_per_call, max_urls=cfg.max_urls_per_call,
                   cost_meter=meter, cache=cache)


def build_toolbox(cfg: DeepResearchConfig, world: World, index: Any) -> Toolbox:
    """The search/visit tools for one environment, as `cfg` asks."""
    if cfg.backend == "web":
        return build_web_toolbox(cfg)
    remote = cfg.search_backend != "local" or cfg.summarizer != "extractive"
    timeout = cfg.tool_timeout_s if cfg.tool_timeout_s is not None else (30.0 if remote else None)
    page_store = CorpusPageStore(world.corpus)
    if cfg.search_backend == "retrieval_server":
        search = RetrievalServerBackend(cfg.retrieval_url, timeout_s=timeout or 30.0)
        # A retrieval server's hits may point at documents the local corpus lacks.
        page_store = ChainedPageStore(search, page_store)
    else:
        search = index
    if cfg.summarizer == "openai":
        summarizer = OpenAISummarizer(cfg.summarizer_url, cfg.summarizer_model,
                                      timeout_s=timeout or 30.0)
    else:
        summarizer = ExtractiveSummarizer()
    meter = cache = None
    if any(map(is_mcp_spec, cfg.extra_tools)):  # MCP calls: counted, recorded / replayed
        meter = CostMeter()
        cache = ToolCache(cfg.cache_path, cfg.cache_mode, meter=meter)
    return Toolbox(search, page_store, summarizer,
                   top_k=cfg.search_top_k, timeout_s=timeout, retries=cfg.tool_retries,
                   max_queries=cfg.max_queries_per_call, max_urls=cfg.max_urls_per_call,
                   cost_meter=meter, cache=cache)


def in_split(task: Task, split: str, test_fraction: float,
             validation_fraction: float = 0.0) -> bool:
    """Deterministic train/validation/test membership from a hash of the task id, a number
    h in [0, 1) stable across runs and machines: test is h < test_fraction, validation the
    next validation_fraction, train the rest (so adding a validation split takes tasks from
    train only and never changes the test split)."""
    if split == "all":
        return True
    digest = hashlib.sha1(task.id.encode("utf-8")).digest()
    position = int.from_bytes(digest[:8], "big") / 2**64
    if position < test_fraction:
        return split == "test"
    if position < test_fraction + validation_fraction:
        return split == "validation"
    return split == "train"


def select_tasks(world: World, cfg: DeepResearchConfig) -> list[Task]:
    seen: set[str] = set()
    for t in world.tasks:
        if t.id in seen:
            raise ValueError(f"world {world.name!r} has two tasks with id {t.id!r}: task ids "
                             f"must be unique (reset selects tasks by id)")
        seen.add(t.id)
    tasks = [t for t in world.tasks
             if in_split(t, cfg.task_split, cfg.test_fraction, cfg.validation_fraction)
             and (cfg.hops is None or t.hops in cfg.hops)]
    if not tasks and (cfg.backend != "web" or world.tasks):
        raise ValueError(f"no tasks left in world {world.name!r} after task_split="
                         f"{cfg.task_split!r}, hops={cfg.hops!r}")
    return tasks
