"""RL checkpoints: what the driver writes every `run.save_every` steps and resumes from.

    output_dir/checkpoint-000010/learner.pt    learner rank 0: weights, optimizer, reference,
                                               update count, RNG states (trainers.rl.learner)
    output_dir/checkpoint-000010/driver.json   the step, the data position, the evaluation
                                               of the starting policy

A step's tasks and sampling seeds are a pure function of (run.seed, step, group)
(trainers.rl.driver.step_jobs), so the step is the driver's whole state: a run resumed
from a checkpoint continues exactly as the uninterrupted run.

Atomic (trainers.checkpoint_files): a checkpoint is written into a hidden scratch directory
(`.checkpoint-000010.tmp-*`), fsynced and renamed to `checkpoint-000010` only after every
learner returned from `save` and the driver state is written. A driver killed during a save
leaves the previous checkpoint as the newest; `resume` deletes the scratch directories.
On several nodes the scratch directory, like output_dir, must be on shared storage: learner
rank 0 writes (and fsyncs) learner.pt there from its own node.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from trainers.checkpoint_files import (
    fsync_file,
    latest_complete,
    new_scratch,
    publish,
    remove_scratch,
)
from trainers.rl.learner import LEARNER_STATE_FILE
from trainers.run_log import dumps_json

DRIVER_STATE_FILE = "driver.json"


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / f"checkpoint-{step:06d}"


def latest_rl_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint (renamed into place with both state files) or None."""
    return latest_complete(output_dir, (LEARNER_STATE_FILE, DRIVER_STATE_FILE))


def save_checkpoint(learners: Any, output_dir: Path, step: int, before: dict[str, float],
                    queries_per_step: int) -> Path:
    """Every learner saves into a scratch directory (rank 0 writes; fsdp ranks gather), the
    driver adds its state, then the directory is renamed into place."""
    target = checkpoint_dir(output_dir, step)
    remove_scratch(output_dir)  # a killed earlier save's leftovers
    scratch = new_scratch(target)
    try:
        learners.save(scratch)  # returns once every rank is done
        # The data position is implied by the step (step_jobs); written for inspection.
        _write_driver_state(scratch, {"step": step, "data_position": step * queries_per_step,
                                      "before": before})
        return publish(scratch, target)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise


def _write_driver_state(directory: Path, state: dict[str, Any]) -> None:
    path = directory / DRIVER_STATE_FILE
    path.write_text(dumps_json(state))
    fsync_file(path)


def resume(learners: Any, output_dir: Path, resume_from: str) -> tuple[int, dict[str, float]]:
    """Load `resume_from` ('latest' or a checkpoint directory) into the learners; returns
    (the step to continue from, the starting policy's evaluation)."""
    remove_scratch(output_dir)  # what a save cut short by a kill left behind
    directory = latest_rl_checkpoint(output_dir) if resume_from == "latest" else \
        Path(resume_from)
    if directory is None:
        raise FileNotFoundError(f"run.resume='latest' but {output_dir} has no complete "
                                "checkpoint (set run.resume: '' to start afresh)")
    learners.load(directory)
    state = json.loads((directory / DRIVER_STATE_FILE).read_text())
    # NaN (e.g. no correct trajectory to measure) is stored as null.
    before = {k: float("nan") if v is None else v for k, v in state["before"].items()}
    return int(state["step"]), before
