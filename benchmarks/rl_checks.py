"""What the learning checks share (benchmarks/fit_check.py, benchmarks/learning_check.py):
train arms of one RL config, then let the policies play the same tasks under the same
sampling seeds and compare them with paired, task-clustered standard errors."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

ARMS = ("igpo", "placebo", "grpo")
SFT_ARM = "sft"  # learning_check.py's equal-time baseline: more SFT instead of RL


def parse_named_dirs(pairs: list[str], option: str, *, label: str = "NAME",
                     known: tuple[str, ...] | None = None, taken: dict[str, str] | None = None,
                     saved_policy: bool = False) -> dict[str, str]:
    """NAME=DIR pairs of a command-line `option` as {name: directory}, in order. Refused
    with the pair and the reason when it lacks NAME= or DIR, its name is not one of `known`
    (when given), is `taken` ({name: why}) or given twice, or (saved_policy) DIR holds no
    saved policy (config.json)."""
    named: dict[str, str] = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path or (known is not None and name not in known):
            choice = f" with {label} one of {known}" if known is not None else ""
            raise SystemExit(f"{option} takes {label}=DIR{choice}, got {pair!r}")
        if name in named or name in (taken or {}):
            why = "given" if name in named else (taken or {})[name]
            raise SystemExit(f"{option} {pair!r}: {label.lower()} {name!r} is already {why}")
        if saved_policy and not (Path(path) / "config.json").is_file():
            raise SystemExit(f"{option} {pair!r}: {path} is not a saved policy (no config.json)")
        named[name] = path
    return named


def default_jobs() -> int:
    """Processes a check trains its arms and plays its tasks in: two on a CPU machine with
    two or more cores (one process per core beats one process with two intra-op threads on
    this small policy: benchmarks/parallel_checks.py), one where CUDA runs the policy."""
    import torch

    from trainers.backends import usable_cores

    if torch.cuda.is_available():
        return 1
    return min(2, usable_cores())


def add_jobs_argument(parser: Any) -> None:
    """--jobs, the same for every check."""
    parser.add_argument("--jobs", type=int, default=None,
                        help="processes that train the RL arms side by side and then deal out "
                             "the held-out tasks, each with policy.threads // jobs torch "
                             "threads; the runs and episodes are the same for any value "
                             "up to the learner's rounding, which can flip a sampled token "
                             "and send an arm down other rollouts "
                             "(default: 2 on a CPU machine with 2+ cores, 1 with CUDA)")


def resolve_jobs(value: int | None) -> int:
    """--jobs as given (refused below 1), or default_jobs()."""
    if value is None:
        return default_jobs()
    if value < 1:
        raise SystemExit(f"--jobs must be >= 1, got {value}")
    return value


def arm_config(base: Any, arm: str, seed: int, output: Path) -> Any:
    """The config of one arm: `igpo` (the config as it is), `placebo` (the same with
    random-sign advantages: the same step sizes, clipping and KL, no signal) or `grpo`
    (outcome-only advantages, the loss settings kept)."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; choose from {ARMS}")
    options = dict(base.algorithm.options)
    name = base.algorithm.name
    if arm == "placebo":
        options.update(placebo=True, placebo_seed=seed)
    elif arm == "grpo":
        name, options = "grpo", {key: value for key, value in options.items() if key == "loss"}
    config = dataclasses.replace(base)
    config.algorithm = dataclasses.replace(base.algorithm, name=name, options=options)
    config.run = dataclasses.replace(base.run, seed=seed, output_dir=str(output / arm))
    return config


def train_arms(base: Any, arms: list[str], seed: int, output: Path, *, jobs: int = 1
               ) -> tuple[dict[str, str], dict[str, float], dict[str, list[dict[str, float]]]]:
    """Train each arm from the same start; (final policy dirs, seconds, per-step history).

    jobs > 1 trains up to `jobs` arms side by side, each in its own process
    (trainers.backends.run_in_processes) sharing policy.threads (the usable cores when 0)
    and printing to <output>/<arm>.log. An arm's random numbers come from its seed, so its
    run is the one of a single process up to rounding: at one thread the learner adds its
    sums in another order than at two, which moves its loss, KL and gradient norm in the
    third or fourth significant digit (benchmarks/parallel_checks.py), and the sampled
    episodes stay the same unless such a difference flips a token. An arm's seconds are
    then its own process's, which shared the machine with the others.
    """
    configs = {arm: arm_config(base, arm, seed, output) for arm in arms}
    finals = {arm: str(output / arm / "final") for arm in arms}
    if jobs <= 1 or len(arms) <= 1:
        outcomes = {arm: _train_arm(config) for arm, config in configs.items()}
    else:
        from trainers.backends import run_in_processes, threads_per_process

        processes = min(jobs, len(arms))
        per_process = threads_per_process(base.policy.threads, processes)
        print(f"training {', '.join(arms)} side by side, {per_process} torch thread(s) each "
              f"(logs: {', '.join(str(output / f'{arm}.log') for arm in arms)})", flush=True)
        for config in configs.values():
            config.policy = dataclasses.replace(config.policy, threads=per_process)
        results = run_in_processes(
            [(_train_arm, (config, output / f"{arm}.log"), {}) for arm, config in configs.items()],
            processes)
        outcomes = dict(zip(configs, results))
    seconds = {arm: outcomes[arm][0] for arm in arms}
    histories = {arm: outcomes[arm][1] for arm in arms}
    for arm, history in histories.items():
        print(f"{arm}: {seconds[arm]:.0f} s; training accuracy per step "
              f"{[round(h['accuracy'], 3) for h in history]}; format errors "
              f"{[round(h['format_error_rate'], 2) for h in history]}", flush=True)
    return finals, seconds, histories


def _train_arm(config: Any, log_path: Path | None = None
               ) -> tuple[float, list[dict[str, float]]]:
    """One arm's RL run: (its seconds, its per-step metrics); with log_path, its printed
    output goes there (a process of train_arms, beside the other arms)."""
    import contextlib

    from trainers.rl.driver import train

    with contextlib.ExitStack() as stack:
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            stream = stack.enter_context(open(log_path, "w", buffering=1))
            stack.enter_context(contextlib.redirect_stdout(stream))
            stack.enter_context(contextlib.redirect_stderr(stream))
        print(f"RL run into {config.run.output_dir}: {config.algorithm.name}, options "
              f"{config.algorithm.options}, seed {config.run.seed}, {config.policy.threads} "
              "torch thread(s)", flush=True)
        started = time.perf_counter()
        result = train(config)
        return time.perf_counter() - started, result.history


def train_sft_arm(start: str, config_path: str | Path, seconds: float, seed: int,
                  output: Path, threads: int | None = None
                  ) -> tuple[str, float, list[dict[str, Any]]]:
    """The equal-time baseline: continue `start` with SFT on fresh oracle episodes
    (`config_path`, an SFT config) for `seconds` of wall time in all, the data's generation
    and tokenisation included (train.max_seconds gets what is left); `threads` (default: the
    config's) its torch threads: those an RL arm had when the arms trained side by side.
    Returns (final policy dir, seconds spent, the SFT steps' metrics)."""
    from trainers.sft.config import load_config
    from trainers.sft.pipeline import build_chat, build_samples, build_tokenizer, train_sft

    started = time.perf_counter()
    config = load_config(str(config_path))
    config.model = dataclasses.replace(config.model, name=start, tokenizer=start)
    config.data = dataclasses.replace(config.data, seed=seed)
    if threads is not None:
        import torch

        # The in-process SFT loop leaves torch's threads as they are: set them here.
        torch.set_num_threads(threads)
        config.train = dataclasses.replace(config.train, threads_per_worker=threads)
    tokenizer = build_tokenizer(config.model, config.env_kwargs(), config.data.world_seeds)
    samples = build_samples(config, build_chat(tokenizer, config.model.chat_template))
    left = seconds - (time.perf_counter() - started)
    if left <= 0:
        raise SystemExit(f"the SFT arm's {seconds:.0f} s went on building its data "
                         f"({len(samples)} samples); give it more time or fewer "
                         "data.num_episodes")
    config.train = dataclasses.replace(config.train, seed=seed, max_seconds=left,
                                       output_dir=str(output / SFT_ARM))
    _, _, history = train_sft(config, samples=samples)
    spent = time.perf_counter() - started
    print(f"{SFT_ARM}: {spent:.0f} s of {seconds:.0f} ({seconds - left:.0f} s data, "
          f"{len(samples)} samples); {len(history)} steps, loss {history[0]['loss']:.3f} -> "
          f"{history[-1]['loss']:.3f}", flush=True)
    return str(output / SFT_ARM / "final"), spent, history


def step_table(histories: dict[str, list[dict[str, float]]],
               keys: tuple[str, ...] = ("accuracy", "format_error_rate", "kl", "entropy")
               ) -> list[str]:
    """Markdown: the arms' training metrics step by step (at least one arm)."""
    if not histories:
        raise ValueError("step_table needs at least one arm's training history")
    arms = list(histories)
    head = "| step | " + " | ".join(f"{arm} {key}" for arm in arms for key in keys) + " |"
    lines = [head, "|---" * (1 + len(arms) * len(keys)) + "|"]
    for step in range(max(len(h) for h in histories.values())):
        cells = []
        for arm in arms:
            row = histories[arm][step] if step < len(histories[arm]) else {}
            cells += [f"{row[key]:.3f}" if key in row else "" for key in keys]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return lines


def arm_tables(runs: dict[str, Any], arms: list[str], seed: int) -> dict[str, dict[str, Any]]:
    """Paired comparisons of the played policies: every arm vs the start, and IGPO vs every
    other arm (trainers.evaluation.paired.compare; the titles name "<b> vs <a>")."""
    from trainers.evaluation.paired import compare

    tables = {f"{arm} vs start": compare(runs["start"], runs[arm], seed=seed) for arm in arms}
    if "igpo" in arms:
        tables.update({f"igpo vs {arm}": compare(runs[arm], runs["igpo"], seed=seed)
                       for arm in arms if arm != "igpo"})
    return tables


def split_tables(runs: dict[str, Any], arms: list[str], seed: int) -> dict[str, dict[str, Any]]:
    """Every arm vs the start on pass@1, on each held-out split alone ({split: {arm:
    Difference}}): whether a change is on the world RL trained on or one it never saw."""
    from trainers.evaluation.paired import compare, task_keys

    splits = list(dict.fromkeys(split for split, _ in task_keys(runs["start"])))

    def only(run: Any, split: str) -> Any:
        return dataclasses.replace(run, per_task=[
            group for (name, _), group in zip(task_keys(run), run.per_task) if name == split])

    return {split: {arm: compare(only(runs["start"], split), only(runs[arm], split),
                                 ("pass@1",), seed=seed)["pass@1"] for arm in arms}
            for split in splits}


def split_lines(tables: dict[str, dict[str, Any]]) -> list[str]:
    """split_tables as markdown: one row per held-out split, the start's value and each
    arm's change from it (paired SE, z)."""
    arms = list(next(iter(tables.values()), {}))
    lines = [f"| split | start | {' | '.join(arms)} |",
             "| --- | ---: |" + " ---: |" * len(arms)]
    for split, row in tables.items():
        start = next(iter(row.values()))
        cells = [f"{d.b:.3f} ({d.diff:+.3f} ± {d.diff_se:.3f}, z {d.z:+.2f})"
                 for d in row.values()]
        lines.append(f"| {split} | {start.a:.3f} | {' | '.join(cells)} |")
    return ["pass@1 by held-out split (change from the start, paired SE):", "", *lines]


def evaluate_arms(base: Any, finals: dict[str, str], held_out: list[Any], *, k: int,
                  seed: int, temperature: float, groups_per_call: int,
                  seconds: dict[str, float], jobs: int = 1
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The start policy and every trained one play `held_out` paired (the same tasks and
    sampling seeds; `jobs` processes deal the tasks out, paired_evaluate); returns the runs
    and arm_tables' paired comparisons, and adds the evaluation's seconds to `seconds`."""
    from trainers.evaluation.paired import paired_evaluate

    started = time.perf_counter()
    runs = paired_evaluate({"start": base.policy.path, **finals}, held_out, k=k, seed=seed,
                           temperature=temperature,
                           max_turn_tokens=base.rollout.max_turn_tokens,
                           max_context_tokens=base.rollout.max_context_tokens,
                           threads=base.policy.threads, groups_per_call=groups_per_call,
                           jobs=jobs)
    seconds["eval"] = time.perf_counter() - started
    return runs, arm_tables(runs, list(finals), seed)


def task_outcomes(runs: dict[str, Any]) -> dict[str, Any]:
    """Every sample's outcome, per played policy and task, in the runs' shared task order:
    {"tasks": ["<held-out split>/<task id>", ...], "outcomes": {policy: [[outcome of each
    sample] per task]}}. Refused when the runs do not list the same tasks in the same order
    (their pairing would be wrong)."""
    from trainers.evaluation.metrics import outcome
    from trainers.evaluation.paired import task_keys

    names = list(runs)
    keys = task_keys(runs[names[0]]) if names else []
    for name in names[1:]:
        if task_keys(runs[name]) != keys:
            raise ValueError(f"{name} played other tasks than {names[0]}: not paired")
    outcomes = {name: [[outcome(t) for t in group] for group in run.per_task]
                for name, run in runs.items()}
    return {"tasks": [f"{split}/{task}" for split, task in keys], "outcomes": outcomes}


def failure_counts(runs: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per played policy, how many of its episodes ended in each of
    trainers.evaluation.metrics.FAILURE_MODES (correct, no answer, read the gold but
    answered wrong, never read the gold): which step of the research a change moved."""
    from trainers.evaluation.metrics import FAILURE_MODES, failure_mode

    counts = {}
    for name, run in runs.items():
        modes = [failure_mode(t) for group in run.per_task for t in group]
        counts[name] = {mode: modes.count(mode) for mode in FAILURE_MODES}
    return counts


def failure_lines(counts: dict[str, dict[str, int]]) -> list[str]:
    """failure_counts as a markdown table, episodes and their share per policy."""
    modes = list(next(iter(counts.values()))) if counts else []
    lines = ["| policy | " + " | ".join(modes) + " |", "| --- |" + " ---: |" * len(modes)]
    for name, row in counts.items():
        total = sum(row.values()) or 1
        lines.append(f"| {name} | " + " | ".join(f"{row[m]} ({row[m] / total:.2f})"
                                                 for m in modes) + " |")
    return lines


def save_played(runs: dict[str, Any], directory: Path) -> dict[str, Path]:
    """Every played trajectory, as text (token ids, masks and log-probs dropped, like
    `venus-gym eval`'s results.jsonl), one file per policy: <directory>/<policy>.jsonl, tasks
    in the runs' shared order and each task's samples together; `venus-gym view` reads
    them. Returns the files by policy."""
    from trainers.evaluation.run import TOKEN_FIELDS
    from trainers.trajectory import write_trajectories

    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, run in runs.items():
        files[name] = directory / f"{name}.jsonl"
        write_trajectories(files[name], (
            dataclasses.replace(trajectory, **{field: None for field in TOKEN_FIELDS})
            for group in run.per_task for trajectory in group))
    return files


def outcome_spread(per_task: list[list[float]]) -> dict[str, int]:
    """How many tasks every sample solved, none did, or some did (correct as the metrics
    count it: outcome >= CORRECT_THRESHOLD). Only the mixed ones give a group of samples an
    outcome signal to learn from."""
    from trainers.evaluation.metrics import CORRECT_THRESHOLD

    counts = {"all": 0, "none": 0, "mixed": 0}
    for samples in per_task:
        solved = sum(o >= CORRECT_THRESHOLD for o in samples)
        counts["all" if solved == len(samples) else "none" if solved == 0 else "mixed"] += 1
    return counts


def report_lines(title: str, intro: str, histories: dict[str, list[dict[str, float]]],
                 tables: dict[str, dict[str, Any]]) -> list[str]:
    """The check's results.md: the training table, then one paired table per comparison."""
    from trainers.evaluation.paired import comparison_lines

    lines = [f"# {title}", "", intro, ""]
    if histories:  # an sft-only check, or policies trained elsewhere, has no RL steps
        lines += ["## Training, step by step", "", *step_table(histories), ""]
    for name, table in tables.items():
        b, a = name.split(" vs ")
        lines += [f"## {name}", "", *comparison_lines(table, a, b), ""]
    return lines
