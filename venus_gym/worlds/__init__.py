"""Worlds: a corpus of pages plus the questions asked about it.

    load_world("synthetic", n_pages=2000, seed=0)   # the embedded generated world
    load_world("hotpotqa")                           # packaged HotpotQA dev subset (500 q)
    load_world("path/to/saved_world/")               # a directory written by World.save
    load_world("path/to/questions.jsonl")            # QA JSONL with paragraphs

Modules: `synthetic` (generator), `qa` (real multi-hop QA data), `oracle` (scripted agent).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from venus_gym.corpus import World
from venus_gym.worlds.qa import load_qa_world
from venus_gym.worlds.synthetic import WorldConfig, generate_world

__all__ = ["load_world", "generate_world", "load_qa_world", "WorldConfig", "WORLD_NAMES",
           "packaged_data_path"]

#: Names `load_world` accepts besides paths.
WORLD_NAMES = ("synthetic", "hotpotqa")
_HOTPOTQA_FILE = "hotpotqa_dev_distractor_500.jsonl"


def packaged_data_path(filename: str) -> Path:
    """Path of a file shipped in ``venus_gym/data``."""
    return Path(str(resources.files("venus_gym") / "data" / filename))


def load_world(name_or_path: str | Path = "synthetic", **kwargs: Any) -> World:
    """Load or build a world by name or path.

    Args:
        name_or_path: "synthetic" (keyword arguments go to `generate_world`: n_pages,
            seed, n_tasks, hops, distractors_per_page), "hotpotqa" (the packaged HotpotQA
            dev subset; no keyword arguments), a directory saved by `World.save`, or a QA
            JSONL file (keyword arguments go to `load_qa_world`: name, skip_bad).

    Raises:
        ValueError: an unknown name (the message lists the choices) or bad settings.
        TypeError: keyword arguments the chosen loader does not take.
    """
    if isinstance(name_or_path, str) and name_or_path == "synthetic":
        return generate_world(**kwargs)
    if isinstance(name_or_path, str) and name_or_path == "hotpotqa":
        if kwargs:
            raise TypeError(f"load_world('hotpotqa') takes no keyword arguments, got "
                            f"{sorted(kwargs)}")
        return _copy(_packaged_hotpotqa())
    path = Path(name_or_path)
    if path.is_dir():
        if kwargs:
            raise TypeError(f"loading a saved world takes no keyword arguments, got "
                            f"{sorted(kwargs)}")
        return World.load(path)
    if path.is_file():
        return load_qa_world(path, **kwargs)
    raise ValueError(f"unknown world {str(name_or_path)!r}: expected one of {list(WORLD_NAMES)}, "
                     "a directory saved by World.save, or a QA .jsonl file")


@lru_cache(maxsize=1)
def _packaged_hotpotqa() -> World:
    # Parsed once per process: environments are often built many times over.
    return load_qa_world(packaged_data_path(_HOTPOTQA_FILE), name="hotpotqa")


def _copy(world: World) -> World:
    """A World that shares the (read-only) pages and tasks but whose task list and meta a
    caller may change without affecting the cached one."""
    return World(name=world.name, corpus=world.corpus, tasks=list(world.tasks),
                 meta=dict(world.meta))
