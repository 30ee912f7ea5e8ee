"""LoRA adapters (through peft, the optional `lora` extra) on a plain transformers model.

    model = apply_lora(model, LoraSettings(rank=8))   # base frozen, adapters trainable
    weights = merged_state_dict(model)                 # base + B @ A * scale, base names

The adapters are injected into the model in place (peft.inject_adapter_in_model) instead
of wrapping it in a PeftModel: the model keeps its forward signature (logits_to_keep, the KV
cache argument) and every caller that scores with it works unchanged. Engines receive
merged weights under the base model's parameter names, so an engine never knows LoRA was
used and a saved policy is a normal checkpoint.

Where we deviate from DR-Venus and why: DR-Venus trains all weights; LoRA is offered for
models that do not fit full fine-tuning on the user's hardware.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

LORA_INSTALL_HINT = "pip install 'venus-gym[lora]' (or: pip install peft)"
ADAPTER_NAME = "default"
DEFAULT_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                    "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraSettings:
    """rank: adapter rank r (> 0); alpha: scale numerator (delta = B @ A * alpha / r);
    dropout: dropout on the adapter input; targets: module names to adapt."""

    rank: int
    alpha: float = 16.0
    dropout: float = 0.0
    targets: Sequence[str] = DEFAULT_TARGETS


def _peft() -> Any:
    try:
        import peft
    except ImportError:
        raise ImportError(f"LoRA needs peft, which is not installed: {LORA_INSTALL_HINT}") \
            from None
    return peft


def apply_lora(model: Any, settings: LoraSettings) -> Any:
    """Inject LoRA adapters into `model` in place, freeze every other parameter; returns it.
    B starts at zero (peft's default), so the model computes what it computed before."""
    if settings.rank <= 0:
        raise ValueError(f"LoRA rank must be > 0, got {settings.rank}")
    peft = _peft()
    config = peft.LoraConfig(r=settings.rank, lora_alpha=settings.alpha,
                             lora_dropout=settings.dropout, target_modules=list(settings.targets),
                             bias="none")
    try:
        model = peft.inject_adapter_in_model(config, model, adapter_name=ADAPTER_NAME)
    except ValueError as error:  # no target module matched
        raise ValueError(f"LoRA targets {list(settings.targets)} match no module of the model: "
                         f"{error}") from None
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(".lora_" in name)
    return model


def has_lora(model: Any) -> bool:
    return any(".lora_" in name for name, _ in model.named_parameters())


def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The weights of `model` with every adapter merged into its base weight (base + delta),
    under the base model's names, detached on the CPU. `model` itself is left unchanged."""
    from peft.tuners.lora import LoraLayer

    merged: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        if ".lora_" in key:
            continue
        merged[key.replace(".base_layer.", ".")] = value.detach().cpu().clone()
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, LoraLayer) and ADAPTER_NAME in module.lora_A:
                key = f"{name}.weight"
                delta = module.get_delta_weight(ADAPTER_NAME).detach().cpu()
                merged[key] = (merged[key].float() + delta.float()).to(merged[key].dtype)
    return merged
