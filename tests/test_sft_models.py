"""The SFT pipeline loads any causal LM: a tiny config model or a local model directory."""

from __future__ import annotations

import pytest
import torch

from trainers.models import build_chatml_tokenizer, build_tiny_causal_lm
from trainers.sft.config import ModelConfig
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
    with pytest.raises(ValueError, match="local directory"):
        build_model(ModelConfig(name=str(tmp_path / "missing")), tokenizer)
