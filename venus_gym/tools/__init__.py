"""Tools the agent calls, `search(query: list[str])` and `visit(url: list[str], goal: str)`,
and the backends behind them. The environment talks to a `Toolbox` only."""

from .base import (
    CacheMissError,
    ChainedPageStore,
    CorpusPageStore,
    PageStore,
    PageSummary,
    SearchBackend,
    SearchHit,
    Summarizer,
    ToolBackendError,
    default_snippet,
)
from .index import LocalSearchIndex
from .retrieval_server import RetrievalServerBackend, serve_index
from .summarize import ExtractiveSummarizer, OpenAISummarizer, parse_summary_reply, split_sentences
from .toolbox import (
    SEPARATOR,
    VISIT_FAILED_EVIDENCE,
    VISIT_FAILED_SUMMARY,
    Toolbox,
    ToolOutcome,
    render_hits,
    render_visit,
)

__all__ = [
    "CacheMissError",
    "SEPARATOR",
    "VISIT_FAILED_EVIDENCE",
    "VISIT_FAILED_SUMMARY",
    "ChainedPageStore",
    "CorpusPageStore",
    "ExtractiveSummarizer",
    "LocalSearchIndex",
    "OpenAISummarizer",
    "PageStore",
    "PageSummary",
    "RetrievalServerBackend",
    "SearchBackend",
    "SearchHit",
    "Summarizer",
    "ToolBackendError",
    "ToolOutcome",
    "Toolbox",
    "default_snippet",
    "parse_summary_reply",
    "render_hits",
    "render_visit",
    "serve_index",
    "split_sentences",
]
