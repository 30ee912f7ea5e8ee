"""Decode steps of a Llama-family causal LM without the transformers forward around them.

    if lean_decode_supported(model):
        decoder = LeanDecoder(model, cache, attention, extra=max_new_tokens)
        logits = decoder.step(next_ids, positions, live)   # [B, vocab] float32, on the CPU

With kept KV caches a rollout is almost all decode steps of one new position per row. Each
step of `model(...)` builds a causal mask from the 2-D attention mask, routes through the
cache object's bookkeeping and the attention dispatch, and runs the CPU flash-attention
kernel with a boolean mask, which for a single query is slower than two matmuls. This
module runs the same model's own modules (embeddings, rotary embedding, norms, projections,
MLPs, LM head; LoRA-wrapped projections work unchanged) over a reserved cache
(trainers.engines.kv_cache.reserved_cache) and an additive mask kept in a buffer: one column written
per step (0 for a live row, -inf for a row that finished and is fed padding), none rebuilt.

Supported: Qwen3, Qwen2 and Llama (full attention only: no sliding-window layers); anything
else uses the transformers forward (`lean_decode_supported` says which). Exactness: the
same operations as transformers' eager attention (scores = q k^T * scale + mask, float32
softmax, probs v), so log-probs agree with the transformers forward to float rounding (the
flash kernel sums in another order: up to ~6e-6 in float32 on a random test model's
log-probs of -20 and below) and with re-encoding within the kept-cache tolerance (tests/test_engine_kv_cache.py compares ids and log-probs across rows
of different lengths and rows that finished early).
"""

from __future__ import annotations

from typing import Any

import torch

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama")


def lean_decode_supported(model: Any) -> bool:
    """Whether `LeanDecoder` can run `model`'s decode steps (else use its forward)."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return False
    if getattr(config, "use_sliding_window", False):
        return False
    body = getattr(model, "model", None)
    return all(hasattr(body, name) for name in ("embed_tokens", "layers", "rotary_emb", "norm")) \
        and hasattr(model, "lm_head")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LeanDecoder:
    """Runs one-position decode steps over a reserved cache (module docstring).

    Args:
        model: a supported causal LM (`lean_decode_supported`), in eval mode.
        cache: the batch's reserved cache after the prefill (trainers.engines.kv_cache.
            reserved_cache); each step appends one position to every layer in place.
        attention: [B, cached positions] 0/1 mask of the prefill's columns (pads are 0).
        extra: how many steps to reserve mask columns for (grows if exceeded).
    """

    def __init__(self, model: Any, cache: Any, attention: torch.Tensor, extra: int):
        self.model = model
        self.layers = list(model.model.layers)
        self.cache_layers = cache.layers
        keys = self.cache_layers[0].keys
        if keys.shape[2] != attention.shape[1]:
            raise RuntimeError(f"the KV cache holds {keys.shape[2]} positions but the attention "
                               f"mask {attention.shape[1]}; cannot decode over it")
        self.length = attention.shape[1]
        self.mask = keys.new_zeros((attention.shape[0], 1, 1, self.length + extra))
        self.mask[:, 0, 0, :self.length].masked_fill_(attention.to(keys.device) == 0,
                                                      float("-inf"))

    @torch.no_grad()
    def step(self, ids: torch.Tensor, positions: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        """Feed one id per row; the next-token logits, float32 on the CPU.

        Args:
            ids: [B, 1] ids to feed (finished rows feed padding).
            positions: [B, 1] their position ids.
            live: [B] bool; False hides the fed position from attention (finished rows).
        """
        model = self.model
        device = self.mask.device
        if self.length == self.mask.shape[-1]:
            grown = self.mask.new_zeros(self.mask.shape[:3] + (2 * self.length,))
            grown[..., :self.length] = self.mask[..., :self.length]
            self.mask = grown
        self.mask[:, 0, 0, self.length] = torch.where(live.to(device), 0.0, float("-inf"))
        self.length += 1
        mask = self.mask[..., :self.length]

        hidden = model.model.embed_tokens(ids.to(device))
        cos, sin = model.model.rotary_emb(hidden, positions.to(device))
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        batch = hidden.shape[0]
        for layer, cache_layer in zip(self.layers, self.cache_layers):
            attn = layer.self_attn
            head_dim = attn.head_dim
            residual = hidden
            hidden = layer.input_layernorm(hidden)
            query = attn.q_proj(hidden).view(batch, 1, -1, head_dim)
            key = attn.k_proj(hidden).view(batch, 1, -1, head_dim)
            value = attn.v_proj(hidden).view(batch, 1, -1, head_dim).transpose(1, 2)
            if hasattr(attn, "q_norm"):  # Qwen3 normalises q and k per head
                query, key = attn.q_norm(query), attn.k_norm(key)
            query, key = query.transpose(1, 2), key.transpose(1, 2)
            query = query * cos + _rotate_half(query) * sin
            key = key * cos + _rotate_half(key) * sin
            keys, values = cache_layer.update(key, value)
            # Grouped-query attention: the n_rep query heads of a key/value head become the
            # query rows of that head ([B, kv_heads, n_rep, D]), so keys are not repeated.
            kv_heads = keys.shape[1]
            grouped = query.reshape(batch, kv_heads, -1, head_dim)
            scores = torch.matmul(grouped, keys.transpose(2, 3)) * attn.scaling + mask
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
            out = torch.matmul(probs, values).reshape(batch, 1, -1)
            hidden = residual + attn.o_proj(out)
            residual = hidden
            hidden = residual + layer.mlp(layer.post_attention_layernorm(hidden))
        hidden = model.model.norm(hidden)
        return model.lm_head(hidden[:, -1]).float()
