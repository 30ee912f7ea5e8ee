"""RL checkpoints: what the driver writes every `run.save_every` steps and resumes from.

    output_dir/checkpoint-000010/learner.pt    learner rank 0: weights, optimizer, reference,
                                               update count, RNG states (trainers.rl.workers)
    output_dir/checkpoint-000010/driver.json   the step, the data position, the evaluation
                                               of the starting policy

A step's tasks and sampling seeds are a pure function of (run.seed, step, group)
(trainers.rl.driver.step_jobs), so the step is the driver's whole state: a run resumed
from a checkpoint continues exactly as the uninterrupted run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainers.rl.metrics import dumps_json
from trainers.rl.workers import LEARNER_STATE_FILE

DRIVER_STATE_FILE = "driver.json"


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / f"checkpoint-{step:06d}"


def latest_rl_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint (its driver state is written last) or None."""
    found = sorted(p for p in Path(output_dir).glob("checkpoint-*")
                   if (p / DRIVER_STATE_FILE).is_file() and (p / LEARNER_STATE_FILE).is_file())
    return found[-1] if found else None


def save_checkpoint(learners: Any, output_dir: Path, step: int, before: dict[str, float],
                    queries_per_step: int) -> Path:
    """Every learner saves (rank 0 writes; fsdp ranks gather), then the driver state."""
    directory = checkpoint_dir(output_dir, step)
    # Learner rank 0 writes learner.pt here: on several nodes output_dir must be shared
    # storage (docs/rl.md).
    directory.mkdir(parents=True, exist_ok=True)
    learners.call("save", str(directory))
    # The driver state is written last: a checkpoint without it is incomplete and ignored.
    # The data position is implied by the step (step_jobs); it is written for inspection.
    (directory / DRIVER_STATE_FILE).write_text(dumps_json(
        {"step": step, "data_position": step * queries_per_step, "before": before}))
    return directory


def resume(learners: Any, output_dir: Path, resume_from: str) -> tuple[int, dict[str, float]]:
    """Load `resume_from` ('latest' or a checkpoint directory) into the learners; returns
    (the step to continue from, the starting policy's evaluation)."""
    directory = latest_rl_checkpoint(output_dir) if resume_from == "latest" else \
        Path(resume_from)
    if directory is None:
        raise FileNotFoundError(f"run.resume='latest' but {output_dir} has no checkpoint")
    learners.call("load", str(directory))
    state = json.loads((directory / DRIVER_STATE_FILE).read_text())
    # NaN (e.g. no correct trajectory to measure) is stored as null.
    before = {k: float("nan") if v is None else v for k, v in state["before"].items()}
    return int(state["step"]), before
