"""DeepResearch-v0: a text environment for search / visit / answer agents.

Where we deviate from DR-Venus and why:
- The default world is an embedded, generated research world with a local full-text index
  and an extractive visit summarizer, so the environment runs offline on a laptop. The
  same tool interface serves real corpora, a Search-R1 retrieval server and an LLM
  summarizer over any OpenAI-compatible endpoint.
- Budgets count tokens with a pluggable counter (default: 4 characters per token), since
  the environment itself must not depend on a tokenizer.
- Information gain needs the policy, so the trainer computes it; `step` returns only the
  outcome score and the turn-level format penalty.
"""

from __future__ import annotations

import copy
import hashlib
import math
from typing import Any

import gymnasium as gym

from venus_gym.corpus import Task
from venus_gym.protocol import (
    FORCED_FINAL_NOTICE,
    ParsedTurn,
    format_error_notice,
    format_tool_response,
    parse_turn,
    render_system_prompt,
    sanitize_observation,
    sanitize_value,
)
from venus_gym.scoring import score_answer
from venus_gym.tools.mcp_listing import SECTION_SHARE
from venus_gym.tools.mcp_tools import ToolSection, is_mcp_spec, mcp_tools
from venus_gym.tools.plugin import load_object, release_tool, resolve_tool, run_tool

from .config import DeepResearchConfig
from .resources import build_toolbox, select_tasks, world_and_index
from .spaces import UnicodeText


def approx_token_count(text: str) -> int:
    """Fast tokenizer-free estimate: about 4 characters per token for English text."""
    return (len(text) + 3) // 4


class DeepResearchEnv(gym.Env[str, str]):
    """A deep-research episode: answer one question by searching and reading pages.

    ## Description
    On reset the environment picks a task (a multi-hop question) from its world and
    returns the question. Each step takes one assistant turn in the DR-Venus format:
    reasoning in `<think>...</think>`, then exactly one tool call
    `<tool_call>{"name": "search"|"visit", "arguments": {...}}</tool_call>` or a final
    `<answer>...</answer>`. Tool calls run against the world's search index and page
    store and their output comes back as the next observation. The system prompt with
    the tool schemas is `env.unwrapped.system_prompt` (also in the reset `info`).

    ## Action Space
    `UnicodeText(max_action_chars)`: any Unicode string up to `max_action_chars`
    characters (default 1,000,000). Parsing is strict and total: malformed text is a
    malformed turn, never an exception.

    ## Observation Space
    `UnicodeText(max_observation_chars)` (default 4,000,000 characters):
    - on reset: the question;
    - after a tool turn: `<tool_response>\\n{search results or page evidence}\\n</tool_response>`;
    - after a malformed turn: a `<tool_response>` notice saying what was wrong;
    - at a turn/context budget (with `forced_final_answer`): the "answer now" notice;
    - after the episode ends: the empty string.

    ## Rewards
    - Answer turn: the outcome score of the answer against all gold answers,
      `reward_metric` 'em' (1/0) or 'f1' (SQuAD normalisation, HotpotQA yes/no rule), or
      with `reward_fn` what that callable returns for (prediction, gold answers, task).
    - Malformed turn: `-format_penalty` (turn-level format penalty, default 1.0); a
      malformed forced final turn likewise.
    - Valid tool turn: 0 (information gain is computed by the trainer, which has the policy).

    ## Starting State
    A task drawn uniformly from the selected split with the env's seeded RNG, or the one
    named by `options={"task_id": ...}` / `options={"task_index": ...}` in `reset`, or a
    new one given as `options={"question": ..., "answer": ... (a string or a list)}` (the
    way to pose questions to a web environment without a task file).

    ## The web (backend="web")
    `search` asks a provider (Serper, SearXNG or a Search-R1 `/retrieve` server), `visit`
    reads pages through a guarded fetcher (no loopback/private/link-local addresses unless
    `allow_hosts` names them), and with `cache_mode` 'record'/'replay' every search, fetch
    and LLM summary is stored in / served from an SQLite file (docs/web.md). Tool failures
    are observations as always, with one exception: in replay mode a request the cache
    lacks raises `venus_gym.tools.CacheMissError` (naming the request, its key and the
    file), since an invented observation would silently change a replayed episode.
    `info["cost"]` and `env.unwrapped.cost()` give the run's totals (API calls, bytes,
    summarizer tokens, cache hits), shared by environments that share a toolbox.

    ## Episode End
    - Termination: a well-formed answer turn.
    - Truncation: `max_turns` turns or `max_context_tokens` used. With
      `forced_final_answer` (default) the observation at the budget is replaced by the
      "provide the final answer now" notice and one more turn is allowed: a well-formed
      answer then terminates (and is scored), anything else truncates with the penalty.

    ## Info
    `turn`, `kind` (search / visit / answer / invalid), `valid`, `reason`, `intent`,
    `tool_calls` (name, arguments, ok, error, urls), `score` and `answer` on answer turns,
    `tokens_used`, `forced_final`, `budget` (None, "turns", "context" or
    "final_turn_wasted": which limit this step hit), `task_id`, `hops`, and `raw_action`,
    the action exactly as given; `gold_answers` only with `reveal_answer_in_info=True`. A tool call on the turn that hits `max_turns`
    is not run (its result would be replaced by the notice): its `tool_calls` entry says so.
    `env.unwrapped.judge_turn(action)` returns the validity and reason `step` would give the
    turn, without taking the step (for inference loops that retry malformed turns).

    Observations are sanitised in one place (`venus_gym.protocol.sanitize_observation`,
    applied to the question, every tool result and every malformed-turn notice): control
    characters (C0 but tab and newline, DEL, C1 U+0080-U+009F) and lone surrogates become
    U+FFFD, carriage returns become newlines, and chat control tokens such as `<|im_end|>`
    and stray `<tool_response>` tags in tool output or echoed model strings (queries,
    urls, goals) are neutralised, so a rollout can always tokenise them and no terminal
    escape reaches a log or the training text. The toolbox searches a query holding such
    characters with U+FFFD in their place. Every other text that leaves the environment
    goes through the same function: the action as kept in `transcript` (and in
    `ChatHistory`'s messages), and `info`'s `reason`, `answer` and `tool_calls`
    (arguments, errors, urls), so no forged `<|im_end|>` reaches a consumer that renders
    them with a chat template. Only `info["raw_action"]` keeps the action as given.

    ## Arguments
    See `envs.config.DeepResearchConfig` (every keyword of `gym.make`, with help text):
    world, world_size, world_seed, task_split, test_fraction, validation_fraction, hops,
    max_turns, max_context_tokens, max_turn_tokens, forced_final_answer, token_counter,
    reward_metric, format_penalty, reward_fn, tools, extra_tools, search_top_k,
    max_queries_per_call, max_urls_per_call, search_backend, retrieval_url, summarizer,
    summarizer_url,
    summarizer_model, tool_timeout_s, tool_retries, backend, search_provider, search_url,
    search_api_key_env, search_min_interval_s, allow_hosts, fetch_max_bytes,
    fetch_timeout_s, fetch_allow_pdf, cache_mode, cache_path, summarizer_api_key_env,
    summarizer_chunk_chars, date, prompt_style, reveal_answer_in_info,
    max_action_chars, max_observation_chars, and `render_mode` ('ansi' or 'human').

    ## Plug-in tools, vector envs, branching
    `extra_tools` adds plug-in tools (venus_gym.tools.plugin; e.g. "calculator") after
    search and visit: their schemas join the system prompt, the parser checks calls to
    them, and their text is the observation. An entry `{"mcp": URL or command line or
    mapping}` offers every tool of an MCP server (venus_gym.tools.mcp_tools), called through
    the toolbox like search and visit (timeouts, retries, record/replay with `cache_mode`,
    `info["cost"]["plugin_calls"]`); a hung, crashed or misbehaving server is an
    observation. `gym.make_vec("DeepResearch-v0", num_envs=N,
    vectorization_mode="sync" | "async")` works through Gymnasium's vector API (observations
    are tuples of str; finished environments reset on their next step).
    `get_state()` / `set_state(state)` snapshot and restore an episode (task, turn, budgets,
    transcript, RNG) so a rollout can branch from any turn and replay identically.

    ## Version History
    - v0: initial release (DR-Venus turn format, search + visit tools, embedded world,
      HotpotQA variant).
    - v0, `prompt_style` added (2026-11-26): 'compact' offers a short system prompt;
      the default 'full' prompt and everything else are unchanged.
    - v0, visit summaries made process-independent (2026-11-27): the extractive
      summarizer broke some ties between equally scored sentences by Python's per-process
      hash order; it now always picks the earlier sentence, as its docstring said.
    - v0, `judge_turn` added (2026-11-27): the step's validity check without the step;
      episodes are unchanged.
    - v0, observations cleaned of control characters: C0 (but tab and newline), DEL and C1
      characters and lone surrogates in the question, tool output or echoed arguments
      become U+FFFD (lone surrogates were '?'), carriage returns newlines; a query holding
      a lone surrogate is searched instead of failing as a tool error. Observations of
      text without such characters are unchanged.
    - v0, `backend="web"` added: web search providers, a guarded fetcher, record/replay
      and cost accounting; `reset(options={"question", "answer"})` poses a new task.
      Corpus-backed environments are unchanged.
    - v0, `extra_tools`, `reward_fn`, `get_state`/`set_state` and async vector support
      added; with their defaults episodes are unchanged.
    - v0, MCP servers in `extra_tools`; plug-in calls go through the toolbox (its timeout
      and retries of transient failures); tool schemas may use object, null, enum and
      union types. Episodes without plug-ins are unchanged.
    """

    metadata = {"render_modes": ["ansi", "human"]}

    def __init__(self, render_mode: str | None = None, *, toolbox: Any = None, **kwargs: Any):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} "
                             f"or None, got {render_mode!r}")
        self.config = DeepResearchConfig.from_kwargs(**kwargs)
        self.render_mode = render_mode
        self.world, index = world_and_index(self.config)
        self.tasks: list[Task] = select_tasks(self.world, self.config)
        self._task_by_id = {t.id: t for t in self.tasks}
        # A toolbox may be passed in so a group of environments shares one backend stack.
        self.toolbox = toolbox if toolbox is not None else build_toolbox(
            self.config, self.world, index)
        self.count_tokens = self.config.token_counter or approx_token_count
        self._mcp_tools: list[Any] = []  # built here: released (servers let go) by close()
        self.plugins = self._plug_in(self.config.extra_tools)
        try:
            self._finish_init()
        except BaseException:
            self.close()  # a refused build stops the servers it started
            raise

    def _finish_init(self) -> None:
        # The cost report: the web's spending, or MCP servers' calls.
        self._reports_cost = self.config.backend == "web" or any(
            map(is_mcp_spec, self.config.extra_tools))
        self.offered_tools: tuple[str, ...] = (*self.config.tools, *self.plugins)
        self.reward_fn = self._reward_callable(self.config.reward_fn)
        self.system_prompt = render_system_prompt(self.offered_tools, date=self.config.date,
                                                  style=self.config.prompt_style)
        self._system_tokens = self.count_tokens(self.system_prompt)
        self._max_tool_text_chars = (self.config.max_observation_chars
                                     - len(format_tool_response("")))
        self.action_space = UnicodeText(self.config.max_action_chars)
        self.observation_space = UnicodeText(self.config.max_observation_chars)
        self.task: Task | None = None
        self._done = True
        self._reset_called = False

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.task = self._choose_task(options or {})
        question = sanitize_observation(self.task.question)[: self.config.max_observation_chars]
        self.turn = 0
        self.tokens_used = self._system_tokens + self.count_tokens(question)
        self.forced_final = False
        self._done = False
        self._reset_called = True
        self.transcript: list[tuple[str, str]] = [("user", question)]
        info = {"task_id": self.task.id, "hops": self.task.hops, "turn": 0,
                "question": question, "system_prompt": self.system_prompt,
                "tokens_used": self.tokens_used}
        if self.config.reveal_answer_in_info:
            info["gold_answers"] = list(self.task.answers)
        if self._reports_cost:
            info["cost"] = self.cost()
        if self.render_mode == "human":
            self.render()
        return question, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not self._reset_called:
            raise gym.error.ResetNeeded("Call reset before step")
        if self._done:
            raise gym.error.ResetNeeded("The episode has ended: call reset before step")
        if not isinstance(action, str):
            raise TypeError(f"DeepResearch-v0 actions are str (one assistant turn), "
                            f"got {type(action).__name__}")
        cfg = self.config
        task = self.task
        assert task is not None
        self.turn += 1
        action_tokens = self.count_tokens(action)
        parsed, valid, reason = self._judge(action, action_tokens)
        kind = parsed.kind if valid else "invalid"
        turn_budget_hit = self.turn >= cfg.max_turns

        info: dict[str, Any] = {"turn": self.turn, "kind": kind, "valid": valid,
                                "reason": sanitize_observation(reason), "intent": parsed.intent,
                                "tool_calls": [], "forced_final": self.forced_final,
                                "budget": None, "task_id": task.id, "hops": task.hops,
                                "raw_action": action}
        reward, terminated, truncated = 0.0, False, False
        if kind == "answer":
            answer = parsed.answer or ""
            reward = self._score(answer, task)
            info["answer"], info["score"] = sanitize_observation(answer), reward
            terminated, obs = True, ""
        elif kind == "invalid":
            reward = -cfg.format_penalty
            if self.forced_final:  # the one last chance was wasted
                truncated, obs = True, ""
                info["budget"] = "final_turn_wasted"
            else:
                obs = format_error_notice(sanitize_observation(reason))
        else:
            call = parsed.tool_call
            assert call is not None
            if turn_budget_hit:
                # Its result would be replaced by the notice (or the episode cut): skip the
                # call rather than pay for a summarizer/search nobody reads.
                obs = ""
                info["tool_calls"] = [{"name": call.name,
                                       "arguments": sanitize_value(call.arguments),
                                       "ok": False, "error": "not run: turn budget reached",
                                       "urls": []}]
            else:
                plugin = self.plugins.get(call.name)
                if plugin is None:
                    outcome = self.toolbox.call(call.name, call.arguments)
                elif hasattr(self.toolbox, "call_plugin"):  # timeouts, retries, replay
                    outcome = self.toolbox.call_plugin(plugin, call.arguments)
                else:  # a toolbox of the caller's own
                    outcome = run_tool(plugin, call.arguments)
                info["tool_calls"] = [{"name": call.name,
                                       "arguments": sanitize_value(call.arguments),
                                       "ok": outcome.ok, "error": sanitize_value(outcome.error),
                                       "urls": sanitize_value(list(outcome.urls))}]
                # Cut the body, not the frame, so the reply stays a well-formed message.
                body = sanitize_observation(outcome.text)[: self._max_tool_text_chars]
                obs = format_tool_response(body)

        self.tokens_used += action_tokens + self.count_tokens(obs)
        context_budget_hit = self.tokens_used >= cfg.max_context_tokens
        if not (terminated or truncated) and (turn_budget_hit or context_budget_hit):
            info["budget"] = "turns" if turn_budget_hit else "context"
            if cfg.forced_final_answer and not self.forced_final:
                # DR-Venus replaces the last message by the notice, then allows one turn.
                self.tokens_used -= self.count_tokens(obs)
                obs = FORCED_FINAL_NOTICE
                self.tokens_used += self.count_tokens(obs)
                self.forced_final = True
                info["forced_final"] = True
            else:
                truncated, obs = True, ""
        info["tokens_used"] = self.tokens_used
        if self._reports_cost:
            info["cost"] = self.cost()
        if cfg.reveal_answer_in_info:
            info["gold_answers"] = list(task.answers)
        self._done = terminated or truncated
        self.transcript.append(("assistant", sanitize_observation(action)))
        if obs:
            self.transcript.append(("user", obs))
        if self.render_mode == "human":
            self.render()
        return obs, float(reward), terminated, truncated, info

    # ------------------------------------------------------------------ branching
    def get_state(self) -> dict[str, Any]:
        """A snapshot of the episode, for `set_state`: the task, turn, budgets, transcript
        and the RNG (so later resets draw the same tasks). A deep copy: stepping on does not
        change it, and one snapshot may be restored any number of times.

        Tools are not part of it: search, visit (corpus backend) and the calculator are
        pure functions of their arguments, so a restored episode sees the same observations.
        A remote or web backend answers as it answers now (replay it from a cache to
        branch deterministically).
        """
        names = ("task", "turn", "tokens_used", "forced_final", "_done", "_reset_called",
                 "transcript")
        state = {name: copy.deepcopy(getattr(self, name)) for name in names
                 if hasattr(self, name)}
        state["np_random"] = copy.deepcopy(self.np_random.bit_generator.state)
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from a `get_state` snapshot (of this environment or of one made with the
        same arguments): the next `step` behaves as it would have after the snapshot."""
        if not isinstance(state, dict) or "np_random" not in state or "_done" not in state:
            raise ValueError("set_state expects a snapshot returned by get_state()")
        for name, value in state.items():
            if name == "np_random":
                self.np_random.bit_generator.state = copy.deepcopy(value)
            else:
                setattr(self, name, copy.deepcopy(value))

    def cost(self) -> dict[str, int]:
        """What the tools spent so far in this run (search API calls, page fetches, bytes
        received, summarizer calls and tokens, cache hits); {} without a cost meter."""
        meter = getattr(self.toolbox, "cost_meter", None)
        return meter.snapshot() if meter is not None else {}

    def judge_turn(self, action: str) -> tuple[bool, str, ParsedTurn]:
        """Would `step(action)` count this turn as well formed now? Returns (valid, reason,
        parsed turn) exactly as `step` would judge it, without taking the step.

        For callers that decide what to send, e.g. an inference loop that retries a
        malformed turn as DR-Venus does (design.md "Turn format").
        """
        if not self._reset_called or self._done:
            raise gym.error.ResetNeeded("Call reset before judge_turn: no episode is running")
        if not isinstance(action, str):
            raise TypeError(f"DeepResearch-v0 actions are str (one assistant turn), "
                            f"got {type(action).__name__}")
        parsed, valid, reason = self._judge(action, self.count_tokens(action))
        return valid, reason, parsed

    def _judge(self, action: str, action_tokens: int) -> tuple[ParsedTurn, bool, str]:
        cfg = self.config
        parsed = parse_turn(action, self.offered_tools)
        valid, reason = parsed.valid, parsed.reason
        if valid and len(action) > cfg.max_action_chars:
            valid, reason = False, (f"turn is {len(action)} characters, over "
                                    f"max_action_chars={cfg.max_action_chars}")
        if valid and action_tokens > cfg.max_turn_tokens:
            valid, reason = False, (f"turn is {action_tokens} tokens, over the per-turn cap "
                                    f"of {cfg.max_turn_tokens}")
        if valid and self.forced_final and parsed.kind != "answer":
            valid, reason = False, "a tool call was made after the final-answer notice"
        return parsed, valid, reason

    def render(self) -> str | None:
        if self.render_mode is None:
            gym.logger.warn("render() called without a render_mode; pass render_mode='ansi' "
                            "or 'human' to gym.make")
            return None
        if not self._reset_called:
            text = "(no episode yet: call reset)"
        else:
            text = "\n\n".join(f"[{role}]\n{content}" for role, content in self.transcript)
        if self.render_mode == "human":
            # Actions may hold lone surrogates; the console must not crash on them.
            print(text.encode("utf-8", "replace").decode("utf-8"))
            return None
        return text

    # ------------------------------------------------------------------ helpers
    def close(self) -> None:
        """Let go of the MCP servers this environment offers (the last environment to let
        go of one stops it) and of their tools' schemas. Idempotent."""
        tools, self._mcp_tools = getattr(self, "_mcp_tools", []), []
        for tool in tools:
            release_tool(tool)
        super().close()

    def _plug_in(self, specs: Any) -> dict[str, Any]:
        plugins: dict[str, Any] = {}
        # MCP tools together take at most a share of the context in the system prompt.
        section = ToolSection(self.config.max_context_tokens // SECTION_SHARE,
                              self.count_tokens)
        built: list[Any] = []  # MCP tools holding their server, not yet offered
        try:
            for spec in specs:
                self._plug_in_one(spec, plugins, section, built)
        except BaseException:  # a refused build lets go of every server it started
            for tool in built:
                tool.close(wait=False)
            self.close()
            raise
        return plugins

    def _plug_in_one(self, spec: Any, plugins: dict[str, Any], section: ToolSection,
                     built: list[Any]) -> None:
        if is_mcp_spec(spec):  # every tool of an MCP server, through the toolbox's cache
            tools = mcp_tools(spec, cache=getattr(self.toolbox, "cache", None),
                              timeout_s=self.config.tool_timeout_s, section=section)
            built.extend(tools)
        else:
            tools = [spec]
        for tool in tools:
            name = getattr(tool, "name", None)
            if name in ("search", "visit") or name in plugins:
                hint = " (give the MCP server a 'prefix')" if is_mcp_spec(spec) else ""
                raise ValueError(f"DeepResearch-v0 config: extra_tools offers {name!r} "
                                 f"twice or under a built-in tool's name{hint}")
            try:
                tool = resolve_tool(tool)
            except ValueError as error:
                if is_mcp_spec(spec):
                    raise ValueError(f"DeepResearch-v0 config: MCP tool {name!r}: {error} "
                                     f"(a 'prefix' for the server renames its tools; "
                                     f"'tools' picks some)") from None
                raise
            if tool.name in ("search", "visit") or tool.name in plugins:
                raise ValueError(f"DeepResearch-v0 config: extra_tools offers "
                                 f"{tool.name!r} twice or under a built-in tool's name")
            plugins[tool.name] = tool
            if is_mcp_spec(spec):
                built[:] = [other for other in built if other is not tool]
                self._mcp_tools.append(tool)

    @staticmethod
    def _reward_callable(spec: Any) -> Any:
        if isinstance(spec, str):
            spec = load_object(spec)
            if not callable(spec):
                raise ValueError(f"DeepResearch-v0 config: reward_fn names {spec!r}, which "
                                 f"is not callable")
        return spec

    def _score(self, answer: str, task: Task) -> float:
        if self.reward_fn is None:
            return score_answer(answer, task.answers, self.config.reward_metric)
        value = self.reward_fn(answer, list(task.answers), task)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
                value):
            raise ValueError(f"reward_fn {self.config.reward_fn!r} returned {value!r}; it must "
                             f"return a finite float")
        return float(value)

    def _choose_task(self, options: dict[str, Any]) -> Task:
        unknown = set(options) - {"task_id", "task_index", "question", "answer"}
        if unknown:
            raise ValueError(f"unknown reset option(s) {sorted(unknown)}; valid: task_id, "
                             f"task_index, question (with answer)")
        if "question" in options or "answer" in options:
            return self._posed_task(options)
        if "task_id" in options:
            task_id = options["task_id"]
            if task_id not in self._task_by_id:
                raise KeyError(f"task_id {task_id!r} is not in this environment's "
                               f"{len(self.tasks)} tasks (split {self.config.task_split!r})")
            return self._task_by_id[task_id]
        if "task_index" in options:
            i = options["task_index"]
            if not isinstance(i, int) or not 0 <= i < len(self.tasks):
                raise IndexError(f"task_index must be an int in [0, {len(self.tasks)}), "
                                 f"got {i!r}")
            return self.tasks[i]
        if not self.tasks:
            raise ValueError("this environment has no tasks (backend='web' without a task "
                             "file): pass reset(options={'question': ..., 'answer': ...}) or "
                             "world=<QA JSONL file>")
        return self.tasks[int(self.np_random.integers(len(self.tasks)))]

    @staticmethod
    def _posed_task(options: dict[str, Any]) -> Task:
        question, answer = options.get("question"), options.get("answer")
        if not isinstance(question, str) or not question.strip():
            raise ValueError("reset option 'question' must be a non-empty string")
        answers = [answer] if isinstance(answer, str) else answer
        if (not isinstance(answers, list | tuple) or not answers
                or not all(isinstance(a, str) and a.strip() for a in answers)):
            raise ValueError("reset option 'answer' must be a non-empty string or a list of "
                             "them (the gold answers the reply is scored against)")
        if "task_id" in options:
            task_id = str(options["task_id"])
        else:  # stable across runs, so records and replays name the same task
            task_id = "posed-" + hashlib.sha1(question.encode("utf-8", "replace")).hexdigest()[:12]
        return Task(id=task_id, question=question, answers=tuple(answers), source="reset")
