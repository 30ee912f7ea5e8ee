"""Attention for one packed forward `[trajectory | probe_1 | ... | probe_M]`.

The information-gain pass (trainers.algorithms.information_gain) scores M probes, each appended at
its own boundary b_m of one trajectory of length L, in a single forward. The attention
pattern, defined once in `probe_visibility`, is:

    trajectory query i   sees trajectory keys j <= i              (plain causal)
    probe-m query        sees trajectory keys j < b_m  and  probe-m keys causally

with position ids continuing from b_m inside probe m, so every probe token computes exactly
what it would compute in a separate forward over `trajectory[:b_m] + probe_m`.

Three interchangeable backends implement that pattern:

- dense:        the full [N, N] boolean mask, given to the model's ordinary SDPA path.
                Simple and obviously right; O(N^2) memory, used for short sequences.
- blocksparse:  a custom attention function (registered with transformers'
                AttentionInterface) that never builds the N x N mask. Trajectory queries run
                SDPA with is_causal over the trajectory only. Probe queries are cut into
                chunks of consecutive probes (sorted by boundary); a chunk attends to the
                trajectory prefix up to its largest boundary plus its own probe keys, with a
                small [chunk queries, prefix + chunk keys] mask. Work is ~L^2/2 + Q * b_avg
                instead of (L + Q)^2, and memory is bounded by the chunk size. One SDPA call
                per chunk and per layer: no Python loop per boundary.
- flex:         torch's flex_attention with a BlockMask built from `probe_visibility`.
                On CPU in torch 2.13 it works eagerly (the unfused reference, materialising
                all scores: tests only) or compiled: about 27 s of compilation per new shape
                plus 3.6 s to build the block mask eagerly at 5.6K tokens on the 2-core dev
                machine, and the compiled kernel was not faster there than blocksparse. So it
                is opt-in (meant for GPUs, where compilation is amortised), never the default.

The layout travels to the attention function through a context variable rather than the
model's kwargs, so any transformers decoder that dispatches through AttentionInterface
works, whatever its forward signature forwards.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from trainers.modeling.attention_override import attention_override

BLOCKSPARSE = "venus_probe_blocksparse"
FLEX = "venus_probe_flex"

_ACTIVE_LAYOUT: contextvars.ContextVar[PackedProbeLayout | None] = contextvars.ContextVar(
    "venus_probe_layout", default=None)


@dataclass
class PackedProbeLayout:
    """Where the trajectory and the probes sit in one packed sequence of N tokens.

    trajectory_length: L, the trajectory occupies packed positions [0, L).
    segment:           [N] int64, -1 on trajectory tokens, the probe id m on probe tokens.
    visible_prefix:    [N] int64, b_m on probe-m tokens (0 on trajectory tokens, unused).
    position_ids:      [N] int64, 0..L-1 on the trajectory, b_m + offset inside probe m.
    chunks:            (query_start, query_end, prefix_length) per blocksparse chunk: queries
                       [query_start, query_end) attend to trajectory keys [0, prefix_length)
                       and to their own queries' keys.
    block_mask:        flex_attention BlockMask (flex backend only).
    flex_compiled:     run flex_attention through torch.compile (False: eager, tests only).
    """

    trajectory_length: int
    segment: torch.Tensor
    visible_prefix: torch.Tensor
    position_ids: torch.Tensor
    chunks: list[tuple[int, int, int]] = field(default_factory=list)
    block_mask: object | None = None
    flex_compiled: bool = True
    mask_cache_elements: int = 1 << 27
    _mask_cache: dict = field(default_factory=dict, repr=False)

    @property
    def total_length(self) -> int:
        return int(self.segment.shape[0])

    def chunk_masks(self, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per chunk: (key positions [prefix + queries], additive mask [queries, keys]).

        Additive float masks (0 / -inf) in the attention dtype, because SDPA turns a bool
        mask into one anyway on every call. Every layer of a forward uses the same masks, so
        they are built once and cached when they fit in `mask_cache_elements` entries.
        """
        cached = self._mask_cache.get(dtype)
        if cached is not None:
            return cached
        masks = []
        device = self.segment.device
        for query_start, query_end, prefix in self.chunks:
            key_index = torch.cat([torch.arange(prefix, device=device),
                                   torch.arange(query_start, query_end, device=device)])
            query_index = torch.arange(query_start, query_end, device=device)
            visible = probe_visibility(self, query_index[:, None], key_index[None, :])
            additive = torch.zeros(visible.shape, dtype=dtype, device=device)
            masks.append((key_index, additive.masked_fill_(~visible, float("-inf"))))
        if sum(mask.numel() for _, mask in masks) <= self.mask_cache_elements:
            self._mask_cache[dtype] = masks
        return masks


def probe_visibility(layout: PackedProbeLayout, q_idx: torch.Tensor,
                     kv_idx: torch.Tensor) -> torch.Tensor:
    """True where query q_idx may attend to key kv_idx (broadcasting index tensors).

    The single definition of the packed attention pattern; every backend derives from it.
    """
    q_segment = layout.segment[q_idx]
    kv_segment = layout.segment[kv_idx]
    same_sequence_causal = (kv_idx <= q_idx) & (kv_segment == q_segment)
    probe_sees_prefix = (q_segment >= 0) & (kv_segment < 0) & (kv_idx < layout.visible_prefix[q_idx])
    return same_sequence_causal | probe_sees_prefix


def plan_chunks(trajectory_length: int, probe_starts: torch.Tensor, probe_ends: torch.Tensor,
                probe_boundaries: torch.Tensor, chunk_query_tokens: int,
                max_mask_elements: int) -> list[tuple[int, int, int]]:
    """Group consecutive probes (already sorted by boundary) into attention chunks.

    A chunk closes before it would exceed `chunk_query_tokens` queries or a mask of
    `max_mask_elements` (queries x (prefix + queries)); a single probe always fits.
    Small chunks skip more of the masked-out prefix (block sparsity), large ones make fewer,
    bigger SDPA calls; ~384 queries was the sweet spot on CPU (docs/benchmarks.md).
    """
    chunks: list[tuple[int, int, int]] = []
    starts, ends, bounds = probe_starts.tolist(), probe_ends.tolist(), probe_boundaries.tolist()
    first = 0
    for m in range(1, len(starts) + 1):
        if m < len(starts):
            queries = ends[m] - starts[first]
            mask_size = queries * (bounds[m] + queries)
            if queries <= chunk_query_tokens and mask_size <= max_mask_elements:
                continue
        chunks.append((trajectory_length + starts[first], trajectory_length + ends[m - 1],
                       max(bounds[first:m])))
        first = m
    return chunks


def dense_mask(layout: PackedProbeLayout) -> torch.Tensor:
    """[1, 1, N, N] bool mask (True = attend) for the dense backend."""
    positions = torch.arange(layout.total_length, device=layout.segment.device)
    return probe_visibility(layout, positions[:, None], positions[None, :])[None, None]


def _check_supported(module: torch.nn.Module, query: torch.Tensor, kwargs: dict) -> None:
    if query.shape[0] != 1:
        raise ValueError("packed probe attention expects batch size 1 (one packed trajectory)")
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError("packed probe attention does not support sliding-window layers")
    if kwargs.get("softcap") is not None:
        raise NotImplementedError("packed probe attention does not support attention softcapping")


def _active_layout() -> PackedProbeLayout:
    layout = _ACTIVE_LAYOUT.get()
    if layout is None:
        raise RuntimeError("packed probe attention called outside trainers.algorithms.information_gain; "
                           "use `packed_probe_attention(model, layout, backend)`")
    return layout


def blocksparse_probe_attention(module, query, key, value, attention_mask, dropout=0.0,
                                scaling=None, **kwargs):
    """transformers attention function: query/key/value [1, heads, N, head_dim].

    Returns ([1, N, heads, head_dim], None) like transformers' own SDPA function.
    """
    _check_supported(module, query, kwargs)
    layout = _active_layout()
    L = layout.trajectory_length
    gqa = query.shape[1] != key.shape[1]
    outputs = [F.scaled_dot_product_attention(
        query[:, :, :L], key[:, :, :L], value[:, :, :L], is_causal=True, scale=scaling,
        enable_gqa=gqa)]
    for (query_start, query_end, prefix), (_, mask) in zip(layout.chunks,
                                                         layout.chunk_masks(query.dtype)):
        # Keys of the chunk: the trajectory prefix it may see, then its own probe tokens.
        chunk_keys = torch.cat([key[:, :, :prefix], key[:, :, query_start:query_end]], dim=2)
        chunk_values = torch.cat([value[:, :, :prefix], value[:, :, query_start:query_end]], dim=2)
        outputs.append(F.scaled_dot_product_attention(
            query[:, :, query_start:query_end], chunk_keys, chunk_values, attn_mask=mask,
            scale=scaling, enable_gqa=gqa))
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


_COMPILED_FLEX = None


def _flex_attention(compiled: bool):
    from torch.nn.attention.flex_attention import flex_attention

    global _COMPILED_FLEX
    if not compiled:
        return flex_attention
    if _COMPILED_FLEX is None:
        _COMPILED_FLEX = torch.compile(flex_attention, dynamic=False)
    return _COMPILED_FLEX


def flex_probe_attention(module, query, key, value, attention_mask, dropout=0.0,
                         scaling=None, **kwargs):
    """transformers attention function backed by flex_attention and layout.block_mask."""
    _check_supported(module, query, kwargs)
    layout = _active_layout()
    if layout.block_mask is None:
        raise RuntimeError("flex backend needs layout.block_mask (see attach_flex_block_mask)")
    attend = _flex_attention(layout.flex_compiled)
    output = attend(query, key, value, block_mask=layout.block_mask, scale=scaling,
                    enable_gqa=query.shape[1] != key.shape[1])
    return output.transpose(1, 2).contiguous(), None


def attach_flex_block_mask(layout: PackedProbeLayout, compiled: bool) -> None:
    """Build the flex_attention BlockMask of `layout` (compiled=False: eager, tests only)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(batch, head, q_idx, kv_idx):
        return probe_visibility(layout, q_idx, kv_idx)

    n = layout.total_length
    layout.block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=n, KV_LEN=n,
                                          device=layout.segment.device, _compile=compiled)
    layout.flex_compiled = compiled


AttentionInterface.register(BLOCKSPARSE, blocksparse_probe_attention)
AttentionInterface.register(FLEX, flex_probe_attention)


@contextlib.contextmanager
def packed_probe_attention(model: torch.nn.Module, layout: PackedProbeLayout | None,
                           implementation: str) -> Iterator[None]:
    """Run `model` with attention `implementation` and `layout` active, then restore.

    implementation: "sdpa" (dense backend, the mask goes in as attention_mask), BLOCKSPARSE
    or FLEX. The model's own setting is restored on exit, even after an error. Not
    thread-safe for one model object shared by threads (the config is shared).
    """
    with attention_override(model, implementation, _ACTIVE_LAYOUT, layout):
        yield
