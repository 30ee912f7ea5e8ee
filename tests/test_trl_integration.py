"""TRL's GRPOTrainer on DeepResearch-v0 through trainers.integrations.trl: one training step
with a tiny model, on exactly the ids and masks of the project's own rollouts."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

from trainers.integrations.trl import (  # noqa: E402
    format_reward,
    make_rollout_func,
    outcome_reward,
    task_dataset,
    trl_fields,
)
from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm  # noqa: E402
from trainers.modeling.tokenization import ChatTokenizer  # noqa: E402
from trainers.rollout import SamplingConfig  # noqa: E402

ENV = {"world_size": 100, "world_seed": 1, "max_turns": 2, "tool_timeout_s": 5.0}
pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]


@pytest.fixture(scope="module")
def setup():
    from envs.group import DeepResearchGroupEnv

    group = DeepResearchGroupEnv(group_size=1, **ENV)
    world = group.envs[0].world
    texts = [group.system_prompt] + [f"{p.title}\n{p.text}" for p in world.corpus]
    texts += [t.question for t in world.tasks]
    group.close()
    tokenizer = build_chatml_tokenizer(texts, vocab_size=600)
    return ChatTokenizer(tokenizer), build_tiny_causal_lm(tokenizer, hidden=32, layers=1, seed=0)


def test_grpo_trainer_trains_one_step_on_the_trajectories_ids_and_masks(setup, tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    chat, model = setup
    rollout = make_rollout_func(chat, ENV, sampling=SamplingConfig(max_turn_tokens=8, seed=0),
                                max_context_tokens=2048)
    played = []

    def recording_rollout(prompts, trainer):
        assert len(prompts) == 2 and prompts[0] == prompts[1]  # TRL's repeats: one group
        out = rollout(prompts, trainer)
        assert trainer.model.training  # the engine's eval mode was undone
        played.append(out)
        return out

    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2,
                      num_generations=2, max_steps=1, max_completion_length=256,
                      logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
                      bf16=False, beta=0.0)
    trainer = GRPOTrainer(model=model, processing_class=chat.tokenizer, args=args,
                          train_dataset=task_dataset(ENV, limit=4),
                          reward_funcs=[outcome_reward, format_reward],
                          rollout_func=recording_rollout)
    seen = []
    original = trainer._generate_and_score_completions

    def capture(inputs):
        output = original(inputs)
        seen.append(output)
        return output

    trainer._generate_and_score_completions = capture
    result = trainer.train()
    assert result.global_step == 1 and played and seen
    out, batch = played[0], seen[0]
    assert "tool_mask" in batch  # env_mask reached the loss
    for row in range(2):  # what TRL trains on equals what the rollout produced
        length = len(out["completion_ids"][row])
        assert batch["completion_ids"][row].tolist()[:length] == out["completion_ids"][row]
        loss_mask = (batch["completion_mask"][row] * batch["tool_mask"][row]).tolist()
        assert loss_mask[:length] == out["env_mask"][row] and not any(loss_mask[length:])
        prompt = [i for i, m in zip(batch["prompt_ids"][row].tolist(),
                                    batch["prompt_mask"][row].tolist()) if m]
        assert prompt == out["prompt_ids"][row]


def test_trl_fields_split_a_trajectory_at_the_question_and_trim_trailing_template_ids(setup):
    from envs.group import DeepResearchGroupEnv
    from trainers.engines.hf import HFEngine
    from trainers.rollout import rollout_group

    chat, model = setup
    group = DeepResearchGroupEnv(group_size=2, **ENV)
    trajectories = rollout_group(HFEngine(model, chat.tokenizer), group, chat, seed=0,
                                 sampling=SamplingConfig(max_turn_tokens=8, seed=0))
    for t in trajectories:
        fields = trl_fields(t)
        n = len(fields["prompt_ids"]) + len(fields["completion_ids"])
        assert fields["prompt_ids"] + fields["completion_ids"] == t.input_ids[:n]
        assert fields["env_mask"] == t.loss_mask[len(fields["prompt_ids"]):n]
        assert fields["env_mask"][-1] == 1 and not any(t.loss_mask[n:])
        assert sum(fields["env_mask"]) == sum(t.loss_mask)
