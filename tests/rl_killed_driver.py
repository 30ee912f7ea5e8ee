"""Run the RL driver of a config file in this process and SIGKILL it at a chosen point
(used by tests/test_rl_faults.py, which runs it in a subprocess and then resumes the run).

    python -m tests.rl_killed_driver CONFIG.yaml after-group N
        killed right after the N-th rollout group of the run finished
    python -m tests.rl_killed_driver CONFIG.yaml in-checkpoint STEP learner|rename
        killed while checkpoint STEP is written: after every learner wrote its state but
        before the driver state ("learner"), or after every file, just before the rename
        into place ("rename")
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from trainers.rl import checkpoint
from trainers.rl.config import load_rl_config
from trainers.rl.driver import train


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> None:
    config = load_rl_config(argv[0])
    kind = argv[1]
    hook = None
    if kind == "after-group":
        groups = [0]
        target = int(argv[2])

        def hook(result: Any, rollouts: Any) -> None:
            groups[0] += 1
            if groups[0] == target:
                die()
    elif kind == "in-checkpoint":
        step, point = int(argv[2]), argv[3]
        name = checkpoint.checkpoint_dir(".", step).name
        if point == "learner":
            write = checkpoint._write_driver_state

            def write_driver_state(directory: Path, state: dict[str, Any]) -> None:
                if directory.name.startswith(f".{name}.tmp-"):
                    die()
                write(directory, state)

            checkpoint._write_driver_state = write_driver_state
        elif point == "rename":
            publish = checkpoint.publish

            def publish_then_die(scratch: Path, target: Path) -> Path:
                if Path(target).name == name:
                    die()
                return publish(scratch, target)

            checkpoint.publish = publish_then_die
        else:
            raise SystemExit(f"unknown checkpoint point {point!r}")
    else:
        raise SystemExit(f"unknown kill point {kind!r}")
    train(config, on_group_done=hook)
    raise SystemExit("the run ended without being killed")


if __name__ == "__main__":
    main(sys.argv[1:])
