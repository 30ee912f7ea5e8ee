"""Package an SFT policy as venus-gym's warm start (`warm-start`), evaluated, with a model card.

    python scripts/package_warm_start.py --from runs/sft_compact_third/final

copies the policy directory's files (model.safetensors, config.json, generation config,
tokenizer and chat template) into the package-data directory trainers/warm_start/, plays
the copy on held-out tasks of worlds its SFT never saw (sampled, k per task, with the task
and seed scheme of trainers.evaluation.paired, so other paired evaluations are comparable), and
writes there

    warm_start.json  where it came from (command, commit), the env settings it was trained
                     with, the SFT world seeds, the evaluation settings and its numbers
    README.md        the model card: the same, for people

`warm-start` then names that directory wherever a policy or model path is accepted
(trainers.modeling.models.resolve_model_path): `venus-gym eval --policy warm-start`, RL
`policy.path: warm-start`, the main job's RL stage.

Why ship a policy: RL needs outcome signal. A policy trained from scratch in the few minutes
a demo can afford learns the turn format but never answers correctly, so every group's
outcomes are equal and RL learns only from information gain and the format penalty. The
packaged policy comes from the best CPU recipe (~2 h of SFT) and answers about half the
held-out tasks.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from trainers.modeling.models import WARM_START_INFO, warm_start_dir
from trainers.modeling.warm_start import POLICY_ENV_KEYS

MAX_MODEL_BYTES = 8 * 1024 * 1024  # the package carries it: keep the wheel small
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
DEFAULT_SFT_CONFIGS = ("examples/configs/sft_compact.yaml",
                       "examples/configs/sft_compact_more.yaml",
                       "examples/configs/sft_compact_third.yaml")
DEFAULT_WORLDS = (0, 45)  # world 0: the SFT evaluation world; 45: a validation world
# The evaluation's context: the env's budget (then the forced final answer) and the rollout's
# hard cap, as benchmarks/configs/learning_check_igpo.yaml has them; the tiny models hold
# 8,192 positions.
EVAL_CONTEXT_TOKENS = 6144
ROLLOUT_CONTEXT_TOKENS = 8192


def held_out_sets(env: dict[str, Any], worlds: list[int], split: str = "test") -> list[Any]:
    """One HeldOut per world seed, the split `split` of it, with `env`'s settings."""
    from trainers.evaluation.paired import HeldOut

    return [HeldOut(f"world {w} {split}", {**env, "world_seed": w}, split) for w in worlds]


def copy_policy(source: Path, dest: Path) -> list[str]:
    """Copy the policy files of `source` into `dest` (emptied first); returns their names.

    Raises:
        FileNotFoundError: a required file is missing.
        ValueError: the model is over MAX_MODEL_BYTES, or source holds subdirectories.
    """
    missing = [name for name in REQUIRED_FILES if not (source / name).is_file()]
    if missing:
        raise FileNotFoundError(f"--from {source}: missing {missing}; give a saved policy "
                                "directory (an SFT run's final/)")
    size = (source / "model.safetensors").stat().st_size
    if size > MAX_MODEL_BYTES:
        raise ValueError(f"--from {source}: model.safetensors is {size / 2**20:.1f} MiB, over "
                         f"the {MAX_MODEL_BYTES / 2**20:.0f} MiB the package may carry")
    nested = [p.name for p in source.iterdir() if p.is_dir()]
    if nested:
        raise ValueError(f"--from {source} holds directories {nested}: give the final model "
                         "directory, not a run directory")
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.iterdir():
        if old.is_file():
            old.unlink()
    # The source's own record and card are replaced by the package's.
    names = sorted(p.name for p in source.iterdir()
                   if p.is_file() and p.name not in (WARM_START_INFO, "README.md"))
    for name in names:
        shutil.copy2(source / name, dest / name)
    return names


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def summarize(per_task: list[list[Any]], samples: int = 1000) -> dict[str, list[float]]:
    """metric -> [value, task-clustered bootstrap SE] for trainers.evaluation.paired's metrics."""
    from trainers.evaluation.paired import HEADLINE, METRICS
    from trainers.evaluation.stats import bootstrap_se

    return {m: [METRICS[m](per_task), bootstrap_se(per_task, METRICS[m], samples=samples)]
            for m in (*HEADLINE, "browse_ratio")}


def model_card(info: dict[str, Any]) -> str:
    """README.md of the packaged policy, from warm_start.json's contents."""
    ev = info["eval"]
    rows = ["| tasks | n | format-valid turns | pass@1 | answer rate | browse ratio |",
            "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, result in info["results"].items():
        cells = [f"{result[m][0]:.3f} ± {result[m][1]:.3f}" if m in result else "n/a"
                 for m in ("format_valid_rate", "pass@1", "answer_rate", "browse_ratio")]
        rows.append(f"| {name} | {result['tasks']} | " + " | ".join(cells) + " |")
    env = ", ".join(f"{k} {v}" for k, v in info["env"].items())
    seen = info["sft_world_seeds"]
    return "\n".join([
        "# The packaged warm start (`warm-start`)",
        "",
        "A tiny Qwen3 deep-research policy trained from scratch with masked agentic SFT on "
        "oracle episodes of generated worlds. `warm-start` names this directory wherever "
        "venus-gym takes a policy or model path:",
        "",
        "```bash",
        "venus-gym eval --policy warm-start --k 4 --temperature "
        f"{info['eval']['temperature']} --out runs/eval   # its env settings and world from "
        "warm_start.json",
        "venus-gym rl --config benchmarks/configs/learning_check_igpo.yaml   # policy.path: "
        "warm-start",
        "```",
        "",
        "## How it was made",
        "",
        f"- Command: `{info['command']}`",
        f"- Source commit: `{info['commit']}`",
        f"- Packaged from `{info['source']}` with `{info['package_command']}`",
        f"- Files: {', '.join(info['files'])}",
        f"- Env settings it was trained with (use the same): {env}",
        f"- SFT data came from the train splits of world seeds {_ranges(seen)} "
        f"({len(seen)} in all); it never saw any other world seed, in particular "
        f"{', '.join(str(w) for w in info['held_out_worlds'])} below.",
        "",
        "## Held-out numbers",
        "",
        f"Test split of each world, {ev['k']} samples per task at temperature "
        f"{ev['temperature']}, the temperature RL rolls it out at (seed {ev['seed']}; "
        "docs/benchmarks.md, \"The warm start\", says how it was chosen), at most "
        f"{ev['max_turns']} turns of "
        f"{ev['max_turn_tokens']} tokens and a context budget of {ev['max_context_tokens']} "
        "tokens; ± is the task-clustered bootstrap standard error "
        "(trainers.evaluation.stats). Format-valid turns: valid turns / generated turns; pass@1: "
        "mean correctness (exact match) per sample; answer rate: episodes that end in a "
        "valid answer; browse ratio: visit turns / tool turns per episode (DR-Venus's "
        "tool-use measure).",
        "",
        *rows,
        "",
    ])


def _ranges(values: list[int]) -> str:
    values = sorted(set(values))
    if not values:
        return "none"
    parts, start, prev = [], values[0], values[0]
    for v in values[1:] + [None]:  # type: ignore[list-item]
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(parts)


def package(source: str | Path, dest: str | Path | None = None, *,
            sft_configs: tuple[str, ...] = DEFAULT_SFT_CONFIGS,
            worlds: tuple[int, ...] = DEFAULT_WORLDS, num_tasks: int = 0, k: int = 2,
            seed: int = 0, temperature: float = 1.0, max_turn_tokens: int = 320,
            commit: str | None = None, command: str | None = None,
            package_command: str = "", threads: int = 0) -> dict[str, Any]:
    """Copy, evaluate and describe the policy (module docstring); returns warm_start.json's
    contents."""
    from trainers.evaluation.paired import paired_evaluate
    from trainers.sft.config import load_config

    source, dest = Path(source), Path(dest) if dest is not None else warm_start_dir()
    configs = [load_config(path) for path in sft_configs]
    last = configs[-1]
    seen = sorted({int(w) for c in configs for w in (c.data.world_seeds or ())}
                  | {int(c.env.world_seed) for c in configs if not c.data.world_seeds})
    overlap = sorted(set(worlds) & set(seen))
    if overlap:
        raise ValueError(f"--worlds {overlap}: the SFT data came from these world seeds; "
                         "evaluate on worlds it never saw")
    kwargs = last.eval_env_kwargs()
    env = {key: list(kwargs[key]) if isinstance(kwargs[key], tuple) else kwargs[key]
           for key in POLICY_ENV_KEYS}
    eval_env = {**env, "world_size": kwargs["world_size"], "max_turns": kwargs["max_turns"],
                "max_context_tokens": min(kwargs["max_context_tokens"], EVAL_CONTEXT_TOKENS)}
    files = copy_policy(source, dest)
    held_out = held_out_sets(eval_env, list(worlds))
    for held in held_out:
        held.num_tasks = num_tasks
    print(f"evaluating {dest} on {', '.join(h.name for h in held_out)}: {k} samples per task "
          f"at temperature {temperature}", flush=True)
    evaluation = paired_evaluate({"warm start": dest}, held_out, k=k, seed=seed,
                                 temperature=temperature, max_turn_tokens=max_turn_tokens,
                                 max_context_tokens=ROLLOUT_CONTEXT_TOKENS,
                                 threads=threads)["warm start"]
    results: dict[str, Any] = {}
    for held in held_out:
        groups = [g for g in evaluation.per_task if g[0].metadata["held_out"] == held.name]
        results[held.name] = {"tasks": len(groups), **summarize(groups)}
    results["all"] = {"tasks": len(evaluation.per_task), **summarize(evaluation.per_task)}
    info = {
        "source": str(source),
        "command": command or "venus-gym sft --config " + " ".join(sft_configs),
        "commit": commit or _git_commit(),
        "package_command": package_command or f"python scripts/package_warm_start.py --from "
                                              f"{source}",
        "files": files,
        "env": env,
        "world_size": kwargs["world_size"],
        "sft_world_seeds": seen,
        "held_out_worlds": list(worlds),
        "eval": {"k": k, "temperature": temperature, "seed": seed,
                 "max_turns": eval_env["max_turns"], "max_turn_tokens": max_turn_tokens,
                 "max_context_tokens": eval_env["max_context_tokens"], "split": "test"},
        "results": results,
    }
    (dest / WARM_START_INFO).write_text(json.dumps(info, indent=2) + "\n")
    (dest / "README.md").write_text(model_card(info))
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", required=True,
                        help="the SFT policy directory, e.g. runs/sft_compact_third/final")
    parser.add_argument("--dest", default=None,
                        help="where to write (default: the package's trainers/warm_start/)")
    parser.add_argument("--sft-configs", nargs="+", default=list(DEFAULT_SFT_CONFIGS),
                        help="the SFT configs that made it, in order (its command, env "
                             "settings and training worlds come from them)")
    parser.add_argument("--worlds", nargs="+", type=int, default=list(DEFAULT_WORLDS),
                        help="held-out world seeds (none may be an SFT world)")
    parser.add_argument("--num-tasks", type=int, default=0,
                        help="tasks per world's test split (0 = all)")
    parser.add_argument("--k", type=int, default=2, help="samples per task")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-turn-tokens", type=int, default=320)
    parser.add_argument("--commit", default=None,
                        help="the source commit the policy was trained at (default: HEAD)")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    info = package(args.source, args.dest, sft_configs=tuple(args.sft_configs),
                   worlds=tuple(args.worlds), num_tasks=args.num_tasks, k=args.k,
                   seed=args.seed, temperature=args.temperature,
                   max_turn_tokens=args.max_turn_tokens, commit=args.commit,
                   threads=args.threads,
                   package_command=" ".join(["python scripts/package_warm_start.py",
                                             *(argv if argv is not None else sys.argv[1:])]))
    dest = Path(args.dest) if args.dest else warm_start_dir()
    for name, result in info["results"].items():
        print(f"{name}: " + ", ".join(f"{m} {v[0]:.3f} ± {v[1]:.3f}"
                                      for m, v in result.items() if m != "tasks"))
    print(f"wrote {dest} (model card: {dest / 'README.md'})")
    return 0


__all__ = ["DEFAULT_WORLDS", "MAX_MODEL_BYTES", "copy_policy", "held_out_sets", "main",
           "model_card", "package"]
