"""DeepResearch-v0 in TRL's `GRPOTrainer`, through its `rollout_func`: token in, token out.

    from trainers.integrations.trl import task_dataset, make_rollout_func, outcome_reward
    chat = ChatTokenizer(tokenizer)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=GRPOConfig(...),
                          train_dataset=task_dataset(env_kwargs),
                          reward_funcs=[outcome_reward, format_reward],
                          rollout_func=make_rollout_func(chat, env_kwargs))

The rollout function plays whole multi-turn episodes with the project's own rollout
(`trainers.rollout.rollout_group`: the environment's format checks, budgets, forced final
answer and answer scoring all apply) and hands TRL the ids exactly as the engine produced
them: `prompt_ids` = the trajectory's ids up to the question's end, `completion_ids` = the
rest, `env_mask` = its loss mask there (environment replies and template ids 0), so TRL
trains on the trajectory's ids and masks, never on a decode and re-encode of its text.

What it handles for the user (each is a trap when gluing TRL to a multi-turn env by hand):
* TRL repeats each prompt `num_generations` times in a row; each run of equal prompts is
  played as one group of that many members on the same task (GRPO's group).
* The generating engine puts the model in eval mode; the model's mode is restored.
* A trajectory ends with the end-of-turn id and, after it, template ids with mask 0; those
  trailing ids are cut so a finished completion ends with the end-of-turn id (the ChatML
  tokenizers here use it as EOS), and TRL does not count every completion as clipped.

Limits: TRL takes one reward per completion, so IGPO's turn-level information-gain rewards
need the project's own trainer (`venus-gym rl`); here the rewards are the episode's
outcome (`outcome_reward`) and, optionally, its summed format penalties (`format_reward`).
The `environment_factory` route of TRL is not used: it needs a template with tool calling
and bypasses the environment's checks and scoring.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from envs.group import DeepResearchGroupEnv
from trainers.engines.hf import HFEngine
from trainers.modeling.tokenization import ChatTokenizer
from trainers.rollout import SamplingConfig, rollout_group
from trainers.trajectory import Trajectory


def task_dataset(env_kwargs: dict[str, Any] | None = None, limit: int | None = None) -> Any:
    """A `datasets.Dataset` of the environment's tasks: "prompt" (the question, which the
    rollout function maps back to the task) and "task_id"."""
    from datasets import Dataset

    group = DeepResearchGroupEnv(group_size=1, **(env_kwargs or {}))
    tasks = group.tasks[:limit] if limit is not None else group.tasks
    group.close()
    return Dataset.from_dict({"prompt": [t.question for t in tasks],
                              "task_id": [t.id for t in tasks]})


def trl_fields(trajectory: Trajectory) -> dict[str, Any]:
    """One trajectory as TRL's rollout fields: prompt/completion ids, logprobs, env_mask."""
    if trajectory.input_ids is None or trajectory.loss_mask is None:
        raise ValueError(f"trajectory {trajectory.id} has no token view")
    start = int(trajectory.question_end or 0)
    mask = trajectory.loss_mask
    end = max(i for i, m in enumerate(mask) if m) + 1 if any(mask[start:]) else len(mask)
    logprobs = trajectory.rollout_logprobs or [0.0] * len(mask)
    return {"prompt_ids": list(trajectory.input_ids[:start]),
            "completion_ids": list(trajectory.input_ids[start:end]),
            "logprobs": [float(x) for x in logprobs[start:end]],
            "env_mask": list(mask[start:end])}


def make_rollout_func(chat: ChatTokenizer, env_kwargs: dict[str, Any] | None = None, *,
                      sampling: SamplingConfig | None = None, max_context_tokens: int = 4096,
                      seed: int = 0,
                      engine_factory: Callable[[Any, Any], Any] | None = None
                      ) -> Callable[[list[Any], Any], dict[str, list]]:
    """A `rollout_func(prompts, trainer)` for `GRPOTrainer`.

    Args:
        chat: the policy's ChatTokenizer (the same tokenizer as the trainer's).
        env_kwargs: DeepResearch-v0 arguments (world, max_turns, ...).
        sampling: per-turn sampling (SamplingConfig()).
        max_context_tokens: cap on a trajectory's ids.
        seed: base seed; call k plays its groups with seed + k.
        engine_factory: (model, tokenizer) -> Engine; default the transformers engine.

    Returns a dict with TRL's keys plus "env_mask" and, for reward functions, "outcome",
    "format_penalty" and "task_id" (one entry per completion).
    """
    env_kwargs = dict(env_kwargs or {})
    groups: dict[int, DeepResearchGroupEnv] = {}
    by_question: dict[str, str] = {}
    calls = [0]

    def group_env(size: int) -> DeepResearchGroupEnv:
        if size not in groups:
            groups[size] = DeepResearchGroupEnv(group_size=size, **env_kwargs)
            for task in groups[size].tasks:
                by_question.setdefault(task.question, task.id)
        return groups[size]

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list]:
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        make = engine_factory or HFEngine
        engine = make(model, chat.tokenizer)
        out: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs",
                                                "env_mask", "outcome", "format_penalty",
                                                "task_id")}
        try:
            for question, size in _runs(prompts):
                group = group_env(size)
                if question not in by_question:
                    raise KeyError(f"prompt {question[:80]!r} is not a task question of this "
                                   f"environment; build the dataset with task_dataset()")
                trajectories = rollout_group(
                    engine, group, chat, seed=seed + calls[0],
                    options={"task_id": by_question[question]}, sampling=sampling,
                    max_context_tokens=max_context_tokens)
                for trajectory in trajectories:
                    for key, value in trl_fields(trajectory).items():
                        out[key].append(value)
                    out["outcome"].append(float(trajectory.outcome or 0.0))
                    out["format_penalty"].append(float(sum(
                        t.format_reward or 0.0 for t in trajectory.turns)))
                    out["task_id"].append(trajectory.task_id)
            calls[0] += 1
        finally:
            model.train(was_training)
        return out

    return rollout_func


def _runs(prompts: Sequence[Any]) -> list[tuple[str, int]]:
    """(question, count) for each run of equal consecutive prompts (TRL's repeats)."""
    runs: list[tuple[str, int]] = []
    for prompt in prompts:
        text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        if runs and runs[-1][0] == text:
            runs[-1] = (text, runs[-1][1] + 1)
        else:
            runs.append((text, 1))
    return runs


def outcome_reward(prompts: list[Any], completions: list[Any], outcome: list[float],
                   **kwargs: Any) -> list[float]:
    """The episode's outcome score (the environment's answer scoring) per completion."""
    return [float(x) for x in outcome]


def format_reward(prompts: list[Any], completions: list[Any], format_penalty: list[float],
                  **kwargs: Any) -> list[float]:
    """The sum of the episode's turn-level format penalties (0 or negative)."""
    return [float(x) for x in format_penalty]
