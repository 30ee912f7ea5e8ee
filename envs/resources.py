"""Worlds and tool stacks shared between environment copies.

Building a world and its search index is the slow part of making an environment (seconds
for 50k pages); stepping is fast. Environments made with the same world settings in one
process therefore share one world and one index through a small LRU cache, so a group of
G environments (or `gym.make` in a loop) builds them once.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from venus_gym.corpus import Task, World
from venus_gym.tools import (
    ChainedPageStore,
    CorpusPageStore,
    ExtractiveSummarizer,
    LocalSearchIndex,
    OpenAISummarizer,
    RetrievalServerBackend,
    Toolbox,
)
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
    return ("spec", spec, cfg.world_size, cfg.world_seed, cfg.search_backend)


def world_and_index(cfg: DeepResearchConfig) -> tuple[World, Any]:
    """The world named by `cfg` and a local search index over it (cached per process)."""
    key = _world_key(cfg)
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    if isinstance(cfg.world, World):
        world = cfg.world
    elif cfg.world == "synthetic":
        world = load_world("synthetic", n_pages=cfg.world_size, seed=cfg.world_seed)
    else:
        world = load_world(cfg.world)
    if not world.tasks:
        raise ValueError(f"world {world.name!r} has no tasks")
    index = LocalSearchIndex(world.corpus) if cfg.search_backend == "local" else None
    with _lock:
        _cache[key] = (world, index)
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return world, index


def build_toolbox(cfg: DeepResearchConfig, world: World, index: Any) -> Toolbox:
    """The search/visit tools for one environment, as `cfg` asks."""
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
    return Toolbox(search, page_store, summarizer,
                   top_k=cfg.search_top_k, timeout_s=timeout, retries=cfg.tool_retries,
                   max_queries=cfg.max_queries_per_call, max_urls=cfg.max_urls_per_call)


def in_split(task: Task, split: str, test_fraction: float) -> bool:
    """Deterministic train/test membership from a hash of the task id (stable across runs)."""
    if split == "all":
        return True
    digest = hashlib.sha1(task.id.encode("utf-8")).digest()
    is_test = int.from_bytes(digest[:8], "big") / 2**64 < test_fraction
    return is_test if split == "test" else not is_test


def select_tasks(world: World, cfg: DeepResearchConfig) -> list[Task]:
    seen: set[str] = set()
    for t in world.tasks:
        if t.id in seen:
            raise ValueError(f"world {world.name!r} has two tasks with id {t.id!r}: task ids "
                             f"must be unique (reset selects tasks by id)")
        seen.add(t.id)
    tasks = [t for t in world.tasks
             if in_split(t, cfg.task_split, cfg.test_fraction)
             and (cfg.hops is None or t.hops in cfg.hops)]
    if not tasks:
        raise ValueError(f"no tasks left in world {world.name!r} after task_split="
                         f"{cfg.task_split!r}, hops={cfg.hops!r}")
    return tasks
