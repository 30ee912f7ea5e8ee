"""Typed configuration of DeepResearch-v0, one help string per field.

Every `gym.make("DeepResearch-v0", **kwargs)` keyword is a field here; unknown keywords
fail loudly with the list of valid ones.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from venus_gym.protocol import PROMPT_STYLES


def _f(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass
class DeepResearchConfig:
    # --- world -----------------------------------------------------------------------
    world: Any = _f("synthetic", "Which world: 'synthetic' (embedded generated world), "
                    "'hotpotqa' (packaged HotpotQA dev subset), a directory saved by "
                    "World.save, a QA JSONL path, or a venus_gym.corpus.World object.")
    world_size: int = _f(2000, "Pages in the synthetic world (100..100,000).")
    world_seed: int = _f(0, "Seed of the synthetic world generator.")
    task_split: str = _f("all", "'all', 'train' or 'test': a deterministic split of the "
                         "world's tasks by task id (for held-out evaluation).")
    test_fraction: float = _f(0.2, "Share of tasks in the 'test' split.")
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
    # --- tools ---------------------------------------------------------------------------
    tools: tuple[str, ...] = _f(("search", "visit"), "Tools offered to the agent.")
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
            (self.task_split in ("all", "train", "test"),
             "task_split must be 'all', 'train' or 'test'"),
            (0.0 < self.test_fraction < 1.0, "test_fraction must be in (0, 1)"),
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
            (self.max_action_chars >= 1, "max_action_chars must be >= 1"),
            (self.max_observation_chars >= 1000, "max_observation_chars must be >= 1000 "
             "(the environment's own notices must fit)"),
            (self.prompt_style in PROMPT_STYLES,
             f"prompt_style must be one of {PROMPT_STYLES}, got {self.prompt_style!r}"),
            (set(self.tools) <= {"search", "visit"} and len(self.tools) > 0,
             "tools must be a non-empty subset of ('search', 'visit')"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"DeepResearch-v0 config: {msg}")

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
