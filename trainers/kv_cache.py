"""Reusing a conversation's KV cache across turns: the helpers both local decoders share.

A multi-turn episode's next prompt is the previous prompt, the ids just generated, the
environment's reply and the next generation prompt: everything but the last two is already
in the KV cache of the turn before. Keys and values at a position depend only on the ids up
to it (causal attention, explicit position ids), so the cache of any common prefix of the
cached ids and the new prompt serves the new prompt exactly; only the rest is prefilled.

    keep = reusable_prefix(cached_ids, prompt)    # positions of the cache the prompt reuses
    rows = cache_rows(cache)                      # per layer (keys, values), [B, H, T, D]
    cache = cache_from_rows([(k[..., :keep, :], v[..., :keep, :]) for k, v in rows])

`trainers.policy.TransformersPolicy` keeps one conversation's cache this way and
`trainers.engines.hf.HFEngine` one per conversation it has seen (matched by token prefix).
A cache is cut by slicing its tensors and building a new cache object, never with
`Cache.crop`, whose argument changed meaning between transformers 5.17 (the length to keep)
and 5.24 (minus the number of tokens to remove).

Exactness: the reused keys and values are the ones a full prefill would compute, but the new
tokens' attention then runs over a cache chunk and a new chunk rather than one matrix, so
float sums are ordered differently: log-probs agree with re-encoding to ~1e-6 in float32
(tests/test_engine_kv_cache.py), and ids agree unless two logits tie to that precision.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache

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


def crop_cache(cache: Any, keep: int) -> Any:
    """A cache of the first `keep` positions of `cache` (a new object; slices, no copies)."""
    return cache_from_rows([(k[..., :keep, :], v[..., :keep, :]) for k, v in cache_rows(cache)])
