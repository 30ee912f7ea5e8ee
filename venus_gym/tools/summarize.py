"""Visit summarizers: turn one page and the agent's goal into evidence and a summary.

DR-Venus's `visit` hands the page (truncated to ~95K tokens) and the goal to a separate
summarizer LLM (Qwen3-30B-A3B) that answers with JSON {"rational", "evidence", "summary"}.

- `OpenAISummarizer` does exactly that against any OpenAI-compatible endpoint (vLLM,
  SGLang, a hosted API), with a character budget standing in for the token budget.
- `ChunkedSummarizer` splits a long page (a fetched web page) into chunks that fit the
  summariser's budget, summarises each and joins the parts, instead of DR-Venus's cut at
  the budget, which would lose everything past it.
- `ExtractiveSummarizer` is our default and a deliberate deviation: a 30B model per visit
  would make the environment GPU-bound and non-deterministic, which defeats a 2-core
  offline training loop and reproducible episodes. It picks the page's sentences that best
  match the goal (in page order) as evidence, in well under a millisecond. Pages of the
  embedded world are short and factual, so the answer-bearing sentence is what an LLM
  would quote too; what it cannot do is paraphrase or reason across sentences.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from venus_gym.corpus import Page

from .base import PageSummary, ToolBackendError
from .http import chat_completion_with_usage

# --- extractive ------------------------------------------------------------------------------

_WORD = re.compile(r"[^\W_]+")
# Candidate sentence ends: terminal punctuation, optional closing quotes/brackets, space.
_BOUNDARY = re.compile(r"[.!?]+[\"'\u201d\u2019)\]]*\s+")
_NEXT_STARTS_SENTENCE = re.compile(r"[\"'\u201c\u2018(\[]?[A-Z0-9\u00c0-\u024f]")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st jr sr inc ltd co corp vs etc no nos fig gen col lt sgt capt cmdr "
    "adm gov sen rep rev mt ft ave blvd dept univ est approx".split())
# Function words plus the meta-words goals are phrased with ("find information about").
_STOPWORDS = frozenset("""
a an the and or but nor of in on at to for from by with within without into onto upon
about above after against along among around as before behind below beneath beside
between beyond during except inside near off out outside over since through throughout
till toward under until via
is are was were be been being am do does did done doing have has had having will would
shall should can could may might must
i me my we our you your he him his she her it its they them their this that these those
there here what which who whom whose when where why how whether if then than so such
any all each every both either neither some many much more most other another same own
not no only also just very too again further once
find finding found information info details detail page webpage website article text
regarding regard related relevant specific specifically mentioned mention identify
determine extract locate look learn know get check verify confirm tell give provide
please user goal content key fact facts data
""".split())


def _stem(word: str) -> str:
    """Light stemming for goal/page matching: strip one inflection (-ies/-ied, -ing, -ed,
    plural -s), then a final e/y, then keep a 5-character prefix.

    Crude next to Porter, but it joins what goals and pages typically differ by:
    open/opened/opening, direct-ed/-or/-ing, found-ed/-er/-ation, locat-ed/-ion, live/lived,
    study/studies/studied, city/cities.
    """
    if len(word) > 4 and word.endswith(("ies", "ied")):
        word = word[:-3] + "y"
    elif len(word) > 5 and word.endswith("ing"):
        word = word[:-3]
    elif len(word) > 4 and word.endswith("ed"):
        word = word[:-2]
    elif len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    if len(word) > 2 and word[-1] in "ey":
        word = word[:-1]
    return word[:5]


def _content_words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in _STOPWORDS]


def split_sentences(text: str, max_chars: int = 1000) -> list[str]:
    """Split text into sentences; abbreviations and initials ("Dr.", "J. R. R.") do not
    end one. Lines are split first (page paragraphs, list items). Pieces longer than
    `max_chars` (tables, run-on text without periods) are cut so evidence stays bounded."""
    sentences: list[str] = []
    for line in text.splitlines():
        start = 0
        for m in _BOUNDARY.finditer(line):
            end = m.end()
            if not _NEXT_STARTS_SENTENCE.match(line, end):
                continue
            before = line[start: m.start()].rsplit(None, 1)
            last_word = before[-1].lower().strip("\"'([") if before else ""
            # "J." (an initial) or "Dr." do not end a sentence; "I." would, but is rare.
            if len(last_word) == 1 or last_word in _ABBREVIATIONS or (
                    "." in last_word and len(last_word) <= 5):  # u.s, e.g, ph.d
                continue
            sentences.append(line[start: end].strip())
            start = end
        sentences.append(line[start:].strip())
    out = []
    for s in sentences:
        while len(s) > max_chars:
            cut = s.rfind(" ", max_chars // 2, max_chars)
            cut = cut if cut > 0 else max_chars
            out.append(s[:cut].strip())
            s = s[cut:].strip()
        if s:
            out.append(s)
    return out


class ExtractiveSummarizer:
    """Goal-focused extractive summaries: deterministic, offline, well under 1 ms a page.

    Each sentence scores the sum of the weights of the distinct goal terms it contains;
    a term's weight is its rarity within the page, log(1 + n_sentences / n_containing),
    so the page's own subject (named in most sentences) counts little and the specific
    asked-about word ("born", "director") counts most. The best `max_evidence_sentences`
    (ties: earlier first) become the evidence, in page order; the best
    `summary_sentences` of them form the summary.
    """

    def __init__(self, max_evidence_sentences: int = 3, summary_sentences: int = 1,
                 max_sentence_chars: int = 1000):
        if max_evidence_sentences < 1 or summary_sentences < 1:
            raise ValueError("max_evidence_sentences and summary_sentences must be >= 1")
        self.max_evidence_sentences = max_evidence_sentences
        self.summary_sentences = min(summary_sentences, max_evidence_sentences)
        self.max_sentence_chars = max_sentence_chars

    def summarize(self, page: Page, goal: str) -> PageSummary:
        sentences = split_sentences(page.text, self.max_sentence_chars)
        if not sentences:
            return PageSummary(rational="The page has no text.", evidence="",
                               summary="The page is empty, so no information is available.")
        # stem -> the goal's own spelling, for the rational
        goal_terms: dict[str, str] = {}
        for word in _content_words(goal):
            goal_terms.setdefault(_stem(word), word)
        sentence_terms = [{_stem(w) for w in _content_words(s)} & goal_terms.keys()
                          for s in sentences]
        n = len(sentences)
        counts: dict[str, int] = {}
        for terms in sentence_terms:
            for t in terms:
                counts[t] = counts.get(t, 0) + 1
        weights = {t: math.log1p(n / c) for t, c in counts.items()}
        # fsum: exactly rounded whatever the order. A plain sum over a set of strings adds
        # in hash order, which changes per process (PYTHONHASHSEED), so equal scores of
        # three or more terms could differ in the last bit and break ties differently from
        # run to run (seen: 5 of 900 oracle episodes differed between two processes).
        scores = [math.fsum(weights[t] for t in terms) for terms in sentence_terms]

        ranked = sorted((i for i in range(n) if scores[i] > 0), key=lambda i: (-scores[i], i))
        chosen = ranked[: self.max_evidence_sentences]
        if not chosen:
            evidence = "\n".join(sentences[: self.max_evidence_sentences])
            if goal_terms:
                listed = ", ".join(goal_terms.values())
                rational = f"None of the goal terms ({listed}) occur in the page."
            else:
                rational = "The goal has no content words to look for."
            return PageSummary(
                rational=rational, evidence=evidence,
                summary=f"No information specific to the goal was found on the page "
                        f"'{page.title}'; the evidence shows its opening sentences.")
        best = sorted(chosen[: self.summary_sentences])
        matched = [goal_terms[t] for t in goal_terms if t in counts]
        rational = (f"Selected {len(chosen)} of {n} sentences of '{page.title}' that mention "
                    f"the goal terms: {', '.join(matched)}.")
        return PageSummary(rational=rational,
                           evidence="\n".join(sentences[i] for i in sorted(chosen)),
                           summary=" ".join(sentences[i] for i in best))


# --- LLM over an OpenAI-compatible endpoint -------------------------------------------------

_PROMPT = """You are reading one web page on behalf of a research agent. Extract what the \
page says that serves the agent's goal.

## Web page
{page}

## Goal
{goal}

## What to return
- "rational": which parts of the page bear on the goal, and why.
- "evidence": the relevant passages copied from the page word for word, with enough \
surrounding context to be understood on their own.
- "summary": a concise statement of what the page tells about the goal, drawn only from the \
evidence. If the page does not address the goal, say so plainly.

Answer with a single JSON object with exactly these keys and nothing else:
{{"rational": "...", "evidence": "...", "summary": "..."}}"""

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S | re.I)
_THINK = re.compile(r"<think>.*?</think>", re.S)


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):  # models often return evidence as a list of quotes
        return "\n".join(_as_text(v) for v in value)
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def parse_summary_reply(reply: str) -> PageSummary | None:
    """The {"rational","evidence","summary"} object in an LLM reply, or None.

    Tolerates reasoning blocks (<think>...</think>), ```json fences and prose around the
    object; the first JSON object carrying "evidence" or "summary" wins.
    """
    reply = _THINK.sub("", reply)
    if "</think>" in reply:  # an opening tag swallowed by the chat template
        reply = reply.rsplit("</think>", 1)[1]
    decoder = json.JSONDecoder()
    for candidate in [*_FENCE.findall(reply), reply]:
        start = candidate.find("{")
        while start != -1:
            try:
                obj, _ = decoder.raw_decode(candidate, start)
            except ValueError:
                obj = None
            if isinstance(obj, dict) and ("evidence" in obj or "summary" in obj):
                return PageSummary(rational=_as_text(obj.get("rational")),
                                   evidence=_as_text(obj.get("evidence")),
                                   summary=_as_text(obj.get("summary")))
            start = candidate.find("{", start + 1)
    return None


class OpenAISummarizer:
    """DR-Venus's LLM summarizer over any OpenAI-compatible `/chat/completions` endpoint.

    base_url:       e.g. "http://127.0.0.1:8000/v1" (the path `/chat/completions` is added).
    model:          model name sent with each request.
    api_key:        sent as a Bearer token when given (local servers usually need none).
    timeout_s:      deadline of one request, the whole reply included (not per read).
    max_page_chars: page budget; DR-Venus truncates to ~95K tokens, ~4 characters each.
    extra_body:     merged into the request (temperature, max_tokens, chat_template_kwargs...).
    on_usage:       called with (prompt_tokens, completion_tokens) of every reply (cost
                    accounting); zeros where the server reports no usage.

    Uses urllib only, so the core library has no HTTP dependency. Every failure (HTTP error,
    timeout, reply without the JSON object) raises ToolBackendError.
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None,
                 timeout_s: float = 30.0, max_page_chars: int = 380_000,
                 extra_body: Mapping[str, Any] | None = None,
                 on_usage: Callable[[int, int], None] | None = None):
        if not base_url:
            raise ValueError("OpenAISummarizer needs a base_url, e.g. http://127.0.0.1:8000/v1")
        self.base_url = base_url
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_page_chars = max_page_chars
        self.extra_body = dict(extra_body or {})
        self.on_usage = on_usage

    def __repr__(self) -> str:  # the api key stays out of logs
        return f"OpenAISummarizer(base_url={self.base_url!r}, model={self.model!r})"

    def prompt(self, page: Page, goal: str) -> str:
        text = page.text
        if len(text) > self.max_page_chars:
            text = text[: self.max_page_chars] + "\n[... page truncated ...]"
        return _PROMPT.format(page=f"Title: {page.title}\nURL: {page.url}\n\n{text}", goal=goal)

    def summarize(self, page: Page, goal: str) -> PageSummary:
        try:
            content, usage = chat_completion_with_usage(
                self.base_url, self.model,
                [{"role": "user", "content": self.prompt(page, goal)}],
                timeout_s=self.timeout_s, what="summarizer", api_key=self.api_key,
                extra_body=self.extra_body)
        except ToolBackendError as e:
            if self.api_key and self.api_key in str(e):  # a server echoing the header
                raise ToolBackendError(str(e).replace(self.api_key, "***")) from None
            raise
        if self.on_usage is not None:
            self.on_usage(usage["prompt_tokens"], usage["completion_tokens"])
        summary = parse_summary_reply(content)
        if summary is None:
            raise ToolBackendError(f"summarizer reply has no JSON object with evidence/"
                                   f"summary: {content[:200]!r}")
        return summary


# --- long pages ------------------------------------------------------------------------------

def chunk_text(text: str, chunk_chars: int) -> list[str]:
    """`text` cut into pieces of at most `chunk_chars` characters, at line ends where it can,
    else at spaces, else anywhere."""
    if chunk_chars < 1:
        raise ValueError("chunk_chars must be >= 1")
    chunks: list[str] = []
    current = ""
    for line in text.splitlines(keepends=True):
        while len(line) > chunk_chars:  # a line longer than a chunk: cut it at a space
            cut = line.rfind(" ", chunk_chars // 2, chunk_chars)
            cut = cut if cut > 0 else chunk_chars
            if current:
                chunks.append(current)
                current = ""
            chunks.append(line[:cut])
            line = line[cut:]
        if len(current) + len(line) > chunk_chars:
            chunks.append(current)
            current = ""
        current += line
    if current or not chunks:
        chunks.append(current)
    return [c.strip() for c in chunks if c.strip()] or [""]


class ChunkedSummarizer:
    """Summarises a long page chunk by chunk with `summarizer` and joins the parts.

    chunk_chars: largest chunk handed to the summarizer (pages up to it go through whole).
    max_chunks:  most chunks summarised; the rest of a longer page is not read (a bound
                 on summariser calls per visit), and the rational says so.

    Parts whose evidence is empty are dropped from the evidence; summaries are joined in
    page order.
    """

    def __init__(self, summarizer: Any, chunk_chars: int = 100_000, max_chunks: int = 8):
        if chunk_chars < 1000 or max_chunks < 1:
            raise ValueError("chunk_chars must be >= 1000 and max_chunks >= 1")
        self.summarizer = summarizer
        self.chunk_chars = chunk_chars
        self.max_chunks = max_chunks

    def summarize(self, page: Page, goal: str) -> PageSummary:
        if len(page.text) <= self.chunk_chars:
            return self.summarizer.summarize(page, goal)
        chunks = chunk_text(page.text, self.chunk_chars)
        read = chunks[: self.max_chunks]
        parts = [self.summarizer.summarize(replace(page, text=c), goal) for c in read]
        rational = " ".join(f"[part {i}/{len(chunks)}] {p.rational}".strip()
                            for i, p in enumerate(parts, start=1))
        if len(chunks) > len(read):
            rational += f" Only the first {len(read)} of {len(chunks)} parts were read."
        return PageSummary(
            rational=rational,
            evidence="\n".join(p.evidence for p in parts if p.evidence.strip()),
            summary=" ".join(p.summary for p in parts if p.summary.strip()))
