"""Typed configuration of DeepResearch-v0, one help string per field.

Every `gym.make("DeepResearch-v0", **kwargs)` keyword is a field here; unknown keywords
fail loudly with the list of valid ones.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from venus_gym.protocol import PROMPT_STYLES
from venus_gym.tools.mcp_tools import is_mcp_spec, parse_mcp_spec


def _f(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass
class DeepResearchConfig:
    # --- world -----------------------------------------------------------------------
    world: Any = _f("synthetic", "Which world: 'synthetic' (embedded generated world), "
                    "'hotpotqa' (packaged HotpotQA dev subset), a directory saved by "
                    "World.save, a QA JSONL path, or a venus_gym.corpus.World object. With "
                    "backend='web' only its tasks are used: a QA JSONL path or saved world, "
                    "or the default for tasks given to reset(options={'question', 'answer'}).")
    world_size: int = _f(2000, "Pages in the synthetic world (100..100,000).")
    world_seed: int = _f(0, "Seed of the synthetic world generator.")
    task_split: str = _f("all", "'all', 'train', 'validation' or 'test': a deterministic "
                         "split of the world's tasks by a hash of the task id (docs/worlds.md, "
                         "'Splits').")
    test_fraction: float = _f(0.2, "Share of tasks in the 'test' split.")
    validation_fraction: float = _f(0.0, "Share of tasks in the 'validation' split, taken "
                                    "from train (0 = none; the test split never changes).")
    hops: tuple[int, ...] | None = _f(None, "Only sample tasks with these hop counts "
                                      "(None = all).")
    # --- episode budgets -----------------------------------------------------------------
    max_turns: int = _f(200, "Assistant turns before the episode is cut (DR-Venus: ~200).")
    max_context_tokens: int = _f(256_000, "Context budget in tokens (prompt + all turns), "
                                 "counted by `token_counter`.")
    max_turn_tokens: int = _f(8192, "Longest allowed single assistant turn, in tokens; a "
                              "longer turn is malformed.")
    forced_final_answer: bool = _f(True, "At a budget, replace the last observation by the "
                                   "DR-Venus 'answer now' notice and allow one final turn.")
    token_counter: Any = _f(None, "Callable str -> int used for budgets. None = a fast "
                            "approximation (4 characters per token); pass a tokenizer-based "
                            "counter for exact budgets.")
    # --- rewards -------------------------------------------------------------------------
    reward_metric: str = _f("em", "Outcome score of the answer: 'em' or 'f1' (SQuAD "
                            "normalisation, HotpotQA yes/no rule, max over gold answers).")
    format_penalty: float = _f(1.0, "Scale of the turn-level format penalty: a malformed "
                               "turn gets reward -format_penalty.")
    reward_fn: Any = _f(None, "Custom outcome reward replacing reward_metric: a callable, or "
                        "'package.module:function', called as fn(prediction, answers, task) "
                        "-> float with the answer text, the gold answers (list of str) and "
                        "the venus_gym.corpus.Task. None = reward_metric.")
    # --- tools ---------------------------------------------------------------------------
    tools: tuple[str, ...] = _f(("search", "visit"), "Built-in tools offered to the agent "
                                "(a subset of 'search', 'visit'; may be empty when "
                                "extra_tools offers some).")
    extra_tools: tuple = _f((), "Plug-in tools offered after `tools` (venus_gym.tools.plugin): "
                            "tool objects (name, schema, call(arguments) -> str), names of "
                            "registered plug-ins such as 'calculator', "
                            "'package.module:attribute' naming a tool, tool class or factory, "
                            "or {'mcp': URL | command line | {url or command, args, env, "
                            "cwd, headers_env, tools, prefix, timeout_s}} offering every "
                            "tool of an MCP server (venus_gym.tools.mcp_tools; the `mcp` "
                            "extra).")
    search_top_k: int = _f(10, "Hits returned per search query.")
    max_queries_per_call: int = _f(5, "Most queries one search call may carry.")
    max_urls_per_call: int = _f(5, "Most urls one visit call may carry.")
    search_backend: str = _f("local", "'local' (full-text index over the world's pages) or "
                             "'retrieval_server' (Search-R1 POST /retrieve at retrieval_url).")
    retrieval_url: str | None = _f(None, "Base url of a Search-R1-compatible retrieval server.")
    summarizer: str = _f("extractive", "'extractive' (goal-focused, offline, deterministic) "
                         "or 'openai' (an LLM over an OpenAI-compatible endpoint).")
    summarizer_url: str | None = _f(None, "Base url of the OpenAI-compatible endpoint "
                                    "(e.g. http://127.0.0.1:8000/v1).")
    summarizer_model: str = _f("default", "Model name sent to the summarizer endpoint.")
    tool_timeout_s: float | None = _f(None, "Per-call timeout for tool backends (None = no "
                                      "timeout thread; remote backends default to 30 s).")
    tool_retries: int = _f(2, "Retries (with exponential backoff) after a backend failure.")
    # --- the web (backend='web') -----------------------------------------------------------
    backend: str = _f("corpus", "'corpus' (search and read the world's own pages; see "
                      "search_backend) or 'web' (a search provider and a guarded page fetcher, "
                      "docs/web.md).")
    search_provider: str | None = _f(None, "backend='web': 'serper', 'searxng' or 'retrieve' "
                                     "(Search-R1 POST /retrieve).")
    search_url: str | None = _f(None, "backend='web': the provider's base url (SearXNG instance, "
                                "retrieval server; serper defaults to https://google.serper.dev).")
    search_api_key_env: str | None = _f(None, "Name of the environment variable holding the "
                                        "search API key (None: SERPER_API_KEY for serper, no key "
                                        "for the others). Keys are never config values.")
    search_min_interval_s: float = _f(0.0, "Least seconds between two search API requests "
                                      "(rate limit; 0 = none).")
    allow_hosts: tuple[str, ...] = _f((), "Hosts ('intranet.example') or host:port pairs "
                                      "('127.0.0.1:8080') the fetcher may open although they "
                                      "resolve to loopback/private addresses.")
    fetch_max_bytes: int = _f(2_000_000, "Most bytes read of one page; the rest is not "
                              "downloaded.")
    fetch_timeout_s: float = _f(20.0, "Total seconds for one page fetch, redirects included.")
    fetch_allow_pdf: bool = _f(False, "Also read application/pdf pages (needs pypdf).")
    cache_mode: str = _f("live", "backend='web' or MCP servers in extra_tools: 'live' (no "
                         "cache), 'record' (store every search, fetch, LLM summary and MCP "
                         "tool listing and call in cache_path, reuse stored ones) or "
                         "'replay' (stored answers only; a missing one raises CacheMissError).")
    cache_path: str | None = _f(None, "SQLite file of recorded tool answers (record/replay).")
    summarizer_api_key_env: str | None = _f(None, "Name of the environment variable holding "
                                            "the summarizer endpoint's API key (None: none).")
    summarizer_chunk_chars: int = _f(100_000, "summarizer='openai': pages longer than this are "
                                     "summarised in chunks of this many characters.")
    # --- presentation --------------------------------------------------------------------
    date: str = _f("2025-01-01", "Date written into the system prompt (fixed for "
                   "reproducibility).")
    prompt_style: str = _f("full", "System prompt: 'full' (DR-Venus's, with the tools' JSON "
                           "schemas) or 'compact' (the turn format and tools in ~80 words, for tiny "
                           "models trained from scratch; train and run with the same style).")
    reveal_answer_in_info: bool = _f(False, "Put the gold answers in `info` (for scripted "
                                     "agents and analysis; never show them to a policy).")
    max_action_chars: int = _f(1_000_000, "Action space: longest accepted turn in characters.")
    max_observation_chars: int = _f(4_000_000, "Observation space: longest observation in "
                                    "characters (longer tool output is cut).")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> DeepResearchConfig:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"DeepResearch-v0 got unknown argument(s) {unknown}; valid "
                            f"arguments: {sorted(names)}")
        cfg = cls(**kwargs)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        checks = [
            (self.max_turns >= 1, "max_turns must be >= 1"),
            (self.max_context_tokens >= 1, "max_context_tokens must be >= 1"),
            (self.max_turn_tokens >= 1, "max_turn_tokens must be >= 1"),
            (self.reward_metric in ("em", "f1"), "reward_metric must be 'em' or 'f1'"),
            (self.format_penalty >= 0, "format_penalty must be >= 0"),
            (self.task_split in ("all", "train", "validation", "test"),
             "task_split must be 'all', 'train', 'validation' or 'test'"),
            (0.0 < self.test_fraction < 1.0, "test_fraction must be in (0, 1)"),
            (0.0 <= self.validation_fraction < 1.0 - self.test_fraction,
             "validation_fraction must be >= 0 and leave tasks for train "
             "(test_fraction + validation_fraction < 1)"),
            (self.task_split != "validation" or self.validation_fraction > 0,
             "task_split='validation' needs validation_fraction > 0"),
            (self.search_top_k >= 1, "search_top_k must be >= 1"),
            (self.search_backend in ("local", "retrieval_server"),
             "search_backend must be 'local' or 'retrieval_server'"),
            (self.search_backend != "retrieval_server" or bool(self.retrieval_url),
             "search_backend='retrieval_server' needs retrieval_url"),
            (self.summarizer in ("extractive", "openai"),
             "summarizer must be 'extractive' or 'openai'"),
            (self.summarizer != "openai" or bool(self.summarizer_url),
             "summarizer='openai' needs summarizer_url"),
            (self.tool_retries >= 0, "tool_retries must be >= 0"),
            (self.backend in ("corpus", "web"), "backend must be 'corpus' or 'web'"),
            (self.backend != "web" or self.search_provider in ("serper", "searxng", "retrieve"),
             f"backend='web' needs search_provider 'serper', 'searxng' or 'retrieve', got "
             f"{self.search_provider!r}"),
            (self.backend != "web" or self.search_provider == "serper" or bool(self.search_url),
             f"search_provider={self.search_provider!r} needs search_url (its base url)"),
            (self.cache_mode in ("live", "record", "replay"),
             "cache_mode must be 'live', 'record' or 'replay'"),
            (self.cache_mode == "live" or self.backend == "web" or self._mcp_servers(),
             "cache_mode 'record'/'replay' applies to backend='web' and to MCP servers in "
             "extra_tools only"),
            (self.cache_mode == "live" or bool(self.cache_path),
             f"cache_mode={self.cache_mode!r} needs cache_path (an SQLite file)"),
            (isinstance(self.allow_hosts, tuple | list)
             and all(isinstance(h, str) for h in self.allow_hosts),
             "allow_hosts must be a list of 'host' or 'host:port' strings"),
            (self.fetch_max_bytes >= 1, "fetch_max_bytes must be >= 1"),
            (self.fetch_timeout_s > 0, "fetch_timeout_s must be > 0"),
            (self.search_min_interval_s >= 0, "search_min_interval_s must be >= 0"),
            (self.summarizer_chunk_chars >= 1000, "summarizer_chunk_chars must be >= 1000"),
            (self.max_action_chars >= 1, "max_action_chars must be >= 1"),
            (self.max_observation_chars >= 1000, "max_observation_chars must be >= 1000 "
             "(the environment's own notices must fit)"),
            (self.prompt_style in PROMPT_STYLES,
             f"prompt_style must be one of {PROMPT_STYLES}, got {self.prompt_style!r}"),
            (set(self.tools) <= {"search", "visit"}
             and len(self.tools) + len(self.extra_tools) > 0,
             "tools must be a non-empty subset of ('search', 'visit') (or empty with "
             "extra_tools)"),
            (isinstance(self.extra_tools, tuple | list),
             "extra_tools must be a list of tools, plug-in names or 'module:attribute' specs"),
            (self.reward_fn is None or callable(self.reward_fn) or (
                isinstance(self.reward_fn, str) and ":" in self.reward_fn),
             f"reward_fn must be a callable or 'package.module:function', got "
             f"{self.reward_fn!r}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"DeepResearch-v0 config: {msg}")
        for index, spec in enumerate(self.extra_tools):
            if isinstance(spec, dict):
                try:
                    parse_mcp_spec(spec)
                except ValueError as error:
                    raise ValueError(f"DeepResearch-v0 config: extra_tools[{index}]: "
                                     f"{error}") from None

    def _mcp_servers(self) -> bool:
        return isinstance(self.extra_tools, tuple | list) and any(
            map(is_mcp_spec, self.extra_tools))

    def to_dict(self) -> dict[str, Any]:
        """Loggable form (objects replaced by their repr)."""
        out = {}
        for k, v in asdict(self).items():
            out[k] = v if isinstance(v, str | int | float | bool | tuple | list | type(None)) \
                else repr(v)
        return out

    @classmethod
    def help(cls) -> str:
        lines = []
        for f in fields(cls):
            default = f.default if f.default is not MISSING else "(required)"
            lines.append(f"{f.name} = {default!r}\n    {f.metadata.get('help', '')}")
        return "\n".join(lines)
