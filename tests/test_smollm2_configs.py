"""The SmolLM2 example configs (examples/configs/smollm2_sft.yaml -> smollm2_igpo.yaml) end to
end at CI size: the shipped files, loaded and shortened in code (a few examples, one or two
steps, short turns), then run through the same functions `venus-gym sft` and `venus-gym rl`
call. Checks: the SFT output is a plain transformers checkpoint whose weights moved away
from the de-quantised GGUF base and that carries SmolLM2's own chat template; the RL run
trains on trajectories rendered with that template whose loss masks cover exactly the
generated turns; its final policy reloads with the weights the run ended with, and its
log-probs differ from the SFT policy's (the optimizer's step reached the saved weights; at
this size the turns are too short to be valid, so the step that moves them is AdamW's weight
decay, not a learning signal). Also: the GPU config parses and validates."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from trainers.modeling.models import ModelNotAvailableError, load_policy, smollm2_gguf_path
from trainers.rl.config import load_rl_config
from trainers.sft.config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "examples" / "configs"


def _gguf_missing() -> str:
    try:
        smollm2_gguf_path()
    except ModelNotAvailableError as error:
        return str(error)
    return ""


pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(_gguf_missing()), reason=_gguf_missing() or "-")]


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory, request):
    """smollm2_sft.yaml shortened to 2 episodes, 2 steps and one 2-turn held-out task; returns
    (output directory, the base weights the run started from, its results)."""
    import trainers.sft.recipe as recipe

    config = load_config(CONFIGS / "smollm2_sft.yaml")
    output = tmp_path_factory.mktemp("smollm2_sft")
    config.data = dataclasses.replace(config.data, num_episodes=2, max_seq_len=1024)
    config.train = dataclasses.replace(config.train, max_steps=2, warmup_ratio=0.0,
                                       output_dir=str(output), log_every=1)
    config.eval = dataclasses.replace(config.eval, num_tasks=1, max_turns=2, max_new_tokens=16)
    base: dict[str, torch.Tensor] = {}
    prepare = recipe.prepare_model

    def recording_prepare(*args, **kwargs):  # the weights SFT starts from, before any step
        model = prepare(*args, **kwargs)
        base.update({k: v.detach().clone() for k, v in model.state_dict().items()})
        return model

    patch = pytest.MonkeyPatch()
    patch.setattr(recipe, "prepare_model", recording_prepare)
    try:
        results = recipe.train_and_evaluate(config)
    finally:
        patch.undo()
        torch.set_num_threads(1)  # the config asks for 2; the suite runs single-threaded
    return output, base, results


def policy_logprobs(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """log pi(ids[t] | ids[:t]) for t >= 1."""
    with torch.no_grad():
        logits = model.eval()(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_sft_output_is_a_plain_checkpoint_that_moved_from_the_base(sft_run):
    output, base, results = sft_run
    final = output / "final"
    config = json.loads((final / "config.json").read_text())
    assert "quantization_config" not in config  # the GGUF flags were cleared
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(final).state_dict()
    assert saved.keys() <= base.keys() and saved
    moved = [k for k in saved if not torch.equal(saved[k], base[k])]
    assert len(moved) > len(saved) // 2, f"only {moved} changed"
    # SmolLM2's own (prefix-stable) template travels with the checkpoint.
    tokenizer, chat = load_policy(final)[1:]
    assert "<|im_start|>" in tokenizer.chat_template and "SmolLM" in tokenizer.chat_template
    assert chat.chat_template == tokenizer.chat_template
    saved_eval = json.loads((output / "eval.json").read_text())
    assert saved_eval["train_loss_last"] == results["train_loss_last"] > 0
    assert 0.0 <= saved_eval["format_valid_rate"] <= 1.0


def test_igpo_from_the_sft_output_trains_saves_and_reloads(sft_run, tmp_path):
    from trainers.rl.driver import train

    sft_final = sft_run[0] / "final"
    config = load_rl_config(CONFIGS / "smollm2_igpo.yaml")
    config.policy = dataclasses.replace(config.policy, path=str(sft_final), threads=1)
    config.env = dataclasses.replace(config.env, max_turns=2, max_context_tokens=1536)
    config.rollout = dataclasses.replace(config.rollout, group_size=2, max_turn_tokens=16,
                                         max_context_tokens=2048)
    # At this size every 16-token turn is malformed, so every advantage is 0 and a correct
    # learner leaves the weights alone. For the save / reload check the step must move them:
    # AdamW's decoupled weight decay does, by a factor 1 - lr * weight_decay = 1 - 1e-6.
    config.learner = dataclasses.replace(config.learner, micro_batch_size=1, lr=1e-4,
                                         weight_decay=0.01)
    config.run = dataclasses.replace(config.run, steps=1, save_every=1, tensorboard="off",
                                     output_dir=str(tmp_path / "rl"))
    config.eval = dataclasses.replace(config.eval, num_tasks=1, max_turn_tokens=16)

    result = train(config, keep_trajectories=True)

    trajectories = result.trajectories[0]
    assert len(trajectories) == 2 and result.before["tasks"] == result.after["tasks"] == 1
    tokenizer, chat = load_policy(sft_final)[1:]
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for trajectory in trajectories:
        ids, mask, spans = trajectory.input_ids, trajectory.loss_mask, trajectory.turn_spans
        # The prompt is SmolLM2's template render of the system prompt and the question.
        prompt = tokenizer.apply_chat_template(trajectory.messages[:2], tokenize=True,
                                               add_generation_prompt=True)
        prompt = list(prompt["input_ids"] if not isinstance(prompt, list) else prompt)
        assert ids[:spans[0][0]] == prompt
        # Mask 1 on exactly the generated turns, each ending in <|im_end|> or cut at the cap.
        inside = {i for start, stop in spans for i in range(start, stop)}
        assert [i for i, m in enumerate(mask) if m] == sorted(inside)
        for start, stop in spans:
            assert ids[stop - 1] == end_of_turn or stop - start == config.rollout.max_turn_tokens
    # The final policy reloads with exactly the weights the run ended with ...
    rl_model, rl_tokenizer, _ = load_policy(Path(config.run.output_dir) / "final")
    reloaded = rl_model.state_dict()
    assert all(torch.equal(reloaded[k], v) for k, v in result.weights.items())
    assert rl_tokenizer.chat_template == tokenizer.chat_template
    # ... and scores a trajectory differently from the SFT policy it started from.
    sft_model = load_policy(sft_final)[0]
    ids = trajectories[0].input_ids
    delta = (policy_logprobs(rl_model, ids) - policy_logprobs(sft_model, ids)).abs().max()
    assert delta > 1e-6, f"the update did not reach the saved policy (max log-prob change {delta})"
    saved = json.loads((Path(config.run.output_dir) / "eval.json").read_text())
    assert saved["before"]["tasks"] == saved["after"]["tasks"] == 1
