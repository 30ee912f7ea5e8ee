"""RL checkpoints: what the driver writes every `run.save_every` steps and resumes from.

    output_dir/checkpoint-000010/learner.pt    learner rank 0: weights, optimizer, reference,
                                               update count, RNG states (trainers.rl.learner)
    output_dir/checkpoint-000010/driver.json   the step, the data position, the evaluation
                                               of the starting policy

    export_policy(output_dir/checkpoint-000010)  -> checkpoint-000010/policy: the weights as
                                               a model directory that eval, chat, RL and
                                               the learning check play (`venus-gym
                                               export-policy`)

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
from trainers.run_log import CONFIG_FILE, dumps_json

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


def write_rl_policy_record(config: Any, directory: Path) -> Path:
    """warm_start.json of a policy RL saved: the env settings it trained with and the worlds
    it saw, carried over from its start (trainers.modeling.warm_start)."""
    from trainers.modeling.warm_start import write_policy_record

    env = config.env
    generated = env.world == "synthetic"
    return write_policy_record(
        directory, {"prompt_style": env.prompt_style, "search_top_k": env.search_top_k,
                    **({"hops": tuple(env.hops)} if generated else {})},
        stage="rl", start=config.policy.path or None,
        rl_world_seeds=[env.world_seed] if generated else [],
        world_size=env.world_size if generated else None)


def export_policy(checkpoint: str | Path, dest: str | Path | None = None) -> Path:
    """Write the policy of an RL checkpoint as a model directory (weights, tokenizer, chat
    template, warm_start.json), like the run's `final`; returns it (default:
    <checkpoint>/policy). The model comes from the run's config.json (its policy.path, the
    start), the weights from learner.pt. Refused, with what to do, when `checkpoint` is not
    a complete RL checkpoint, the run's config is gone, or the weights do not fit the start
    (a LoRA run's checkpoint holds adapters, not merged weights)."""
    import torch

    from trainers.modeling.models import load_policy
    from trainers.rl.config import load_rl_config

    checkpoint = Path(checkpoint)
    state_file = checkpoint / LEARNER_STATE_FILE
    if not state_file.is_file():
        raise FileNotFoundError(f"{checkpoint} is not an RL checkpoint (no {LEARNER_STATE_FILE}); "
                                "give a run's checkpoint-NNNNNN directory")
    config_file = checkpoint.parent / CONFIG_FILE
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file} is missing: the checkpoint's run config names "
                                "the start policy its weights belong to")
    config = load_rl_config(config_file)
    state = torch.load(state_file, weights_only=False, map_location="cpu")
    if state.get("strategy") == "lora_dp":
        raise ValueError(f"{checkpoint} is a LoRA run's checkpoint (adapters on the start's "
                         "weights): play the run's final policy, which has them merged")
    model, tokenizer, _ = load_policy(config.policy.path)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as error:
        raise ValueError(f"{checkpoint}: its weights do not fit the run's start policy "
                         f"{config.policy.path!r} ({str(error).splitlines()[0]})") from error
    dest = Path(dest) if dest is not None else checkpoint / "policy"
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    write_rl_policy_record(config, dest)
    return dest
