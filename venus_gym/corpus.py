"""Pages, tasks and worlds: the plain data every tool backend and environment reads.

A *world* is a corpus of pages plus the questions asked about it. Both halves are stored
as plain JSONL so a user can open them in any editor:

    <dir>/corpus.jsonl   one Page per line   {"url", "title", "text", "snippet"}
    <dir>/tasks.jsonl    one Task per line   {"id", "question", "answers", "hops", ...}
    <dir>/world.json     how the world was made (generator, seed, size), informational

Readers name the file and line of anything they cannot parse; nothing is skipped silently.
Every reader goes through `iter_lines` (encoding detection, per-line decoding) and
`parse_json_object` (JSON, nesting and surrogate checks); writers write to a temporary
name and rename when complete (`atomic_output`).
"""

from __future__ import annotations

import codecs
import json
import os
import re
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

T = TypeVar("T")


class DataFormatError(ValueError):
    """A JSONL line that does not match the expected schema (message names file:line)."""


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


#: Deepest JSON nesting a record may have. Real records nest a few levels; deeper ones would
#: make later recursive code (json.dumps, dataclasses.asdict) hit Python's recursion limit.
MAX_JSON_DEPTH = 100

_NEWLINES = {"utf-8": b"\n", "utf-16-le": b"\n\x00", "utf-16-be": b"\x00\n"}
# A \uD800-\uDFFF escape: the only way a lone surrogate gets into a decoded record (strict
# UTF-8 / UTF-16 decoding refuses encoded ones). Pairs are fine; the full check tells.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def detect_encoding(head: bytes) -> tuple[str, int]:
    """(encoding, length of the byte-order mark) of a text file from its first bytes.

    A UTF-8 or UTF-16 byte-order mark decides; without one, a NUL in the first two bytes
    means UTF-16 (RFC 4627 section 3: JSON text starts with two ASCII characters, and
    UTF-8 JSON never holds a raw NUL); anything else is read as UTF-8.
    """
    if head.startswith(codecs.BOM_UTF8):
        return "utf-8", len(codecs.BOM_UTF8)
    if head.startswith(codecs.BOM_UTF16_LE):
        return "utf-16-le", 2
    if head.startswith(codecs.BOM_UTF16_BE):
        return "utf-16-be", 2
    if len(head) >= 2 and head[0] and not head[1]:
        return "utf-16-le", 0
    if len(head) >= 2 and not head[0] and head[1]:
        return "utf-16-be", 0
    return "utf-8", 0


def _raw_lines(f: BinaryIO, newline: bytes, chunk: int = 1 << 20) -> Iterator[bytes]:
    """Split a binary stream at `newline`, which for UTF-16 must start at an even offset."""
    if len(newline) == 1:
        yield from f
        return
    buffer = b""
    while True:
        data = f.read(chunk)
        buffer += data
        start = 0
        search_from = 0
        while True:
            at = buffer.find(newline, search_from)
            if at < 0:
                break
            if (at - start) % 2:  # the pattern straddles two code units
                search_from = at + 1
                continue
            yield buffer[start:at + len(newline)]
            start = search_from = at + len(newline)
        buffer = buffer[start:]
        if not data:
            break
    if buffer:
        yield buffer


def iter_lines(path: str | Path) -> Iterator[tuple[int, str | None, str]]:
    """Yield (line number, text, problem) for every non-blank line of a text file.

    The encoding is detected once per file (`detect_encoding`); each line is decoded on
    its own, so an undecodable line is reported (text None, problem says why) and the
    rest of the file is still read. Lines end at "\\n" (a "\\r" before it is dropped).
    Every reader of user files counts and reads lines through this one function, so line
    numbers and totals agree everywhere.
    """
    with Path(path).open("rb") as f:
        head = f.read(4)
        encoding, bom = detect_encoding(head)
        f.seek(bom)
        newline = _NEWLINES[encoding]
        for lineno, raw in enumerate(_raw_lines(f, newline), start=1):
            try:
                text = raw.decode(encoding)
            except UnicodeDecodeError as e:
                yield lineno, None, (f"cannot decode the line as {encoding.upper()} "
                                     f"({e.reason} at byte {e.start}); save the file as UTF-8")
                continue
            if text.strip():
                yield lineno, text, ""


def count_lines(paths: Iterable[str | Path]) -> int:
    """Non-blank lines (what the readers yield or report) over all files."""
    return sum(1 for path in paths for _ in iter_lines(path))


def _too_deep(value: Any, limit: int) -> bool:
    """Whether a decoded JSON value nests deeper than `limit` (level by level, no recursion)."""
    level, depth = [value], 1
    while level:
        if depth > limit:
            return True
        deeper = []
        for item in level:
            for child in (item.values() if type(item) is dict else item):
                if type(child) is dict or type(child) is list:
                    deeper.append(child)
        level, depth = deeper, depth + 1
    return False


def has_lone_surrogate(value: Any) -> bool:
    """Whether any string in a decoded JSON value (keys included) holds a lone surrogate."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def parse_json_object(text: str) -> dict[str, Any]:
    """One JSONL line as a JSON object; every problem is a ValueError saying why.

    Refused besides invalid JSON: other JSON values than objects, nesting deeper than
    MAX_JSON_DEPTH, and strings with a lone surrogate (a `\\ud800` escape without its
    pair), which no UTF-8 writer or tokenizer can encode. Such records are refused whole
    rather than repaired, so a record is either kept as written or reported.
    """
    try:
        obj = json.loads(text)
    except RecursionError:
        raise ValueError(f"JSON nested too deeply (more than {MAX_JSON_DEPTH} levels)") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    if text.count("{") + text.count("[") > MAX_JSON_DEPTH and _too_deep(obj, MAX_JSON_DEPTH):
        raise ValueError(f"JSON nested too deeply (more than {MAX_JSON_DEPTH} levels)")
    if _SURROGATE_ESCAPE.search(text) and has_lone_surrogate(obj):
        raise ValueError("a string holds a lone surrogate (a \\ud800-style escape without "
                         "its pair), which UTF-8 cannot encode")
    return obj


def read_jsonl(path: str | Path, skip_bad: bool = False, errors: list[str] | None = None
               ) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line_number, object) for each non-blank line of a JSONL file.

    Lines are read with `iter_lines` (UTF-8, or UTF-16 by byte-order mark) and parsed with
    `parse_json_object`. A line that cannot be decoded or is not an acceptable JSON object
    raises DataFormatError naming file and line, unless skip_bad is set; then the problem
    is appended to `errors` (so nothing is lost silently).
    """
    for lineno, text, problem in iter_lines(path):
        obj: dict[str, Any] = {}
        if text is not None:
            try:
                obj = parse_json_object(text)
            except ValueError as e:
                problem = str(e)
        if problem:
            message = f"{path}:{lineno}: {problem}"
            if not skip_bad:
                raise DataFormatError(message) from None
            if errors is not None:
                errors.append(message)
            continue
        yield lineno, obj


def read_records(path: str | Path, parse: Callable[[dict[str, Any]], T],
                 skip_bad: bool = False, errors: list[str] | None = None) -> list[T]:
    """`parse` applied to every JSON object of a JSONL file.

    A line that is not a JSON object, or that `parse` rejects with ValueError / TypeError,
    raises DataFormatError naming file:line; with skip_bad it is skipped and the message
    appended to `errors`.
    """
    records: list[T] = []
    for lineno, obj in read_jsonl(path, skip_bad=skip_bad, errors=errors):
        try:
            records.append(parse(obj))
        except (ValueError, TypeError) as e:
            message = f"{path}:{lineno}: {e}"
            if not skip_bad:
                raise DataFormatError(message) from None
            if errors is not None:
                errors.append(message)
    return records


@contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to `path`; rename it to `path` when the block completes.

    On an exception the temporary file is deleted and `path` is left as it was, so a
    reader never sees a half-written output. A process killed inside the block leaves only
    a hidden `.NAME.tmp-*` file next to `path`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Not mkstemp: its file mode 0600 would survive the rename; the caller creates the file.
    temporary = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def json_line(row: Any) -> str:
    """`row` as one JSON line; non-ASCII kept as is, except that a string UTF-8 cannot
    encode (a lone surrogate) is written as its `\\u` escape, so writing never fails."""
    line = json.dumps(row, ensure_ascii=False)
    if not line.isascii():
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:
            line = json.dumps(row)
    return line + "\n"


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> int:
    """Write one JSON object per line (atomically: `atomic_output`); returns the count."""
    n = 0
    with atomic_output(path) as temporary, temporary.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json_line(row))
            n += 1
    return n


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
