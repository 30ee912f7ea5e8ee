"""Policy records: what a saved policy directory says about its training.

    record = policy_record("runs/sft/final")          # warm_start.json, or {}
    env = policy_env("warm-start")                     # the env settings it was trained with
    write_policy_record(directory, env, stage="rl", start="warm-start", rl_world_seeds=[0])
    info = warm_start_info()                           # the packaged warm start's record

`sft` and `rl` write a record (warm_start.json) next to every final policy; the packager
(trainers.sft.warm_start_package) writes the full one of the packaged warm start, with its
held-out numbers. `eval`, `chat` and `rl` read the env settings from it, so that a policy is
played with the prompt it was trained on unless the user says otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainers.modeling.models import WARM_START, WARM_START_INFO, resolve_model_path

# The env settings a policy depends on (the prompt it was trained on, the search width, the
# question mix); RL and evaluation of the warm start use them.
POLICY_ENV_KEYS = ("prompt_style", "hops", "search_top_k")


def warm_start_info(path: str | Path = WARM_START) -> dict[str, Any] | None:
    """The packaged warm start's warm_start.json (None when the directory has none)."""
    info = resolve_model_path(path) / WARM_START_INFO
    return json.loads(info.read_text()) if info.is_file() else None


def policy_record(path: str | Path) -> dict[str, Any]:
    """What a saved policy directory records of its training (warm_start.json): {} when it
    records nothing. `sft` and `rl` write one next to every final policy, the packager a
    full one (with held-out numbers)."""
    try:
        return warm_start_info(path) or {}
    except (FileNotFoundError, NotADirectoryError, ValueError, OSError):
        return {}


def policy_env(path: str | Path, *, generated_world: bool = True) -> dict[str, Any]:
    """The env settings a saved policy was trained with (POLICY_ENV_KEYS: its prompt, search
    width and, on a generated world, its question mix), as env keywords; {} when it records
    none. `eval`, `chat` and `rl` start from these and let the user's settings win.

    Args:
        generated_world: False leaves out `hops`, which selects a generated world's tasks
            and means nothing on a real QA set.
    """
    env = policy_record(path).get("env") or {}
    keys = POLICY_ENV_KEYS if generated_world else tuple(k for k in POLICY_ENV_KEYS
                                                          if k != "hops")
    return {key: tuple(env[key]) if isinstance(env[key], list) else env[key]
            for key in keys if key in env}


def write_policy_record(directory: str | Path, env: dict[str, Any], *, stage: str,
                        start: str | None = None, sft_world_seeds: list[int] = (),
                        rl_world_seeds: list[int] = (), world_size: int | None = None) -> Path:
    """Write warm_start.json into a saved policy directory: the env settings it was trained
    with and the worlds it saw, carried over from its start policy's record (so a chain of
    runs keeps the union of its worlds). Returns the file's path."""
    previous = policy_record(start) if start else {}
    record = {
        "stage": stage,
        "start": start,
        "env": {key: list(value) if isinstance(value, tuple) else value
                for key, value in env.items() if key in POLICY_ENV_KEYS},
        "world_size": world_size if world_size is not None else previous.get("world_size"),
        "sft_world_seeds": sorted(set(previous.get("sft_world_seeds", [])) |
                                  {int(w) for w in sft_world_seeds}),
        "rl_world_seeds": sorted(set(previous.get("rl_world_seeds", [])) |
                                 {int(w) for w in rl_world_seeds}),
    }
    path = Path(directory) / WARM_START_INFO
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path
