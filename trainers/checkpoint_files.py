"""Atomic checkpoint directories, shared by the SFT trainer and the RL driver.

    scratch = new_scratch(target)          .checkpoint-000010.tmp-PID-XXXX next to target
    ... write the files into scratch (each writer fsyncs what it wrote) ...
    publish(scratch, target)               fsync files and directory, rename into place
    latest_complete(output_dir, files)     newest checkpoint-<step> holding every file
    remove_scratch(output_dir)             what a killed save left behind
    truncate_steps(metrics.jsonl, step)    drop the log lines a resume is about to re-run

A checkpoint is written into a hidden scratch directory, every file and the directory are
fsynced, and only then is it renamed to `checkpoint-<step>`. A process killed at any point
of a save therefore leaves either the complete checkpoint or a hidden scratch directory
that no reader takes for a checkpoint; `latest_complete` only ever returns a complete one.
Re-saving an existing step moves the old directory aside first (a rename), so even then a
reader sees the old complete checkpoint, the new one, or (between the two renames) the
previous step's.

A resumed run re-runs the steps after its checkpoint; `truncate_steps` drops their lines
from a metrics log first (and a torn last line of a killed write), so no step is logged
twice and the log never holds a broken line.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
import warnings
from collections.abc import Iterable
from pathlib import Path

from venus_gym.jsonl import iter_json_lines

CHECKPOINT_PREFIX = "checkpoint-"
# Scratch and set-aside directories are hidden and never match CHECKPOINT_NAME.
CHECKPOINT_NAME = re.compile(r"checkpoint-(\d+)")
SCRATCH_GLOB = f".{CHECKPOINT_PREFIX}*.tmp-*"


def fsync_file(path: str | Path) -> None:
    """Flush a written file to stable storage."""
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def fsync_dir(path: str | Path) -> None:
    """Flush a directory's entries (new names, renames) to stable storage."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def new_scratch(target: str | Path) -> Path:
    """An empty hidden directory next to `target` to write its files into."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    scratch.mkdir()
    return scratch


def publish(scratch: str | Path, target: str | Path) -> Path:
    """fsync every file of `scratch` and the directory, then rename it to `target`
    (replacing an existing `target`) and fsync the parent."""
    scratch, target = Path(scratch), Path(target)
    for path in scratch.rglob("*"):
        if path.is_file():
            fsync_file(path)
    fsync_dir(scratch)
    old = None
    if target.exists():
        # rename() cannot replace a non-empty directory: move the old one aside first.
        old = target.parent / f".{target.name}.tmp-old-{uuid.uuid4().hex[:8]}"
        os.rename(target, old)
    os.rename(scratch, target)
    fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target


def checkpoint_step(path: Path) -> int | None:
    """The step of a `checkpoint-<step>` directory name, else None."""
    match = CHECKPOINT_NAME.fullmatch(path.name)
    return int(match.group(1)) if match else None


def latest_complete(output_dir: str | Path, files: Iterable[str]) -> Path | None:
    """The `checkpoint-<step>` directory of `output_dir` with the highest step that holds
    every one of `files`, or None. Scratch directories are never considered; the file check
    also skips a directory written in place by an older version and cut short."""
    files = list(files)
    found = [(step, path) for path in Path(output_dir).glob(f"{CHECKPOINT_PREFIX}*")
             if (step := checkpoint_step(path)) is not None and path.is_dir()
             and all((path / name).is_file() for name in files)]
    return max(found)[1] if found else None


def remove_scratch(output_dir: str | Path) -> list[Path]:
    """Delete the scratch directories a killed save left in `output_dir`; returns them.
    Call it only where no save of this output directory is in progress."""
    removed = sorted(Path(output_dir).glob(SCRATCH_GLOB))
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def truncate_steps(path: str | Path, below: int) -> None:
    """Keep only the JSONL lines of `path` whose "step" is < `below`; a torn last line
    (a write cut short by a kill) is dropped with a warning. Rewritten atomically."""
    path = Path(path)
    if not path.exists():
        return
    lines = list(iter_json_lines(path, allow_lone_surrogates=True))  # split at "\n" only
    kept = []
    for position, line in enumerate(lines, 1):
        if line.record is None or "step" not in line.record:
            if position == len(lines):
                # A run killed mid-write leaves a torn last line; it is a step being
                # re-run anyway.
                warnings.warn(f"{path}:{line.lineno}: dropping an unreadable last line",
                              RuntimeWarning, stacklevel=3)
                continue
            raise ValueError(f"{path}:{line.lineno}: not a metrics line (JSON with a 'step'); "
                             "refusing to rewrite the file") from None
        if line.record["step"] < below:
            kept.append(line.text)
    temporary = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    temporary.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    fsync_file(temporary)
    os.replace(temporary, path)  # a kill here leaves either the old or the new file
    fsync_dir(path.parent)
