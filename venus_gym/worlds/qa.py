"""Worlds from real multi-hop QA data that ships its own paragraphs.

Input is JSONL in the schema of the bundled subsets (HotpotQA, MuSiQue, 2WikiMultihopQA;
see ``venus_gym/data/README.md``), one question per line:

    {"id", "question", "answers": [gold, alias...],
     "paragraphs": [{"title", "text", "is_supporting"}...], "source", "meta"}

The corpus is every paragraph of every question, deduplicated by (title, text). Each page
gets a Wikipedia-style url built from its title; when different texts share a title (the
same article in two dataset versions, or titles such as "A B" and "A_B") the later ones
get ``#2``, ``#3``... in file order, so urls are unique and stable. A task's ``gold_urls`` are its supporting paragraphs: in the
order of MuSiQue's ``question_decomposition`` or 2Wiki's ``supporting_facts`` when the
record has them, else in paragraph order. Its ``gold_path`` has one step per supporting
paragraph for the oracle agent; a step's ``value`` is the intermediate answer where the
data gives one (MuSiQue), the final answer on a paragraph that contains it, and "" where
nothing checkable is known.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from venus_gym.corpus import Corpus, DataFormatError, Page, Task, World, read_jsonl
from venus_gym.worlds.oracle import mentions

WIKI_PREFIX = "https://en.wikipedia.org/wiki/"
SNIPPET_CHARS = 200
# Characters that would change a url's meaning (fragment, query, escape) or break it.
# Parentheses stay, as in Wikipedia's own urls ("Shirley_Temple_(film)").
_URL_ESCAPES = str.maketrans({"%": "%25", "#": "%23", "?": "%3F", '"': "%22", "<": "%3C",
                              ">": "%3E", "\\": "%5C", "[": "%5B", "]": "%5D",
                              # control characters: observations would show them as U+FFFD
                              **{chr(c): f"%{c:02X}" for c in (*range(0x20), 0x7F)},
                              **{chr(c): "%C2%" + f"{c:02X}" for c in range(0x80, 0xA0)}})
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")
_STEP_REFERENCE = re.compile(r"#(\d+)")


def title_url(title: str) -> str:
    """The Wikipedia-style url of a title: spaces -> underscores, unsafe characters escaped."""
    return WIKI_PREFIX + title.strip().replace(" ", "_").translate(_URL_ESCAPES)


def make_snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
    """The paragraph's first sentence, cut at a word boundary if longer than `limit`."""
    text = " ".join(text.split())
    first = _SENTENCE_END.split(text, maxsplit=1)[0]
    if len(first) <= limit:
        return first
    cut = first[:limit].rsplit(" ", 1)[0]
    return cut + " ..."


def load_qa_world(path: str | Path, name: str | None = None, skip_bad: bool = False) -> World:
    """Build a World from a QA JSONL file (schema in the module docstring).

    Args:
        path: the JSONL file.
        name: the world's name (default: the file name without extension).
        skip_bad: skip malformed lines instead of raising; each skipped line is listed,
            as "file:line: reason", in ``world.meta["skipped"]``.

    Lines are read by `venus_gym.corpus.read_jsonl`: UTF-8 (or UTF-16 with a byte-order
    mark), decoded line by line; an undecodable line, invalid JSON, nesting deeper than
    `MAX_JSON_DEPTH`, a lone surrogate, a field of the wrong type (answers must be
    non-blank strings: nothing is converted) and a repeated id are all malformed lines.
    Every non-blank line is either a task or listed in ``meta["skipped"]``.

    Raises:
        DataFormatError: a malformed line (message names file and line), unless skip_bad.
        FileNotFoundError: no such file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"QA file not found: {path}")
    skipped: list[str] = []
    builder = _CorpusBuilder()
    tasks: list[Task] = []
    first_line_of_id: dict[str, int] = {}
    for lineno, record in read_jsonl(path, skip_bad=skip_bad, errors=skipped):
        try:
            # Environments select tasks by id, so ids must be unique; a record without one
            # is named after its file and line.
            raw_id = record.get("id")
            if raw_id is not None and (isinstance(raw_id, bool)
                                       or not isinstance(raw_id, str | int)):
                raise ValueError(f"'id' must be a string or an integer, got "
                                 f"{type(raw_id).__name__}")
            task_id = str(raw_id) if raw_id not in (None, "") else f"{path.stem}:{lineno}"
            if task_id in first_line_of_id:
                raise ValueError(f"duplicate id {task_id!r} (first on line "
                                 f"{first_line_of_id[task_id]})")
            tasks.append(_task_from_record({**record, "id": task_id}, builder))
            first_line_of_id[task_id] = lineno
        except (ValueError, TypeError, KeyError, IndexError, RecursionError) as e:
            message = f"{path}:{lineno}: {e}"
            if not skip_bad:
                raise DataFormatError(message) from None
            skipped.append(message)
    meta: dict[str, Any] = {"generator": "venus_gym.worlds.qa", "source_file": path.name,
                            "skipped": skipped}
    return World(name=name or path.stem, corpus=Corpus(builder.pages), tasks=tasks, meta=meta)


class _CorpusBuilder:
    """Deduplicates paragraphs into pages and hands out their urls."""

    def __init__(self) -> None:
        self.pages: list[Page] = []
        self._url_of: dict[tuple[str, str], str] = {}
        self._texts_per_url: dict[str, int] = {}

    def add(self, title: str, text: str) -> str:
        key = (title, text)
        url = self._url_of.get(key)
        if url is None:
            # Counted per url, not per title: "A B" and "A_B" (or " A") share one url.
            base = title_url(title)
            n = self._texts_per_url.get(base, 0) + 1
            self._texts_per_url[base] = n
            url = base + (f"#{n}" if n > 1 else "")
            self._url_of[key] = url
            self.pages.append(Page(url=url, title=title, text=text, snippet=make_snippet(text)))
        return url


def _task_from_record(record: dict[str, Any], builder: _CorpusBuilder) -> Task:
    question = record.get("question")
    if not isinstance(question, str) or not question.strip():
        raise ValueError("'question' must be a non-empty string")
    answers = record.get("answers")
    if not isinstance(answers, list) or not answers or \
            not all(isinstance(a, str) and a.strip() for a in answers):
        raise ValueError("'answers' must be a non-empty list of non-empty strings")
    paragraphs = record.get("paragraphs")
    if not isinstance(paragraphs, list) or not paragraphs:
        raise ValueError("'paragraphs' must be a non-empty list")
    meta = record.get("meta")
    meta = {} if meta is None else meta
    if not isinstance(meta, dict):
        raise ValueError("'meta' must be an object")
    source = record.get("source")
    source = "" if source is None else source
    if not isinstance(source, str):
        raise ValueError("'source' must be a string")

    urls, titles, texts, supporting = [], [], [], []
    for i, p in enumerate(paragraphs):
        if not isinstance(p, dict) or not isinstance(p.get("title"), str) \
                or not isinstance(p.get("text"), str):
            raise ValueError(f"paragraph {i} must be an object with string 'title' and 'text'")
        flag = p.get("is_supporting", False)
        if not isinstance(flag, bool):
            raise ValueError(f"paragraph {i}: 'is_supporting' must be true or false")
        urls.append(builder.add(p["title"], p["text"]))
        titles.append(p["title"])
        texts.append(p["text"])
        if flag:
            supporting.append(i)

    steps = _ordered_steps(supporting, titles, meta)
    gold_path = []
    for index, goal, value in steps:
        if not value and _mentions(texts[index], answers):
            value = answers[0]
        gold_path.append({"entity": titles[index], "url": urls[index],
                          "relation": "supporting_paragraph",
                          "goal": goal or f"Find information relevant to the question: "
                                          f"{question.strip()}",
                          "value": value})
    return Task(id=str(record.get("id", "")), question=question.strip(), answers=tuple(answers),
                hops=len(gold_path), gold_urls=tuple(step["url"] for step in gold_path),
                gold_path=tuple(gold_path), source=source, meta=meta)


def _ordered_steps(supporting: list[int], titles: list[str], meta: dict[str, Any]
                   ) -> list[tuple[int, str, str]]:
    """(paragraph index, visit goal or "", known value or "") per supporting paragraph,
    in reading order where the record tells it."""
    steps: list[tuple[int, str, str]] = []
    decomposition = meta.get("question_decomposition")
    if isinstance(decomposition, list):  # MuSiQue: sub-questions with their own answers
        answers_so_far: list[str] = []
        for sub in decomposition:
            if not isinstance(sub, dict):
                continue
            index, answer = sub.get("paragraph_support_idx"), str(sub.get("answer", ""))
            goal = _goal_from_subquestion(str(sub.get("question", "")), answers_so_far)
            answers_so_far.append(answer)
            if isinstance(index, int) and index in supporting \
                    and index not in (s[0] for s in steps):
                steps.append((index, goal, answer))
    facts = meta.get("supporting_facts")
    if isinstance(facts, list):  # 2Wiki: [title, sentence id] in reasoning order
        for fact in facts:
            if isinstance(fact, list) and fact and fact[0] in titles:
                index = next((i for i in supporting if titles[i] == fact[0]), None)
                if index is not None and index not in (s[0] for s in steps):
                    steps.append((index, "", ""))
    for index in supporting:  # whatever the metadata did not order, in paragraph order
        if index not in (s[0] for s in steps):
            steps.append((index, "", ""))
    return steps


def _goal_from_subquestion(sub_question: str, earlier_answers: list[str]) -> str:
    """MuSiQue sub-questions refer to earlier answers as #1, #2 and some are written as
    "subject >> relation"; turn them into a plain visit goal."""
    def earlier(match: re.Match) -> str:
        k = int(match.group(1)) - 1
        return earlier_answers[k] if 0 <= k < len(earlier_answers) else match.group(0)

    text = _STEP_REFERENCE.sub(earlier, sub_question).strip()
    if not text:
        return ""
    if ">>" in text:
        subject, _, relation = text.partition(">>")
        return f"Find the {relation.strip()} of {subject.strip()}"
    return f"Find out: {text}"


def _mentions(text: str, answers: list[str]) -> bool:
    # The oracle's own test, so a value recorded here is one the oracle can confirm.
    return any(mentions(text, a) for a in answers)
