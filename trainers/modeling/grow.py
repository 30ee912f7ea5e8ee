"""Block expansion (LLaMA Pro): give a trained decoder more layers without changing what it
computes.

`grow_layers(model, after)` inserts a new decoder layer after each listed index; SFT's
`model.grow_layers_after` calls it on the loaded base model before training.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

GROWABLE_MODEL_TYPES: tuple[str, ...] = ("qwen3", "qwen2", "llama")
# A Llama-style decoder layer writes to the residual stream only through these two.
OUTPUT_PROJECTIONS: tuple[str, ...] = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


def grow_layers(model: PreTrainedModel, after: Sequence[int]) -> PreTrainedModel:
    """Block expansion (LLaMA Pro, Wu et al. 2024): insert a new decoder layer after each
    layer index in `after`. The new layer is a copy of the one before it with its output
    projections (attention o_proj, MLP down_proj) zeroed, so it adds nothing to the residual
    stream: the grown model computes the same logits, and training then moves the new
    layers (their output projections get gradients at once, the rest once those are nonzero).
    Qwen3, Qwen2 and Llama models only (their one per-layer config list is `layer_types`).
    Returns a new model on the same device and in the same train / eval mode; `model` is
    left unchanged."""
    if model.config.model_type not in GROWABLE_MODEL_TYPES:
        raise ValueError(f"grow_layers supports model types {GROWABLE_MODEL_TYPES}, got "
                         f"{model.config.model_type!r}")
    layers = model.config.num_hidden_layers
    wrong = [index for index in after if not 0 <= index < layers]
    if wrong or len(set(after)) != len(after):
        raise ValueError(f"grow_layers: 'after' must hold distinct layer indices in [0, "
                         f"{layers}), got {list(after)}")
    order = []  # (source layer, is_new) for each layer of the grown model
    for index in range(layers):
        order.append((index, False))
        if index in after:
            order.append((index, True))
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = len(order)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[source] for source, _ in order]
    old = model.state_dict()
    new = {key: value for key, value in old.items() if not key.startswith("model.layers.")}
    for target, (source, is_new) in enumerate(order):
        prefix = f"model.layers.{source}."
        parts = {key[len(prefix):]: value for key, value in old.items() if key.startswith(prefix)}
        for name, value in parts.items():
            zero = is_new and name in OUTPUT_PROJECTIONS
            new[f"model.layers.{target}.{name}"] = torch.zeros_like(value) if zero \
                else value.clone()
    grown = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    grown.load_state_dict(new)
    grown.generation_config = copy.deepcopy(model.generation_config)
    return grown.to(model.device).train(model.training)
