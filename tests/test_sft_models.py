"""The SFT pipeline loads any causal LM: a tiny config model or a local model directory."""

from __future__ import annotations

import pytest
import torch

from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm
from trainers.sft.config import ModelConfig, from_dict
from trainers.sft.pipeline import build_model


def test_local_model_directory_loads_with_its_weights_in_train_mode(tmp_path):
    tokenizer = build_chatml_tokenizer(["a small corpus for a small tokenizer"] * 4,
                                       vocab_size=300)
    saved = build_tiny_causal_lm(tokenizer, hidden=64, layers=1, seed=3)
    saved.save_pretrained(tmp_path)
    loaded = build_model(ModelConfig(name=str(tmp_path)), tokenizer)
    assert loaded.training
    for (name, a), (_, b) in zip(saved.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    ids = torch.tensor([tokenizer.encode("a small corpus")])
    with torch.no_grad():
        assert torch.allclose(saved.eval()(ids).logits, loaded.eval()(ids).logits)


def test_unknown_model_name_is_a_clear_error(tmp_path):
    tokenizer = build_chatml_tokenizer(["x y z"] * 4, vocab_size=300)
    missing = tmp_path / "missing"
    with pytest.raises(ValueError, match="neither a GGUF file nor a directory") as caught:
        build_model(ModelConfig(name=str(missing)), tokenizer)
    assert str(missing) in str(caught.value)
    assert "local Hugging Face cache" in str(caught.value)


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_grown_model_computes_the_same_logits_and_its_new_layers_learn(tmp_path, arch):
    """Block expansion: new layers start as the identity (same logits, same cached
    generation), get gradients, and the grown model saves and loads with its new depth."""
    from trainers.modeling.grow import grow_layers

    tokenizer = build_chatml_tokenizer(["a small corpus for a small tokenizer"] * 4,
                                       vocab_size=300)
    model = build_tiny_causal_lm(tokenizer, arch=arch, hidden=64, layers=3, seed=5)
    grown = grow_layers(model, [0, 2])
    assert grown.config.num_hidden_layers == 5 and model.config.num_hidden_layers == 3
    assert not grown.training
    layers = grown.model.layers
    for new, source in ((1, 0), (4, 2)):
        assert not layers[new].self_attn.o_proj.weight.any()
        assert not layers[new].mlp.down_proj.weight.any()
        assert torch.equal(layers[new].self_attn.q_proj.weight,
                           model.model.layers[source].self_attn.q_proj.weight)
    for old, kept in ((0, 0), (1, 2), (2, 3)):  # the original layers, in order, unchanged
        assert torch.equal(layers[kept].mlp.down_proj.weight,
                           model.model.layers[old].mlp.down_proj.weight)
    ids = torch.tensor([tokenizer.encode("a small corpus for a small")])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, grown(ids).logits, atol=1e-6)
        prompt = {"input_ids": ids, "max_new_tokens": 6, "do_sample": False}
        assert torch.equal(model.generate(**prompt), grown.generate(**prompt))
    grown.train()
    grown(ids, labels=ids).loss.backward()
    assert layers[1].self_attn.o_proj.weight.grad.abs().sum() > 0
    assert layers[4].mlp.down_proj.weight.grad.abs().sum() > 0
    grown.save_pretrained(tmp_path)
    loaded = build_model(ModelConfig(name=str(tmp_path)), tokenizer)
    assert loaded.config.num_hidden_layers == 5
    assert torch.equal(loaded.model.layers[4].mlp.up_proj.weight, layers[4].mlp.up_proj.weight)


def test_model_config_grows_a_loaded_model_and_refuses_bad_indices(tmp_path):
    from trainers.modeling.grow import grow_layers

    tokenizer = build_chatml_tokenizer(["x y z"] * 4, vocab_size=300)
    saved = build_tiny_causal_lm(tokenizer, hidden=64, layers=2, seed=1)
    saved.save_pretrained(tmp_path)
    grown = build_model(ModelConfig(name=str(tmp_path), grow_layers_after=(1,)), tokenizer)
    assert grown.training and grown.config.num_hidden_layers == 3
    with pytest.raises(ValueError, match=r"distinct layer indices in \[0, 2\), got \[2\]"):
        grow_layers(saved, [2])
    with pytest.raises(ValueError, match="distinct layer indices"):
        grow_layers(saved, [0, 0])
    with pytest.raises(ValueError, match=r"grow_layers_after must be distinct layer indices "
                                         r">= 0, got \[1, 1\]"):
        ModelConfig(grow_layers_after=(1, 1))
    with pytest.raises(ValueError, match=r"model.grow_layers_after\[0\] must be int, got 0.5"):
        from_dict(ModelConfig, {"grow_layers_after": [0.5]}, where="model")
    other = build_tiny_causal_lm(tokenizer, arch="llama", hidden=64, layers=1)
    other.config.model_type = "gpt2"  # stands in for an architecture grow_layers cannot grow
    with pytest.raises(ValueError, match="grow_layers supports model types .* got 'gpt2'"):
        grow_layers(other, [0])


def test_lora_trains_adapters_only_and_saves_a_merged_plain_checkpoint(tmp_path):
    pytest.importorskip("peft")
    from trainers.sft.pipeline import save_model

    tokenizer = build_chatml_tokenizer(["a small corpus for a small tokenizer"] * 4,
                                       vocab_size=300)
    build_tiny_causal_lm(tokenizer, hidden=64, layers=2, seed=2).save_pretrained(tmp_path / "base")
    model = build_model(ModelConfig(name=str(tmp_path / "base"), lora_rank=4), tokenizer)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in name for name in trainable)
    with torch.no_grad():  # B starts at zero; give the adapters a delta to merge
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.05)
    save_model(model, tmp_path / "final")
    loaded = build_model(ModelConfig(name=str(tmp_path / "final")), tokenizer)
    assert not any(".lora_" in name for name in loaded.state_dict())
    ids = torch.tensor([tokenizer.encode("a small corpus")])
    with torch.no_grad():
        base = build_model(ModelConfig(name=str(tmp_path / "base")), tokenizer).eval()(ids)
        merged, adapted = loaded.eval()(ids).logits, model.eval()(ids).logits
    assert torch.allclose(merged, adapted, atol=1e-5)
    assert not torch.allclose(merged, base.logits, atol=1e-3)
    with pytest.raises(ValueError, match="model.lora_rank must be >= 0"):
        ModelConfig(lora_rank=-1)
    with pytest.raises(ValueError, match="model.dtype must be one of"):
        ModelConfig(dtype="fp8")
