"""The one run logger of the trainers (SFT and RL): metrics per step to JSONL, console,
TensorBoard and W&B, the run's whole config, sample trajectories.

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
RL logs step indices from 0; SFT logs the number of optimizer steps done (from 1,
`step_base=1`), as its checkpoints count them.

Where we deviate from DR-Venus / verl and why
* Metrics go to a local JSONL file first, with TensorBoard and W&B as optional mirrors:
  the JSONL file is what `trainers.evaluation.training_report` plots and what a resumed run
  truncates, so a run without network or extra packages still has its full history.
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
from venus_gym.jsonl import iter_json_lines, json_line

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"
SAMPLES_DIR = "samples"
TENSORBOARD_DIR = "tensorboard"
WANDB_RUN_ID_FILE = "wandb_run_id.txt"
# Keys the logger writes itself on every line; a metric may not reuse them.
RESERVED_KEYS = frozenset({"step", "time"})


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
            per step instead (for log files); None shows nothing (the caller prints).
        tensorboard: "auto" = on if the `tensorboard` package imports, True = on (raises
            ImportError when it is missing), False = off. Event files go to
            output_dir/tensorboard; only finite values are written there.
        wandb_project: a W&B project name to log to as well (None = no W&B). The run id is
            kept in output_dir/wandb_run_id.txt so a resumed run continues the same W&B run.
        config: the run's configuration, written whole to output_dir/config.json (and to
            TensorBoard as text, to W&B as the run config). Non-JSON values go in as str().
        console_keys: the metrics shown on the console, when present.
        step_base: the step number of a run's first step: 0 (step indices, RL) or 1 (steps
            done, SFT). Lines with step >= start_step + step_base are dropped at start.
        description: the progress bar's label.
    """

    def __init__(self, output_dir: str | Path, total_steps: int, *, start_step: int = 0,
                 progress_bar: bool | None = True, tensorboard: bool | str = "auto",
                 wandb_project: str | None = None, config: Mapping[str, Any] | None = None,
                 console_keys: Sequence[str] = ("reward", "accuracy", "format_error_rate", "kl"),
                 step_base: int = 0, description: str = "train"):
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
        self.step_base = step_base
        self._print = progress_bar is False
        self._min_step = start_step + step_base  # the lowest step log() accepts next
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

        truncate_steps(self.metrics_path, start_step + step_base)
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

                self._bar = tqdm(total=total_steps, initial=start_step, desc=description,
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
                             f"({self.start_step + self.step_base}) and >= the last logged "
                             f"step ({self._min_step})")
        values = _scalars(metrics)
        self._min_step = step
        row = {"step": step, "time": time.time(), **values}
        self._file.write(json_line(_json_safe(row)))  # the project's one JSONL writer
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

    def set_total_steps(self, total_steps: int) -> None:
        """A re-planned run length (an SFT time budget): the bar's total and the printed
        step counts follow it."""
        if not _is_int(total_steps) or total_steps < 0:
            raise ValueError(f"total_steps must be an int >= 0, got {total_steps!r}")
        self.total_steps = total_steps
        if self._bar is not None:
            self._bar.total = total_steps
            self._bar.refresh()

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
            done = min(step + 1 - self.step_base, self.total_steps) - self._bar.n
            if done > 0:
                self._bar.update(done)
            self._bar.set_postfix({k: f"{v:.4g}" for k, v in ordered.items()}, refresh=True)
        elif self._print:
            numbers_text = " ".join(f"{k}={v:.4g}" for k, v in shown.items())
            print(f"step {step + 1 - self.step_base}/{self.total_steps} {numbers_text}".rstrip(),
                  flush=True)

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


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Read metrics.jsonl back: one dict per line, in file order; null values become NaN.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line is not a JSON object with an integer "step" (names file:line).
    """
    path = Path(path)
    rows = []
    for line in iter_json_lines(path, allow_lone_surrogates=True):
        if line.record is None:
            raise ValueError(f"{path}:{line.lineno}: invalid JSON ({line.problem})")
        if not _is_int(line.record.get("step")):
            raise ValueError(f"{path}:{line.lineno}: a metrics line must be a JSON object "
                             "with an integer 'step'")
        rows.append({k: math.nan if v is None else v for k, v in line.record.items()})
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


__all__ = ["MetricsLogger", "dumps_json", "read_metrics"]
