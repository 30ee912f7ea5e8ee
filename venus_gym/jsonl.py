"""The one JSONL reader and writer: every file venus-gym writes as JSON lines and reads back.

Worlds (corpus.jsonl, tasks.jsonl), the data pipeline's inputs and outputs, trajectories
(RL samples, SFT data), `venus-gym eval`'s results.jsonl, training metrics.jsonl and the
viewer all go through the functions below, so a record is cut into lines one way only.

Writing: `json_line` (and `write_jsonl`, `append_jsonl` on top of it) keeps non-ASCII text
as it is, except three characters that other line splitters treat as line ends (U+0085,
U+2028, U+2029: Python's `str.splitlines`, JavaScript before ES2019) and strings UTF-8
cannot encode (a lone surrogate): those are written as their `\\u` escapes, which JSON
decodes to the same string. A line never holds a raw line break of any kind.

Reading: `iter_lines` splits at "\\n" only (never at U+2028 and the like, so files written
by older versions, which kept those raw, read back whole), detects UTF-8 / UTF-16 once per
file and decodes line by line. `iter_json_lines` parses each line (`parse_json_object`:
an object, nesting at most MAX_JSON_DEPTH) and says what is wrong with a line instead of
raising, for readers that skip or repair (a resume after a kill); `read_jsonl` and
`read_records` raise `DataFormatError` naming file:line, or skip and list the line.

Lone surrogates: JSON can carry them (as escapes) but UTF-8 and tokenizers cannot, so
readers of training data and user input refuse a record holding one (the default), while
readers of files the project wrote itself (`allow_lone_surrogates=True`: eval results,
metrics, the viewer) return it as written.
"""

from __future__ import annotations

import codecs
import json
import os
import re
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO, TypeVar

T = TypeVar("T")


class DataFormatError(ValueError):
    """A JSONL line that does not match the expected schema (message names file:line)."""


#: Deepest JSON nesting a record may have. Real records nest a few levels; deeper ones would
#: make later recursive code (json.dumps, dataclasses.asdict) hit Python's recursion limit.
MAX_JSON_DEPTH = 100

_NEWLINES = {"utf-8": b"\n", "utf-16-le": b"\n\x00", "utf-16-be": b"\x00\n"}
# A \uD800-\uDFFF escape: the only way a lone surrogate gets into a decoded record (strict
# UTF-8 / UTF-16 decoding refuses encoded ones). Pairs are fine; the full check tells.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
# Characters that str.splitlines (and other splitters) take for line ends but json.dumps
# leaves raw with ensure_ascii=False. In json.dumps output they can only stand inside a
# string, where their escape means the same.
_LINE_BREAK_ESCAPES = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_LINE_BREAKS = re.compile("[\x85\u2028\u2029]")


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
    rest of the file is still read. Lines end at "\\n" only; the text keeps its line end.
    Every reader counts and reads lines through this one function, so line numbers and
    totals agree everywhere.
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


def parse_json_object(text: str, allow_lone_surrogates: bool = False) -> dict[str, Any]:
    """One JSONL line as a JSON object; every problem is a ValueError saying why.

    Refused besides invalid JSON: other JSON values than objects, nesting deeper than
    MAX_JSON_DEPTH, and (unless `allow_lone_surrogates`) strings with a lone surrogate (a
    `\\ud800` escape without its pair), which no UTF-8 writer or tokenizer can encode.
    Such records are refused whole rather than repaired, so a record is either kept as
    written or reported.
    """
    try:
        obj = json.loads(text)
    except RecursionError:
        raise ValueError(f"JSON nested too deeply (more than {MAX_JSON_DEPTH} levels)") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    if text.count("{") + text.count("[") > MAX_JSON_DEPTH and _too_deep(obj, MAX_JSON_DEPTH):
        raise ValueError(f"JSON nested too deeply (more than {MAX_JSON_DEPTH} levels)")
    if (not allow_lone_surrogates and _SURROGATE_ESCAPE.search(text)
            and has_lone_surrogate(obj)):
        raise ValueError("a string holds a lone surrogate (a \\ud800-style escape without "
                         "its pair), which UTF-8 cannot encode")
    return obj


@dataclass(frozen=True)
class JsonLine:
    """One non-blank line of a JSONL file as `iter_json_lines` read it.

    text:    the line as written, without its line end ("" when it could not be decoded).
    record:  the JSON object, or None when the line is not an acceptable one.
    problem: why not ("" when `record` is set).
    """

    lineno: int
    text: str
    record: dict[str, Any] | None
    problem: str


def iter_json_lines(path: str | Path, allow_lone_surrogates: bool = False
                    ) -> Iterator[JsonLine]:
    """Every non-blank line of a JSONL file, parsed; never raises for a bad line.

    For readers that decide per line what a bad one means (skip it, drop a torn last
    line, stop); `read_jsonl` is the strict form.
    """
    for lineno, text, problem in iter_lines(path):
        if text is None:
            yield JsonLine(lineno, "", None, problem)
            continue
        try:
            record = parse_json_object(text, allow_lone_surrogates)
        except ValueError as e:
            yield JsonLine(lineno, text.rstrip("\r\n"), None, str(e))
            continue
        yield JsonLine(lineno, text.rstrip("\r\n"), record, "")


def read_jsonl(path: str | Path, skip_bad: bool = False, errors: list[str] | None = None,
               allow_lone_surrogates: bool = False) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line_number, object) for each non-blank line of a JSONL file.

    Lines are read with `iter_lines` (UTF-8, or UTF-16 by byte-order mark) and parsed with
    `parse_json_object`. A line that cannot be decoded or is not an acceptable JSON object
    raises DataFormatError naming file and line, unless skip_bad is set; then the problem
    is appended to `errors` (so nothing is lost silently).
    """
    for line in iter_json_lines(path, allow_lone_surrogates):
        if line.record is None:
            message = f"{path}:{line.lineno}: {line.problem}"
            if not skip_bad:
                raise DataFormatError(message) from None
            if errors is not None:
                errors.append(message)
            continue
        yield line.lineno, line.record


def read_records(path: str | Path, parse: Callable[[dict[str, Any]], T],
                 skip_bad: bool = False, errors: list[str] | None = None,
                 allow_lone_surrogates: bool = False) -> list[T]:
    """`parse` applied to every JSON object of a JSONL file.

    A line that is not a JSON object, or that `parse` rejects with ValueError / TypeError,
    raises DataFormatError naming file:line; with skip_bad it is skipped and the message
    appended to `errors`.
    """
    records: list[T] = []
    for lineno, obj in read_jsonl(path, skip_bad=skip_bad, errors=errors,
                                  allow_lone_surrogates=allow_lone_surrogates):
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
    """`row` as one JSON line ending in "\\n" (module docstring: what is escaped).

    Non-ASCII is kept as is, except U+0085, U+2028 and U+2029 (written as escapes, so no
    line splitter cuts the record) and strings UTF-8 cannot encode (a lone surrogate: the
    line is then written all-ASCII), so writing never fails.
    """
    line = json.dumps(row, ensure_ascii=False)
    if not line.isascii():
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:
            line = json.dumps(row)
        else:
            line = _LINE_BREAKS.sub(lambda m: _LINE_BREAK_ESCAPES[m.group()], line)
    return line + "\n"


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> int:
    """Write one JSON object per line (atomically: `atomic_output`); returns the count."""
    n = 0
    with atomic_output(path) as temporary, temporary.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json_line(row))
            n += 1
    return n


def append_jsonl(handle: IO[str], rows: Iterable[Any], fsync: bool = False) -> int:
    """Append rows to an open JSONL file in one write; returns the count.

    One write call per batch, flushed (and with `fsync` forced to disk), so a kill leaves
    at most one torn last line, which `iter_json_lines` reports and resuming readers drop.
    The handle must be opened with encoding="utf-8".
    """
    lines = [json_line(row) for row in rows]
    handle.write("".join(lines))
    handle.flush()
    if fsync:
        os.fsync(handle.fileno())
    return len(lines)
