"""Per-sample ("varlen") attention for packed rows on any device, flash-attn style.

A packed row holds several samples that must not attend to each other. A dense
block-diagonal [L, L] mask is exact but makes every row cost O(L^2) attention whatever its
samples' lengths. `varlen_attention` instead runs causal SDPA separately on each sample's
[start, end) span (the `cu_seqlens` of flash-attention's varlen kernels), so a row costs
sum(len_i^2): packing keeps the cost of attention per sample while removing padding.

It is a transformers attention function (registered with `AttentionInterface` as
VARLEN_ATTENTION); the spans travel through a context variable set by `packed_spans(...)`,
as in trainers.algorithms.packed_attention, so any decoder dispatching through AttentionInterface works.
Tokens outside every span (row padding) get zero outputs; they carry no labels.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from trainers.modeling.attention_override import attention_override

VARLEN_ATTENTION = "venus_sft_varlen"

_SPANS: contextvars.ContextVar[Sequence[Sequence[tuple[int, int]]] | None] = \
    contextvars.ContextVar("venus_sft_spans", default=None)


def varlen_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                     **kwargs):
    """query [B, H, L, D], key/value [B, H_kv, L, D] -> ([B, L, H, D], None)."""
    spans = _SPANS.get()
    if spans is None:
        raise RuntimeError("varlen attention called outside `packed_spans(...)`")
    if kwargs.get("sliding_window") is not None or kwargs.get("softcap") is not None:
        raise NotImplementedError("varlen attention supports neither sliding windows nor "
                                  "softcapping")
    output = torch.zeros_like(query)
    gqa = query.shape[1] != key.shape[1]
    p = dropout if module.training else 0.0
    for row, row_spans in enumerate(spans):
        for start, end in row_spans:
            output[row:row + 1, :, start:end] = F.scaled_dot_product_attention(
                query[row:row + 1, :, start:end], key[row:row + 1, :, start:end],
                value[row:row + 1, :, start:end], is_causal=True, dropout_p=p, scale=scaling,
                enable_gqa=gqa)
    return output.transpose(1, 2).contiguous(), None


AttentionInterface.register(VARLEN_ATTENTION, varlen_attention)


@contextlib.contextmanager
def packed_spans(model: torch.nn.Module, spans: Sequence[Sequence[tuple[int, int]]]
                 ) -> Iterator[None]:
    """Run `model` with varlen attention over `spans` (per row, the [start, end) of each
    sample), restoring the model's own attention implementation afterwards."""
    with attention_override(model, VARLEN_ATTENTION, _SPANS, spans):
        yield
