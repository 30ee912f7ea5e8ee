"""Reusing a conversation's KV cache across turns: the transformers engine's cache helpers.

A multi-turn episode's next prompt is the previous prompt, the ids just generated, the
environment's reply and the next generation prompt: everything but the last two is already
in the KV cache of the turn before. Keys and values at a position depend only on the ids up
to it (causal attention, explicit position ids), so the cache of any common prefix of the
cached ids and the new prompt serves the new prompt exactly; only the rest is prefilled.

    keep = reusable_prefix(cached_ids, prompt)    # positions of the cache the prompt reuses
    rows = cache_rows(cache)                      # per layer (keys, values), [B, H, T, D]
    cache = cache_from_rows(rows)                 # a DynamicCache holding them
    cache = reserved_cache(cache, max_new_tokens) # room to decode in place

`trainers.engines.hf.HFEngine` keeps one cache per conversation it has seen (matched by token
prefix).
A kept cache is reused by slicing its tensors into a new cache object, never with
`Cache.crop`, whose argument changed meaning between transformers 5.17 (the length to keep)
and 5.24 (minus the number of tokens to remove).

Exactness: the reused keys and values are the ones a full prefill would compute, but the new
tokens' attention then runs over a cache chunk and a new chunk rather than one matrix, so
float sums are ordered differently: log-probs agree with re-encoding to ~1e-5 in float32
(tests/test_engine_kv_cache.py), and ids agree unless two logits tie to that precision.

Decoding appends one position per step. transformers' DynamicLayer concatenates, copying
the whole cache every step (~70% of a decode step at 3,000 positions on a CPU);
`reserved_cache` copies once into buffers with room for the decode and writes in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

KVLayers = list[tuple[torch.Tensor, torch.Tensor]]


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """The number of leading ids `a` and `b` share."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):  # the usual case (the prompt extends the cache): one C compare
        return n
    differ = torch.tensor(list(a[:n])) != torch.tensor(list(b[:n]))
    return int(differ.nonzero()[0, 0])


def reusable_prefix(cached_ids: Sequence[int], prompt: Sequence[int]) -> int:
    """How many leading positions of a cache holding `cached_ids` serve `prompt`.

    Their common prefix, less one when it covers the whole prompt: the prompt's last id must
    go through the model to give the next token's logits. 0 means a full prefill.
    """
    return min(common_prefix_length(cached_ids, prompt), len(prompt) - 1)


def cache_rows(cache: Any) -> KVLayers:
    """Per layer (keys, values) of a transformers cache, each [batch, heads, length, dim]."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def cache_from_rows(layers: KVLayers) -> Any:
    """A transformers DynamicCache holding these per-layer (keys, values) tensors."""
    return DynamicCache(ddp_cache_data=layers)


class _ReservedLayer(DynamicLayer):
    """A DynamicLayer that writes new positions into buffers reserved up front instead of
    concatenating (DynamicLayer copies the whole layer every decode step: ~70% of a step's
    time at 3,000 positions on a CPU). Grows by doubling if the reserve runs out."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int):
        super().__init__()
        self.length = 0
        self._key_buffer = keys.new_empty(keys.shape[:2] + (capacity, keys.shape[3]))
        self._value_buffer = values.new_empty(values.shape[:2] + (capacity, values.shape[3]))
        self.device = keys.device
        self.is_initialized = True
        self.update(keys, values)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + key_states.shape[-2]
        if end > self._key_buffer.shape[2]:
            self._key_buffer = self._grown(self._key_buffer, end)
            self._value_buffer = self._grown(self._value_buffer, end)
        self._key_buffer[:, :, self.length:end] = key_states
        self._value_buffer[:, :, self.length:end] = value_states
        self.length = end
        self.keys = self._key_buffer[:, :, :end]
        self.values = self._value_buffer[:, :, :end]
        return self.keys, self.values

    def _grown(self, buffer: torch.Tensor, needed: int) -> torch.Tensor:
        grown = buffer.new_empty(buffer.shape[:2] + (max(needed, 2 * buffer.shape[2]),
                                                     buffer.shape[3]))
        grown[:, :, :self.length] = buffer[:, :, :self.length]
        return grown

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a reserved cache is not cut in place: slice its rows "
                                  "(trainers.engines.kv_cache.cache_rows) into a new cache")


def reserved_cache(cache: Any, extra: int) -> Any:
    """A copy of `cache` with room for `extra` more positions per layer, written in place."""
    reserved = DynamicCache()
    reserved.layers = [_ReservedLayer(keys, values, keys.shape[2] + extra)
                       for keys, values in cache_rows(cache)]
    return reserved
