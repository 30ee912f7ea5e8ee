"""Episode statistics and the training-run logger of the RL trainer.

    stats = trajectory_stats(trajectories)          # accuracy, format errors, browse ratio...
    with MetricsLogger("runs/igpo", total_steps=200, config=cfg) as log:
        for step in range(200):
            log.log(step, {"reward": ..., **stats})
            if step % 10 == 0:
                log.save_samples(step, trajectories)
    rows = read_metrics("runs/igpo/metrics.jsonl")

`MetricsLogger` writes, under its output directory:

    metrics.jsonl            one JSON object per logged step: {"step", "time", **metrics}
    config.json              the run's config, whole, written at start
    samples/step-NNNNNN.jsonl  a few trajectories per sampled step (trajectory JSONL)
    tensorboard/             TensorBoard event files (when tensorboard is on)

and shows a tqdm progress bar (or one printed line per step) with a few headline numbers.

The browse ratio follows DR-Venus (REFERENCE): trajectories that end correct browse (visit
pages) more than wrong ones, and RL raises the browse ratio, so it is reported over all
trajectories and separately over correct and wrong ones.

Where we deviate from DR-Venus / verl and why
* Metrics go to a local JSONL file first, with TensorBoard and W&B as optional mirrors:
  the JSONL file is what `trainers.rl.report` plots and what a resumed run truncates, so a
  run without network or extra packages still has its full history.
* Non-finite numbers (a NaN loss, an empty average) are written as JSON null, so every
  line stays valid JSON for any reader; `read_metrics` turns them back into NaN.
"""

from __future__ import annotations

import json
import math
import numbers
import secrets
import string
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from trainers.checkpoint_files import truncate_steps
from trainers.trajectory import Trajectory, write_trajectories

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"
SAMPLES_DIR = "samples"
TENSORBOARD_DIR = "tensorboard"
WANDB_RUN_ID_FILE = "wandb_run_id.txt"
# Keys the logger writes itself on every line; a metric may not reuse them.
RESERVED_KEYS = frozenset({"step", "time"})
# An outcome at or above this counts as correct (judge 1/0 scores, or F1 >= 0.5).
CORRECT_THRESHOLD = 0.5


# --- episode statistics ----------------------------------------------------------------
def trajectory_stats(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Aggregate numbers over finished episodes (one dict of floats).

    accuracy:             mean of `trajectory.outcome`, an unscored (None) outcome counted 0.
    answer_rate:          share of trajectories whose last turn is a valid "answer" turn.
    format_error_rate:    invalid turns / all turns, pooled over trajectories (a turn is
                          invalid when `turn.valid` is False); 0.0 when there are no turns.
    mean_turns:           mean number of assistant turns per trajectory.
    browse_ratio:         per trajectory, visit turns / (search + visit turns), 0 for a
                          trajectory with no tool turn; averaged over trajectories.
    browse_ratio_correct: the same average over trajectories with outcome >= 0.5;
    browse_ratio_wrong:   ... and over those with outcome < 0.5 (None counted as 0).
                          Either is NaN when its set of trajectories is empty (e.g. a batch
                          with no correct episode): an average over nothing is undefined,
                          and 0 would read as "correct episodes never browse".
    num_correct, num_wrong: how many trajectories have outcome >= 0.5 / < 0.5.
    mean_tokens:          mean len(input_ids) over trajectories that carry token ids (the
                          whole episode: prompt, turns and environment replies); NaN when
                          none does.

    Raises:
        ValueError: no trajectories (every average would be undefined).
    """
    if len(trajectories) == 0:
        raise ValueError("trajectory_stats needs at least one trajectory")
    outcomes = [_outcome(t) for t in trajectories]
    ratios = [_browse_ratio(t) for t in trajectories]
    correct = [r for r, o in zip(ratios, outcomes) if o >= CORRECT_THRESHOLD]
    wrong = [r for r, o in zip(ratios, outcomes) if o < CORRECT_THRESHOLD]
    total_turns = sum(len(t.turns) for t in trajectories)
    invalid_turns = sum(not turn.valid for t in trajectories for turn in t.turns)
    answered = sum(bool(t.turns) and t.turns[-1].kind == "answer" and t.turns[-1].valid
                   for t in trajectories)
    token_counts = [len(t.input_ids) for t in trajectories if t.input_ids is not None]
    n = len(trajectories)
    return {
        "accuracy": sum(outcomes) / n,
        "answer_rate": answered / n,
        "format_error_rate": invalid_turns / total_turns if total_turns else 0.0,
        "mean_turns": total_turns / n,
        "browse_ratio": sum(ratios) / n,
        "browse_ratio_correct": _mean(correct),
        "browse_ratio_wrong": _mean(wrong),
        "num_correct": float(len(correct)),
        "num_wrong": float(len(wrong)),
        "mean_tokens": _mean(token_counts),
    }


def rollout_drift(batch: Any) -> dict[str, float]:
    """|engine log-prob - learner log-prob| on the policy tokens of a scored RolloutBatch:
    ~0 when the engine runs the learner's current weights (a failed weight sync or a
    numerics mismatch shows up here); {} without engine log-probs."""
    if batch.engine_logprobs is None or batch.old_logprobs is None:
        return {}
    diff = (batch.engine_logprobs - batch.old_logprobs).abs()[batch.loss_mask]
    if not len(diff):
        return {}
    return {"rollout_logprob_diff_mean": float(diff.mean()),
            "rollout_logprob_diff_max": float(diff.max())}


def _outcome(trajectory: Trajectory) -> float:
    return 0.0 if trajectory.outcome is None else float(trajectory.outcome)


def _browse_ratio(trajectory: Trajectory) -> float:
    kinds = trajectory.turn_kinds
    visits, searches = kinds.count("visit"), kinds.count("search")
    return visits / (visits + searches) if visits + searches else 0.0


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


# --- the run logger ---------------------------------------------------------------------
class MetricsLogger:
    """Log one dict of scalars per training step to JSONL, console, TensorBoard and W&B.

    Args:
        output_dir: the run directory (created if missing).
        total_steps: the number of steps of the whole run (the progress bar's total).
        start_step: the first step this process will log. Steps count from 0, so this is
            also the number of steps already done. On a resumed run (start_step > 0) the
            existing metrics.jsonl is kept, but every line with step >= start_step is
            dropped first: those steps are about to be run again (their checkpoint was not
            saved), and keeping them would count them twice. With start_step = 0 the same
            rule empties the file: a fresh run overwrites an old one in the same directory.
        progress_bar: a tqdm bar (postfix: the console keys present); False prints one line
            per step instead (for log files).
        tensorboard: "auto" = on if the `tensorboard` package imports, True = on (raises
            ImportError when it is missing), False = off. Event files go to
            output_dir/tensorboard; only finite values are written there.
        wandb_project: a W&B project name to log to as well (None = no W&B). The run id is
            kept in output_dir/wandb_run_id.txt so a resumed run continues the same W&B run.
        config: the run's configuration, written whole to output_dir/config.json (and to
            TensorBoard as text, to W&B as the run config). Non-JSON values go in as str().
        console_keys: the metrics shown on the console, when present.
    """

    def __init__(self, output_dir: str | Path, total_steps: int, *, start_step: int = 0,
                 progress_bar: bool = True, tensorboard: bool | str = "auto",
                 wandb_project: str | None = None, config: Mapping[str, Any] | None = None,
                 console_keys: Sequence[str] = ("reward", "accuracy", "format_error_rate", "kl")):
        if not _is_int(total_steps) or total_steps < 0:
            raise ValueError(f"total_steps must be an int >= 0, got {total_steps!r}")
        if not _is_int(start_step) or not 0 <= start_step <= max(total_steps, 0):
            raise ValueError(f"start_step must be an int in [0, total_steps={total_steps}], "
                             f"got {start_step!r}")
        if tensorboard not in ("auto", True, False):
            raise ValueError(f"tensorboard must be 'auto', True or False, got {tensorboard!r}")
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.total_steps = total_steps
        self.start_step = start_step
        self.console_keys = tuple(console_keys)
        self.metrics_path = self.output_dir / METRICS_FILE
        self._min_step = start_step  # the lowest step log() accepts next
        self._closed = False
        self._tb: Any = None
        self._wandb: Any = None
        self._bar: Any = None
        self._postfix: dict[str, float] = {}
        # Optional packages are checked before any file is touched, so a missing one
        # leaves an existing run directory as it was.
        writer_class = (None if tensorboard is False
                        else _summary_writer_class(required=tensorboard is True))
        wandb = _import_wandb() if wandb_project is not None else None

        _truncate_metrics(self.metrics_path, start_step)
        config_dict = dict(config) if config is not None else None
        if config_dict is not None:
            (self.output_dir / CONFIG_FILE).write_text(
                dumps_json(config_dict, indent=2) + "\n", encoding="utf-8")
        self._file = self.metrics_path.open("a", encoding="utf-8")
        try:
            if writer_class is not None:
                self._tb = writer_class(log_dir=str(self.output_dir / TENSORBOARD_DIR),
                                        purge_step=start_step or None)
                if config_dict is not None:
                    # Indented by four spaces: TensorBoard renders text as Markdown, and
                    # this keeps the JSON a verbatim code block.
                    text = "\n".join("    " + line
                                     for line in dumps_json(config_dict, indent=2).splitlines())
                    self._tb.add_text("config", text, global_step=start_step)
            if wandb is not None and wandb_project is not None:
                self._wandb = self._start_wandb(wandb, wandb_project, config_dict)
            if progress_bar:
                from tqdm.auto import tqdm

                self._bar = tqdm(total=total_steps, initial=start_step, desc="train",
                                 unit="step", dynamic_ncols=True)
        except BaseException:
            self.close()
            raise

    # -- public API -----------------------------------------------------------------------
    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record the metrics of one step (numbers only; NaN / inf become null in JSONL).

        Steps must not go backwards and must be >= start_step; the same step may be logged
        more than once (e.g. training numbers, then evaluation numbers).
        """
        if self._closed:
            raise RuntimeError("MetricsLogger.log after close()")
        if not _is_int(step):
            raise TypeError(f"step must be an int, got {type(step).__name__}")
        if step < self._min_step:
            raise ValueError(f"step {step} goes backwards: steps must be >= start_step "
                             f"({self.start_step}) and >= the last logged step "
                             f"({self._min_step})")
        values = _scalars(metrics)
        self._min_step = step
        row = {"step": step, "time": time.time(), **values}
        self._file.write(dumps_json(row) + "\n")
        self._file.flush()

        finite = {k: v for k, v in values.items() if math.isfinite(v)}
        if self._tb is not None:
            for key, value in finite.items():
                self._tb.add_scalar(key, value, global_step=step)
            self._tb.flush()  # steps are slow; a crash should not lose the last minutes
        if self._wandb is not None:
            self._wandb.log(finite, step=step)
        self._show(step, values)

    def save_samples(self, step: int, trajectories: Iterable[Trajectory], k: int = 4) -> Path:
        """Write the first k trajectories to samples/step-{step:06d}.jsonl; returns its path."""
        if not _is_int(k) or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        if not _is_int(step) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        chosen = []
        for trajectory in trajectories:
            if len(chosen) == k:
                break
            chosen.append(trajectory)
        path = self.output_dir / SAMPLES_DIR / f"step-{step:06d}.jsonl"
        write_trajectories(path, chosen)
        return path

    def close(self) -> None:
        """Flush and close every sink; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._file.close()
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    # -- helpers ---------------------------------------------------------------------------
    def _show(self, step: int, values: dict[str, float]) -> None:
        shown = {key: values[key] for key in self.console_keys if key in values}
        if self._bar is not None:
            # The bar keeps the latest value of each key, so a second log of the same step
            # (e.g. evaluation numbers) does not blank the training numbers.
            self._postfix.update(shown)
            ordered = {k: self._postfix[k] for k in self.console_keys if k in self._postfix}
            # Logging the same step twice must not advance the bar twice.
            done = min(step + 1, self.total_steps) - self._bar.n
            if done > 0:
                self._bar.update(done)
            self._bar.set_postfix({k: f"{v:.4g}" for k, v in ordered.items()}, refresh=True)
        else:
            numbers_text = " ".join(f"{k}={v:.4g}" for k, v in shown.items())
            print(f"step {step + 1}/{self.total_steps} {numbers_text}".rstrip(), flush=True)

    def _start_wandb(self, wandb: Any, project: str, config: dict[str, Any] | None) -> Any:
        id_file = self.output_dir / WANDB_RUN_ID_FILE
        # A fresh id as W&B makes them (8 lowercase letters and digits); its own generator
        # is not public API (wandb.util.generate_id is gone in 0.2x).
        run_id = id_file.read_text().strip() if id_file.exists() else "".join(
            secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
        id_file.write_text(run_id + "\n")
        # W&B drops a step lower than the run's last one, so after a resume the re-run steps
        # appear from the first step past the old ones (metrics.jsonl stays exact).
        return wandb.init(project=project, id=run_id, resume="allow", dir=str(self.output_dir),
                          config=json.loads(dumps_json(config)) if config is not None else None)


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError as e:
        raise ImportError("wandb_project is set but the `wandb` package is not installed: "
                          "pip install wandb (or leave wandb_project=None)") from e
    return wandb


def _summary_writer_class(required: bool) -> Any:
    """torch's SummaryWriter if the tensorboard package imports; else None, or raise."""
    try:
        import tensorboard  # noqa: F401  (torch.utils.tensorboard needs it)
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        if required:
            raise ImportError("tensorboard=True but TensorBoard logging is unavailable "
                              f"({e}): pip install tensorboard (or pass tensorboard=False)"
                              ) from e
        return None
    return SummaryWriter


def _truncate_metrics(path: Path, start_step: int) -> None:
    """Keep only the lines of `path` with step < start_step (see MetricsLogger)."""
    truncate_steps(path, start_step)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Read metrics.jsonl back: one dict per line, in file order; null values become NaN.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line is not a JSON object with an integer "step" (names file:line).
    """
    path = Path(path)
    rows = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: invalid JSON ({e})") from None
            if not isinstance(row, dict) or not _is_int(row.get("step")):
                raise ValueError(f"{path}:{number}: a metrics line must be a JSON object "
                                 "with an integer 'step'")
            rows.append({k: math.nan if v is None else v for k, v in row.items()})
    return rows


def _scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Validate and convert metric values to float (numpy / 0-d torch scalars included)."""
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics must be a mapping of name -> number, got "
                        f"{type(metrics).__name__}")
    values = {}
    for key, value in metrics.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"metric names must be non-empty strings, got {key!r}")
        if key in RESERVED_KEYS:
            raise ValueError(f"metric name {key!r} is reserved (the logger writes it)")
        if isinstance(value, numbers.Real):
            values[key] = float(value)
            continue
        item = getattr(value, "item", None)  # a numpy or torch scalar
        try:
            converted = item() if callable(item) else None
        except (ValueError, RuntimeError):  # not a single element
            converted = None
        if not isinstance(converted, numbers.Real):
            raise TypeError(f"metric {key!r} must be a real number, got "
                            f"{type(value).__name__}: {value!r:.80}")
        values[key] = float(converted)
    return values


def dumps_json(value: Any, indent: int | None = None) -> str:
    """Strict JSON text: NaN / inf as null, paths and other objects as str()."""
    return json.dumps(_json_safe(value), indent=indent, allow_nan=False, ensure_ascii=False)


def _json_safe(value: Any) -> Any:
    """Non-finite floats -> None, paths and other objects -> str, tuples -> lists."""
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return str(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


__all__ = ["MetricsLogger", "read_metrics", "trajectory_stats"]
