"""Tools the agent calls, `search(query: list[str])` and `visit(url: list[str], goal: str)`,
and the backends behind them; plug-in tools (`plugin.Tool`, e.g. the calculator, and every
tool of an MCP server, `mcp_tools`) beside them. The environment talks to a `Toolbox` and
to its plug-ins."""

from .base import (
    CacheError,
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
from .calculator import CalculatorTool, calculate
from .index import LocalSearchIndex
from .mcp_tools import MCPServer, MCPTool, close_mcp_connections, mcp_tools
from .plugin import Tool, load_object, register_tool, registered_tools, resolve_tool, run_tool
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
    "CalculatorTool",
    "MCPServer",
    "MCPTool",
    "close_mcp_connections",
    "mcp_tools",
    "Tool",
    "calculate",
    "load_object",
    "register_tool",
    "registered_tools",
    "resolve_tool",
    "run_tool",
    "CacheError",
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
