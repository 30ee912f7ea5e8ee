"""Pages, tasks and worlds: the plain data every tool backend and environment reads.

A *world* is a corpus of pages plus the questions asked about it. Both halves are stored
as plain JSONL so a user can open them in any editor:

    <dir>/corpus.jsonl   one Page per line   {"url", "title", "text", "snippet"}
    <dir>/tasks.jsonl    one Task per line   {"id", "question", "answers", "hops", ...}
    <dir>/world.json     how the world was made (generator, seed, size), informational

Readers name the file and line of anything they cannot parse; nothing is skipped silently.
Reading and writing go through `venus_gym.jsonl`, the project's one JSONL reader and writer
(its names are importable from here as well).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# The JSONL machinery lives in venus_gym.jsonl; these names stay importable from here.
from venus_gym.jsonl import (  # noqa: F401
    MAX_JSON_DEPTH,
    DataFormatError,
    atomic_output,
    count_lines,
    detect_encoding,
    has_lone_surrogate,
    iter_lines,
    json_line,
    parse_json_object,
    read_jsonl,
    read_records,
    write_jsonl,
)


@dataclass(frozen=True)
class Page:
    """One browsable document.

    url:     unique key, what `visit` takes and search results show.
    title:   shown in search results.
    text:    the full page text that `visit` reads.
    snippet: what search results show under the title. For the embedded world it never
             contains a task's answer, so the agent has to read pages.
    """

    url: str
    title: str
    text: str
    snippet: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Task:
    """One question with its gold answers.

    answers:   every accepted answer; the first is the canonical one. Scoring takes the
               best match over all of them.
    hops:      number of pages one must read to answer (0 if unknown).
    gold_urls: pages on the gold path, in reading order (may be empty for real data
               where only the supporting paragraphs are known, unordered).
    gold_path: structured hops for the oracle agent, one dict per hop:
               {"entity": str, "url": str, "relation": str, "value": str}.
    """

    id: str
    question: str
    answers: tuple[str, ...]
    hops: int = 0
    gold_urls: tuple[str, ...] = ()
    gold_path: tuple[dict[str, Any], ...] = ()
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["answers"] = list(self.answers)
        d["gold_urls"] = list(self.gold_urls)
        d["gold_path"] = [dict(h) for h in self.gold_path]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Task:
        answers = d.get("answers")
        if isinstance(answers, str):
            answers = [answers]
        if not isinstance(answers, list | tuple) or not answers or not all(
            isinstance(a, str) for a in answers
        ):
            raise ValueError("'answers' must be a non-empty list of strings")
        if not isinstance(d.get("question"), str) or not d["question"].strip():
            raise ValueError("'question' must be a non-empty string")
        return cls(
            id=str(d.get("id", "")),
            question=d["question"],
            answers=tuple(answers),
            hops=int(d.get("hops", 0) or 0),
            gold_urls=tuple(d.get("gold_urls", ()) or ()),
            gold_path=tuple(dict(h) for h in d.get("gold_path", ()) or ()),
            source=str(d.get("source", "")),
            meta=dict(d.get("meta", {}) or {}),
        )


def page_from_json(d: dict[str, Any]) -> Page:
    for key in ("url", "title", "text"):
        if not isinstance(d.get(key), str):
            raise ValueError(f"field {key!r} must be a string")
    snippet = d.get("snippet", "")
    if not isinstance(snippet, str):
        raise ValueError("field 'snippet' must be a string")
    return Page(url=d["url"], title=d["title"], text=d["text"], snippet=snippet)


class Corpus:
    """An ordered collection of pages with lookup by url."""

    def __init__(self, pages: Iterable[Page]):
        self.pages: list[Page] = list(pages)
        self._by_url: dict[str, Page] = {}
        for p in self.pages:
            if p.url in self._by_url:
                raise ValueError(f"duplicate page url {p.url!r} in corpus")
            self._by_url[p.url] = p

    def __len__(self) -> int:
        return len(self.pages)

    def __iter__(self) -> Iterator[Page]:
        return iter(self.pages)

    def __contains__(self, url: object) -> bool:
        return url in self._by_url

    def get(self, url: str) -> Page | None:
        return self._by_url.get(url)

    def save(self, path: str | Path) -> int:
        return write_jsonl(path, (p.to_json() for p in self.pages))

    @classmethod
    def load(cls, path: str | Path) -> Corpus:
        return cls(read_records(path, page_from_json))


def load_tasks(path: str | Path) -> list[Task]:
    return read_records(path, Task.from_json)


def save_tasks(path: str | Path, tasks: Iterable[Task]) -> int:
    return write_jsonl(path, (t.to_json() for t in tasks))


@dataclass
class World:
    """A corpus plus the tasks asked about it."""

    name: str
    corpus: Corpus
    tasks: list[Task]
    meta: dict[str, Any] = field(default_factory=dict)

    def save(self, directory: str | Path) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.corpus.save(d / "corpus.jsonl")
        save_tasks(d / "tasks.jsonl", self.tasks)
        (d / "world.json").write_text(
            json.dumps({"name": self.name, "n_pages": len(self.corpus),
                        "n_tasks": len(self.tasks), **self.meta}, indent=2) + "\n",
            encoding="utf-8")
        return d

    @classmethod
    def load(cls, directory: str | Path) -> World:
        d = Path(directory)
        if not (d / "corpus.jsonl").is_file() or not (d / "tasks.jsonl").is_file():
            raise FileNotFoundError(
                f"{d} is not a saved world: expected corpus.jsonl and tasks.jsonl in it")
        meta: dict[str, Any] = {}
        if (d / "world.json").is_file():
            meta = json.loads((d / "world.json").read_text(encoding="utf-8"))
        name = str(meta.pop("name", d.name))
        meta.pop("n_pages", None)
        meta.pop("n_tasks", None)
        return cls(name=name, corpus=Corpus.load(d / "corpus.jsonl"),
                   tasks=load_tasks(d / "tasks.jsonl"), meta=meta)
