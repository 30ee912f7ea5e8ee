"""`venus-gym eval`: a policy x a benchmark x k samples per task, resumable, with a report.

    config = EvalRunConfig(policy="runs/demo/sft/final", benchmark="hotpotqa", num_tasks=20,
                           k=2, out="runs/eval")
    summary = run_eval(config)

The policy is a saved model directory (`trainers.modeling.models.load_policy`, played by the
transformers engine) or an OpenAI-compatible completions endpoint (`trainers.engines.openai_http.OpenAIHTTPEngine`,
token in / token out, so it needs the served model's tokenizer directory); DR-Venus turn
retries are available with either. The benchmark is
"hotpotqa" (the packaged HotpotQA dev subset, every task), "generated" (the test split of the
embedded generated world) or a QA JSONL / saved world (every task). Episodes are played by
the one evaluator, `trainers.evaluation.evaluate.evaluate`.

Files written into `--out`:

    eval_config.json  the settings; a rerun with other settings is refused
    results.jsonl     one trajectory per line (trainers.trajectory JSON; token ids only with
                      --save-token-ids), `metadata["eval"]` holding the task index, sample,
                      hops, type, EM / F1, judge verdict, counts and the task's wall time.
                      Appended and flushed after every finished task.
    summary.json      the numbers (trainers.evaluation.report.summarize), NaN as null
    report.md         tables + the plots (accuracy by hops, browse ratio, turns) as PNG files
    report.html       the same, self-contained (plots inlined as base64)

Resuming: a rerun with the same `--out` and settings reads results.jsonl, keeps every task
whose k trajectories are all there (a line cut by a kill and the lines of an unfinished task
are dropped) and plays only the others. Task i is seeded with seed + i (the policy's
generator is re-seeded per task), so a resumed evaluation gives the numbers of an
uninterrupted one. The summary is always computed from results.jsonl as read back.

Where we deviate from DR-Venus and why
* Correctness is the env's outcome metric (EM by default, `--env reward_metric=f1`) unless a
  judge is given; with `--judge-endpoint` the BrowseComp grader's verdicts are reported
  *next to* the metric numbers (trainers.data.judge, the same prompt and parser), not
  instead of them, so runs with and without a judge stay comparable. A judge reply without
  a verdict is counted (`judge.errors`) and scores as not correct; it never stops the run.
* Presence penalty is available for saved policies (trainers.engines.sampling) and endpoints
  (sent to the server); the batched transformers engine does not take it (engines are the
  RL rollouts' path, and DR-Venus uses it only at inference).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainers.config_utils import check_env_keywords, help_field
from trainers.trajectory import Trajectory
from venus_gym.jsonl import append_jsonl, iter_json_lines

RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.json"
CONFIG_FILE = "eval_config.json"
BENCHMARKS = ("hotpotqa", "generated")
TOKEN_FIELDS = ("input_ids", "loss_mask", "rollout_logprobs", "turn_spans", "turn_boundaries",
                "question_end")


def _f(default: Any, help: str) -> Any:
    """help_field with the default first (a list/dict default is copied per instance)."""
    if isinstance(default, list | dict):
        return help_field(help, factory=lambda: type(default)(default))
    return help_field(help, default)


@dataclass
class EvalRunConfig:
    """Settings of one `venus-gym eval` run (each field's help is its --option's)."""

    out: str = _f("", "Output directory (results.jsonl, summary.json, report.md/.html).")
    policy: str | None = _f(None, "A saved policy directory (save_pretrained with its "
                            "tokenizer, e.g. runs/demo/sft/final), a .gguf file, a hub id in the "
                            "local Hugging Face cache, or 'warm-start' (the policy packaged "
                            "with venus-gym).")
    endpoint: str | None = _f(None, "An OpenAI-compatible API root, e.g. "
                              "http://127.0.0.1:8000/v1 (instead of --policy).")
    model: str = _f("policy", "The model name the endpoint serves.")
    tokenizer: str | None = _f(None, "Endpoint only: a directory with the served model's "
                               "tokenizer (prompts go out as token ids).")
    benchmark: str = _f("auto", "The world to evaluate on (--world is the same option, "
                        "spelled as the training configs' env.world): 'hotpotqa' (packaged "
                        "HotpotQA dev subset), 'generated' or 'synthetic' (the generated world's "
                        "test split), a QA JSONL / saved world path, or 'auto': 'generated' for "
                        "a policy whose warm_start.json says it was trained on generated "
                        "worlds, else 'hotpotqa'.")
    split: str = _f("auto", "Which tasks: 'auto' (the generated world's test split; every task "
                    "of a real set), 'all', 'train', 'validation' or 'test' (the env's "
                    "task_split: evaluate a policy trained on a real set with 'test'; "
                    "'validation' needs --env validation_fraction=...).")
    num_tasks: int = _f(0, "Tasks to evaluate, from the start of the benchmark (0 = all).")
    k: int = _f(1, "Samples per task (pass@k, avg@k).")
    temperature: float | None = _f(None, "Sampling temperature; default 0 (greedy) for k = 1, "
                                   "1.0 for k > 1.")
    top_p: float = _f(1.0, "Nucleus sampling (1.0 = off).")
    presence_penalty: float = _f(0.0, "Presence penalty (DR-Venus inference option; 0 = off).")
    retries: int = _f(0, "DR-Venus turn retries (empty / repetitive / malformed / duplicate "
                      "call); saved policies only.")
    max_turns: int = _f(20, "Assistant turns per episode before the forced final answer.")
    max_turn_tokens: int = _f(512, "Token cap per generated turn.")
    max_context_tokens: int = _f(8192, "The env's context budget in tokens (the rollout's "
                                 "hard cap is this plus two turns).")
    world_size: int = _f(2000, "'generated' only: pages in the generated world.")
    world_seed: int = _f(0, "'generated' only: the world's seed.")
    env: dict[str, Any] = _f({}, "Other DeepResearch-v0 arguments (venus-gym env-help). A "
                             "policy's recorded env settings (prompt_style, search_top_k, hops "
                             "from its warm_start.json) apply unless set here.")
    seed: int = _f(0, "Sampling seed; task i is played with seed + i.")
    judge_endpoint: str | None = _f(None, "OpenAI-compatible API root of an LLM judge "
                                    "(BrowseComp grading prompt).")
    judge_model: str = _f("judge", "The judge endpoint's model name.")
    judge_retries: int = _f(2, "Extra judge requests after a failed or verdict-less reply.")
    save_token_ids: bool = _f(False, "Keep token ids, masks and log-probs in results.jsonl.")
    bootstrap_samples: int = _f(1000, "Bootstrap replicates for the standard errors.")

    def validate(self) -> None:
        problems = []
        if not self.out:
            problems.append("--out is required (the evaluation's output directory)")
        if bool(self.policy) == bool(self.endpoint):
            problems.append("give exactly one of --policy DIR or --endpoint URL")
        if self.endpoint and not self.tokenizer:
            problems.append("--endpoint needs --tokenizer DIR (the served model's tokenizer: "
                            "prompts are sent as token ids)")
        if self.k < 1:
            problems.append(f"--k must be >= 1, got {self.k}")
        if self.split not in ("auto", "all", "train", "validation", "test"):
            problems.append(f"--split must be auto, all, train, validation or test, got "
                            f"{self.split!r}")
        if self.num_tasks < 0:
            problems.append(f"--num-tasks must be >= 0 (0 = all), got {self.num_tasks}")
        if self.retries < 0:
            problems.append(f"--retries must be >= 0, got {self.retries}")
        if self.temperature is not None and self.temperature < 0:
            problems.append(f"--temperature must be >= 0, got {self.temperature}")
        if self.max_turns < 1 or self.max_turn_tokens < 1:
            problems.append("--max-turns and --max-turn-tokens must be >= 1")
        reserved = {"world", "world_size", "world_seed", "task_split", "max_turns",
                    "max_context_tokens", "token_counter", "group_size"}
        if reserved & set(self.env):
            problems.append(f"--env may not set {sorted(reserved & set(self.env))}: they have "
                            "their own options")
        else:
            # The env is built only after eval_config.json is written and the tasks are
            # loaded: an unknown key or a bad value is refused now, before any work.
            try:
                check_env_keywords(self.env)
            except ValueError as error:
                problems.append(str(error))
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def sampling_temperature(self) -> float:
        if self.temperature is not None:
            return self.temperature
        return 0.0 if self.k == 1 else 1.0

    def identity(self) -> dict[str, Any]:
        """The settings that decide a task's records (checked on resume); num_tasks and the
        output options may change between runs."""
        data = dataclasses.asdict(self)
        for key in ("out", "num_tasks", "judge_retries", "save_token_ids", "bootstrap_samples"):
            data.pop(key)
        if data["split"] == "auto":  # the same tasks as before the option existed
            data.pop("split")
        data["temperature"] = self.sampling_temperature
        return data


def with_policy_defaults(config: EvalRunConfig,
                         log: Callable[[str], None] | None = None) -> EvalRunConfig:
    """The config with what its policy records (warm_start.json) filling what the user left
    open: benchmark 'auto' and the env settings it was trained with (the user's --env wins).
    A policy with no record, or an endpoint, changes nothing but 'auto' -> 'hotpotqa'."""
    from trainers.modeling.warm_start import policy_env, policy_record

    record = policy_record(config.policy) if config.policy else {}
    benchmark = config.benchmark
    if benchmark == "auto":
        benchmark = "generated" if record.get("world_size") else "hotpotqa"
    generated = benchmark in ("generated", "synthetic")
    recorded = policy_env(config.policy, generated_world=generated) if record else {}
    used = {key: value for key, value in recorded.items() if key not in config.env}
    world_size = config.world_size
    if generated and record.get("world_size") and config.world_size == EvalRunConfig.world_size:
        world_size = int(record["world_size"])
    if used and log is not None:
        log(f"env settings of {config.policy} (its warm_start.json): "
            + ", ".join(f"{k}={v}" for k, v in used.items()) + " (--env KEY=VALUE changes them)")
    return dataclasses.replace(config, benchmark=benchmark, world_size=world_size,
                               env={**used, **config.env})


# --- benchmark ------------------------------------------------------------------------------
def benchmark_env_kwargs(config: EvalRunConfig) -> tuple[dict[str, Any], str]:
    """(DeepResearch-v0 keywords, task split) of the configured benchmark."""
    from venus_gym.worlds import load_world

    if config.benchmark == "auto":
        config = with_policy_defaults(config)
    name = config.benchmark
    if name in ("generated", "synthetic"):
        world, split = load_world("synthetic", n_pages=config.world_size,
                                  seed=config.world_seed), "test"
    elif name == "hotpotqa":
        world, split = load_world("hotpotqa"), "all"
    else:
        path = Path(name)
        if not path.exists():
            raise FileNotFoundError(f"--benchmark {name!r} is neither {' / '.join(BENCHMARKS)} "
                                    f"nor an existing QA JSONL or saved world")
        world, split = load_world(path), "all"
    if config.split != "auto":
        split = config.split
    # A stuck remote tool backend (--env search_backend=...) must not stall the evaluation.
    kwargs = {"tool_timeout_s": 60.0, **config.env, "world": world, "max_turns": config.max_turns,
              "max_context_tokens": config.max_context_tokens}
    return kwargs, split


def split_tasks(env_kwargs: dict[str, Any], split: str) -> list[Any]:
    """The tasks of the split, in the env's order (the evaluator's task indices)."""
    import gymnasium as gym

    import envs  # noqa: F401  (registers the environments)

    env = gym.make("DeepResearch-v0", **{**env_kwargs, "task_split": split})
    try:
        return list(env.unwrapped.tasks)
    finally:
        env.close()


def task_type(task: Any) -> str | None:
    """A task's question type when its data carries one (HotpotQA's bridge / comparison)."""
    meta = getattr(task, "meta", None) or {}
    value = meta.get("type") or meta.get("question_type")
    return str(value) if value else None


# --- the policy -----------------------------------------------------------------------------
def load_evaluated_policy(config: EvalRunConfig) -> tuple[Any, Any]:
    """(the engine that plays the policy, its ChatTokenizer) for the config: a local policy
    in the transformers engine, or the OpenAI-compatible client of a served one."""
    if config.policy:
        from trainers.engines.hf import HFEngine
        from trainers.modeling.models import load_policy

        model, tokenizer, chat = load_policy(config.policy)
        return HFEngine(model, tokenizer), chat
    from trainers.engines.openai_http import OpenAIHTTPEngine
    from trainers.modeling.models import load_tokenizer

    _, chat = load_tokenizer(config.tokenizer)  # type: ignore[arg-type]
    engine = OpenAIHTTPEngine(config.endpoint, config.model,  # type: ignore[arg-type]
                              max_concurrency=max(4, config.k))
    return engine, chat


# --- results file ---------------------------------------------------------------------------
def read_finished(path: Path, k: int) -> dict[int, list[Trajectory]]:
    """Tasks of results.jsonl with all k trajectories, by task index; rewrites the file
    without the rest (a half-written last line, an unfinished task's lines)."""
    if not path.exists():
        return {}
    groups: dict[int, list[Trajectory]] = {}
    kept_lines: dict[int, list[str]] = {}
    # The shared reader splits at "\n" only: a U+2028 in a task's text is not a line end.
    for line in iter_json_lines(path, allow_lone_surrogates=True):
        try:
            trajectory = Trajectory.from_json(line.record)
            index = int(trajectory.metadata["eval"]["task_index"])
        except (ValueError, KeyError, TypeError):
            continue  # a line cut by a kill (record None)
        groups.setdefault(index, []).append(trajectory)
        kept_lines.setdefault(index, []).append(line.text)
    finished = {i: g for i, g in groups.items() if len(g) == k}
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for index in sorted(finished):
            f.writelines(line + "\n" for line in kept_lines[index])
    os.replace(tmp, path)
    return finished


def _stripped(trajectory: Trajectory) -> Trajectory:
    return dataclasses.replace(trajectory, **{name: None for name in TOKEN_FIELDS})


# --- the run --------------------------------------------------------------------------------
def annotate(trajectory: Trajectory, *, task_index: int, sample: int, task: Any,
             wall_s: float, judge: Any = None) -> Trajectory:
    """The trajectory with `metadata["eval"]` filled in (module docstring)."""
    from trainers.data.convert import extract_answer
    from trainers.evaluation.evaluate import turn_counts
    from trainers.evaluation.metrics import CORRECT_THRESHOLD
    from venus_gym.scoring import exact_match, f1_score

    prediction = extract_answer(trajectory)
    counts = turn_counts(trajectory)
    outcome = 0.0 if trajectory.outcome is None else float(trajectory.outcome)
    record: dict[str, Any] = {
        "task_index": task_index, "sample": sample, "hops": int(getattr(task, "hops", 0)),
        "type": task_type(task), "prediction": prediction,
        "correct": outcome >= CORRECT_THRESHOLD,
        "em": exact_match(prediction, trajectory.answers) if trajectory.answers else 0.0,
        "f1": f1_score(prediction, trajectory.answers) if trajectory.answers else 0.0,
        "turns": counts.turns, "generated_turns": counts.generated, "valid_turns": counts.valid,
        "tool_calls": sum(kind in ("search", "visit") for kind in trajectory.turn_kinds),
        "tokens": len(trajectory.input_ids) if trajectory.input_ids is not None else None,
        "generated_tokens": (sum(trajectory.loss_mask) if trajectory.loss_mask is not None
                             else None),
        "task_wall_s": wall_s,
    }
    if judge is not None:
        record["judge"] = judge_record(judge, trajectory, prediction)
    return dataclasses.replace(trajectory, metadata={**trajectory.metadata, "eval": record})


def judge_record(judge: Any, trajectory: Trajectory, prediction: str | None) -> dict[str, Any]:
    """{"correct": bool, "detail"} or {"correct": False, "error": why} (no answer, or no
    verdict from the judge: counted in the summary, never raised)."""
    from trainers.data.judge import JudgeError

    if not prediction:
        return {"correct": False, "error": "no final answer"}
    if not [a for a in trajectory.answers if a.strip()]:
        return {"correct": False, "error": "no gold answer"}
    try:
        verdict = judge.judge(trajectory.question, prediction, trajectory.answers)
    except JudgeError as e:
        return {"correct": False, "error": f"judge: {e}"}
    return {"correct": bool(verdict.correct), "detail": verdict.detail}


def run_eval(config: EvalRunConfig, *, policy: Any = None, chat: Any = None,
             progress: bool = True, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run (or resume) the evaluation and write its files; returns the summary.

    `policy` / `chat` replace the loaded policy (tests, or a model already in memory).
    """
    from trainers.evaluation.evaluate import evaluate
    from trainers.evaluation.report import summarize, write_reports
    from trainers.rollout import SamplingConfig, text_token_counter

    log = log or (lambda message: print(message, file=sys.stderr))
    config = with_policy_defaults(config, log)
    config.validate()
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    _check_settings(out / CONFIG_FILE, config)

    env_kwargs, split = benchmark_env_kwargs(config)
    tasks = split_tasks(env_kwargs, split)
    count = len(tasks) if config.num_tasks == 0 else min(config.num_tasks, len(tasks))
    if config.num_tasks > len(tasks):
        log(f"--num-tasks {config.num_tasks} but the benchmark has {len(tasks)} tasks; "
            f"evaluating all of them")
    results_path = out / RESULTS_FILE
    finished = read_finished(results_path, config.k)
    todo = [i for i in range(count) if i not in finished]
    if finished:
        log(f"resuming: {len(finished)} finished tasks in {results_path}, {len(todo)} to go")

    if todo:
        if policy is None:
            policy, chat = load_evaluated_policy(config)
        judge = _judge(config)
        env_kwargs["token_counter"] = text_token_counter(chat)
        sampling = SamplingConfig(max_turn_tokens=config.max_turn_tokens,
                                  temperature=config.sampling_temperature, top_p=config.top_p,
                                  seed=config.seed, presence_penalty=config.presence_penalty)

        with results_path.open("a", encoding="utf-8") as results:
            def on_task(index: int, group: list[Trajectory], seconds: float) -> None:
                rows = []
                for sample, trajectory in enumerate(group):
                    annotated = annotate(trajectory, task_index=index, sample=sample,
                                         task=tasks[index], wall_s=seconds, judge=judge)
                    if not config.save_token_ids:
                        annotated = _stripped(annotated)
                    rows.append(annotated.to_json())
                append_jsonl(results, rows, fsync=True)  # one task at a time: whole or not

            started = time.perf_counter()
            evaluate(policy, chat, env_kwargs, task_split=split, k=config.k,
                     task_indices=todo, on_task=on_task, progress=progress, sampling=sampling,
                     max_retries=config.retries, seeds=[config.seed],
                     max_context_tokens=config.max_context_tokens + 2 * config.max_turn_tokens)
            log(f"played {len(todo)} tasks x {config.k} in {time.perf_counter() - started:.1f} s")

    groups = read_finished(results_path, config.k)
    groups = {i: g for i, g in groups.items() if i < count}
    ordered = [sorted(groups[i], key=lambda t: t.metadata["eval"]["sample"])
               for i in sorted(groups)]
    summary = summarize(ordered, k=config.k, bootstrap_samples=config.bootstrap_samples,
                        seed=config.seed)
    summary["benchmark"] = config.benchmark
    summary["policy"] = config.policy or f"{config.endpoint} ({config.model})"
    write_reports(out, summary, ordered)
    return summary


def _judge(config: EvalRunConfig) -> Any:
    if not config.judge_endpoint:
        return None
    from trainers.data.judge import LLMJudge

    return LLMJudge(config.judge_endpoint, config.judge_model, retries=config.judge_retries,
                    backoff_s=0.5)


def _check_settings(path: Path, config: EvalRunConfig) -> None:
    identity = json.loads(json.dumps(config.identity(), default=str))
    if path.exists():
        saved = json.loads(path.read_text(encoding="utf-8"))
        if saved != identity:
            changed = sorted(key for key in set(saved) | set(identity)
                             if saved.get(key) != identity.get(key))
            raise ValueError(f"{path.parent} holds an evaluation with other settings "
                             f"({', '.join(changed)}); use another --out, or the same settings "
                             f"to resume it")
        return
    path.write_text(json.dumps(identity, indent=2) + "\n", encoding="utf-8")


def config_from_args(args: Any) -> EvalRunConfig:
    """An EvalRunConfig from the parsed `venus-gym eval` options."""
    from trainers.config_yaml import parse_env_options

    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(EvalRunConfig)
              if f.name != "env" and hasattr(args, f.name)}
    env = parse_env_options(args.env)  # typed as the same value in a config file
    overrides = list(getattr(args, "overrides", None) or [])
    if not overrides:
        return EvalRunConfig(**values, env=env)
    # KEY=VALUE overrides on top of the options (e.g. k=4, env.search_top_k=3), typed and
    # checked as in the training configs (trainers.config_utils).
    from trainers.config_utils import config_with_overrides

    config = config_with_overrides(EvalRunConfig, {**values, "env": env}, overrides,
                                   where="venus-gym eval")
    config.env = {key: tuple(value) if isinstance(value, list) else value
                  for key, value in config.env.items()}
    return config


def add_arguments(parser: Any) -> None:
    """The `venus-gym eval` options, with the config fields' help strings."""
    helps = {f.name: f.metadata["help"] for f in dataclasses.fields(EvalRunConfig)}
    defaults = EvalRunConfig()
    for name in ("policy", "endpoint", "model", "tokenizer", "benchmark", "split", "num_tasks",
                 "k", "out", "judge_endpoint", "judge_model", "judge_retries", "retries",
                 "temperature", "top_p", "presence_penalty", "max_turns", "max_turn_tokens",
                 "max_context_tokens", "world_size", "world_seed", "seed",
                 "bootstrap_samples"):
        default = getattr(defaults, name)
        kind: Any = type(default) if default is not None else str
        if name == "temperature":
            kind = float
        # --world: the training configs' name for the same thing (env.world).
        flags = ["--benchmark", "--world"] if name == "benchmark" else \
            ["--" + name.replace("_", "-")]
        parser.add_argument(*flags, dest=name, type=kind, default=default,
                            required=name == "out", help=helps[name])
    parser.add_argument("--env", action="append", metavar="KEY=VALUE", help=helps["env"])
    parser.add_argument("--save-token-ids", action="store_true", help=helps["save_token_ids"])
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", default=[],
                        help="settings as dotted.key=value, e.g. k=4 env.search_top_k=3 "
                             "(the fields above by their config names; applied after the "
                             "options)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved settings as YAML and exit")


def main_args(args: Any) -> int:
    try:
        config = config_from_args(args)
        if getattr(args, "print_config", False):
            from trainers.config_utils import config_to_yaml

            config = with_policy_defaults(config)
            config.validate()
            print(config_to_yaml(config), end="")
            return 0
        summary = run_eval(config)
    except (ValueError, FileNotFoundError) as e:
        print(f"venus-gym eval: {e}", file=sys.stderr)
        return 2
    out = Path(config.out)
    keys = [key for key in ("pass@1", "avg@k", "pass@k", "em", "f1", "format_error_rate")
            if key in summary]
    print(" ".join(f"{key}={_short(summary[key])}" for key in keys))
    print(f"wrote {out / RESULTS_FILE}, {out / SUMMARY_FILE}, {out / 'report.md'}, "
          f"{out / 'report.html'}")
    return 0


def _short(value: Any) -> str:
    return "n/a" if value is None else f"{value:.4f}"


__all__ = ["EvalRunConfig", "add_arguments", "annotate", "benchmark_env_kwargs", "main_args",
           "read_finished", "run_eval", "with_policy_defaults"]

