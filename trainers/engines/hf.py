"""The transformers engine: batched decoding with a KV cache on a Hugging Face causal LM.

`HFEngine(model, tokenizer)` runs its own decode loop rather than `model.generate`, because
the engine contract (trainers.engines.base) needs per-request things generate does not give
together: a seed per request, stop strings cut at a token boundary per row, banned ids, and
log-probs of the sampled ids (the token rule is trainers.engines.sampling's, shared with the
single-conversation policy). The loop is the textbook one:

    left-pad the prompts -> one prefill forward (attention mask + explicit position ids)
    -> repeat: pick a token per live row, append, one forward of the new column.

Rows that finished keep receiving the pad id (masked out) until every row is done, so the
batch keeps its shape and the cache needs no surgery; with G rollouts of similar length
this wastes little. Logits are taken in float32 whatever the model dtype.

Conversations keep their KV cache across calls (`kv_cache=True`, the default). After a
batch, each row's ids (prompt + the generated ids that went through the model) and its keys
and values (the row's unmasked columns) are kept. A later request reuses the kept
conversation sharing the longest prefix with its prompt (trainers.engines.kv_cache.reusable_prefix)
and prefills only the rest: in a multi-turn episode that is the environment's reply and the
next generation prompt. Callers need no conversation key; a prompt that shares nothing
(another conversation, a rewritten history) is prefilled in full. In a batch the reused
caches are left-padded to one width and the new ids to another, so a row reads
`[pad | its cache | pad | its new ids]`; the attention mask hides the pads and position ids
continue each row's own sequence. Kept caches are dropped on `update_weights` (they hold the
old weights' keys and values), on `forget_conversations()` (trainers.rollout calls it when a
group's episodes end) and beyond `max_cached_conversations` (least recently used first).
Re-encoding (`kv_cache=False`) gives the same ids, and float32 log-probs within ~1e-5
(trainers.engines.kv_cache says why not bit for bit; tests/test_engine_kv_cache.py measures it).
Decoding writes into buffers reserved after the prefill (`reserve_decode`) rather than
growing transformers' DynamicCache, which copies the whole cache every step, and each decode
step runs trainers.engines.lean_decode (`lean_decode`, Qwen3 / Qwen2 / Llama): the model's own
modules over those buffers and a kept additive mask, without the transformers forward
around them, and one log-softmax gives every row's log-probs (trainers.engines.sampling.
batch_log_probs). Other architectures decode through the transformers forward.

Where we deviate from verl / OpenRLHF: they use vLLM/SGLang for every rollout and HF only
for log-prob recomputation. Here the transformers engine is the CPU default (tiny models in
tests, 2-core laptops), so it implements the whole contract, and vLLM is held to agree with
it (tests/vllm). vLLM's automatic prefix caching plays the role of the kept caches there.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trainers.engines.kv_cache import (
    KVLayers,
    cache_from_rows,
    cache_rows,
    reserved_cache,
    reusable_prefix,
)
from trainers.engines.lean_decode import LeanDecoder, lean_decode_supported
from trainers.engines.sampling import BatchSampler, batch_log_probs, draw_seed, sample_token
from trainers.modeling.models import kv_cache_argument, returned_kv_cache

from .base import (
    Engine,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    NamedTensors,
    find_stop_string,
    named_tensors,
)


@dataclass
class DecodeRow:
    """Decoding state of one request."""

    request: GenerationRequest
    seed: int  # the request's seed, or one drawn for it (trainers.engines.sampling.draw_seed)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop_string: str | None = None


@dataclass
class CachedConversation:
    """A conversation's ids and the keys / values the model computed for them (one row)."""

    ids: list[int]
    layers: KVLayers  # per layer (keys, values), each [1, kv_heads, len(ids), head_dim]


@dataclass
class KVCacheStats:
    """Where the prompt ids of the engine's calls went (tests and benchmarks read it)."""

    prefilled_tokens: int = 0  # prompt ids that went through the model
    reused_tokens: int = 0  # prompt ids served from a kept conversation's cache


class HFEngine(Engine):
    """Generation with a transformers causal LM (CPU default).

    Args:
        model: a causal LM (put in eval mode here).
        tokenizer: its tokenizer (decodes generated tails for stop strings; gives the pad id).
        max_batch_size: requests per forward batch; larger calls are split. None = no limit.
        kv_cache: keep each conversation's KV cache across calls and prefill only the ids a
            prompt adds to a kept conversation (module docstring); False re-encodes every
            prompt in full.
        max_cached_conversations: kept caches beyond this are dropped, least recently used
            first.
        reserve_decode: after the prefill, copy the batch cache once into buffers with room
            for the whole decode and write each step in place; False grows transformers'
            DynamicCache by concatenation, which copies the whole cache every step (~70% of a
            decode step at 3,000 positions on a CPU). kv_cache=False, reserve_decode=False
            is the engine before kept caches, bit for bit (benchmarks compare with it, with
            lean_decode=False).
        lean_decode: run decode steps with trainers.engines.lean_decode (the model's own modules over
            the reserved cache and a kept additive mask, no transformers forward around
            them) and choose every row's token from one batched log-softmax. Needs
            reserve_decode and a supported architecture (Qwen3 / Qwen2 / Llama); otherwise
            decode steps use the transformers forward. False = the transformers forward and
            one log-softmax per row.
        batched_sampling: choose every row's token in one trainers.engines.sampling.
            BatchSampler call per decode step, on the logits' device (one host sync per
            step); False = `sample_token` row by row (the same tokens and log-probs, one
            call and sync per row). A subclass that overrides `_choose` (forced decoding)
            always decodes row by row.
    """

    def __init__(self, model: Any, tokenizer: Any, max_batch_size: int | None = None,
                 kv_cache: bool = True, max_cached_conversations: int = 64,
                 reserve_decode: bool = True, lean_decode: bool = True,
                 batched_sampling: bool = True):
        if max_cached_conversations < 1:
            raise ValueError("max_cached_conversations must be >= 1 (use kv_cache=False to "
                             f"keep none), got {max_cached_conversations}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_token_id = int(pad if pad is not None else 0)
        self.device = next(model.parameters()).device
        self._cache_argument = kv_cache_argument(model)
        self.kv_cache = kv_cache
        self.reserve_decode = reserve_decode
        self.lean_decode = lean_decode
        # __class__ is this class even where a caller rebinds the module's HFEngine name.
        self.batched_sampling = batched_sampling and type(self)._choose is __class__._choose
        self.max_cached_conversations = max_cached_conversations
        self.cache_stats = KVCacheStats()
        self._conversations: OrderedDict[int, CachedConversation] = OrderedDict()
        self._next_key = 0

    # --- the Engine interface ------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        for request in requests:
            request.validate()
        if not requests:
            return []
        size = self.max_batch_size or len(requests)
        results: list[GenerationResult] = []
        for start in range(0, len(requests), size):
            results.extend(self._generate_batch(list(requests[start:start + size])))
        return results

    @torch.no_grad()
    def update_weights(self, weights: NamedTensors) -> None:
        """Copy new weights into the model in place (names as in model.state_dict())."""
        # Kept caches hold the old weights' keys and values.
        self.forget_conversations()
        own = self.model.state_dict()
        for name, tensor in named_tensors(weights):
            if name not in own:
                raise KeyError(f"unknown parameter {name!r} for {type(self.model).__name__}")
            own[name].copy_(tensor.to(own[name].device, own[name].dtype))

    def forget_conversations(self) -> None:
        """Drop every kept KV cache (the caller's conversations are over)."""
        self._conversations.clear()

    @property
    def cached_conversations(self) -> int:
        """How many conversations' caches are kept now."""
        return len(self._conversations)

    def close(self) -> None:
        self.forget_conversations()
        self.model = None

    # --- decoding --------------------------------------------------------------------
    @torch.no_grad()
    def _generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        rows = [DecodeRow(r, draw_seed() if r.seed is None else r.seed) for r in requests]
        sources = [self._lookup(r.prompt_ids) for r in requests]
        keeps = [keep for _, keep in sources]
        past = max(keeps)
        news = [request.prompt_ids[keep:] for request, keep in zip(requests, keeps)]
        width = max(len(new) for new in news)
        # Row i: [pad | its kept cache (keeps[i]) | pad | its new ids]; see the module docstring.
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(rows), past + width), dtype=torch.long)
        positions = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (new, keep) in enumerate(zip(news, keeps)):
            input_ids[i, width - len(new):] = torch.tensor(new)
            attention[i, past - keep:past] = 1
            attention[i, past + width - len(new):] = 1
            positions[i, width - len(new):] = torch.arange(keep, keep + len(new))
        self.cache_stats.prefilled_tokens += sum(len(new) for new in news)
        self.cache_stats.reused_tokens += sum(keeps)
        cache = self._batch_cache([source for source, _ in sources], keeps, past) if past else None
        logits, cache = self._forward(input_ids, attention, positions, cache)
        max_steps = max(r.max_new_tokens for r in requests)
        sampler = (BatchSampler(requests, [row.seed for row in rows], logits.shape[-1],
                                      logits.device) if self.batched_sampling else None)
        decoder = None
        if self.reserve_decode:  # decoding writes in place instead of copying every step
            cache = reserved_cache(cache, max_steps)
            if self.lean_decode and lean_decode_supported(self.model):
                decoder = LeanDecoder(self.model, cache, attention, max_steps)
        for step in range(max_steps):
            was_live = [row.finish_reason is None for row in rows]
            next_ids = self._pick_next_tokens(logits, rows, step, sampler)
            if all(row.finish_reason is not None for row in rows):
                break
            column = next_ids[:, None]
            # Rows that were already done feed padding, hidden from attention.
            live = torch.tensor(was_live, dtype=torch.long)[:, None]
            attention = torch.cat([attention, live], dim=1)
            positions = positions[:, -1:] + 1
            if decoder is not None:
                logits = decoder.step(column, positions, live[:, 0].bool())
            else:
                logits, cache = self._forward(column, attention, positions, cache)
        if self.kv_cache:
            self._keep(rows, attention, cache)
        return [GenerationResult(row.token_ids, row.logprobs, row.finish_reason or "length",
                                 row.stop_string) for row in rows]

    def _forward(self, input_ids: torch.Tensor, attention: torch.Tensor,
                 positions: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
        output = self.model(input_ids=input_ids.to(self.device),
                            attention_mask=attention.to(self.device),
                            position_ids=positions.to(self.device), use_cache=True,
                            logits_to_keep=1, **{self._cache_argument: cache})
        return output.logits[:, -1].float(), returned_kv_cache(output)

    # --- kept conversations --------------------------------------------------------------
    def _lookup(self, prompt: list[int]) -> tuple[CachedConversation | None, int]:
        """The kept conversation sharing the longest prefix with `prompt`, and how many of
        its positions the prompt reuses; (None, 0) = prefill the whole prompt."""
        best: tuple[CachedConversation | None, int] = (None, 0)
        if not self.kv_cache:
            return best
        best_key = None
        for key, conversation in self._conversations.items():
            keep = reusable_prefix(conversation.ids, prompt)
            if keep > best[1]:
                best, best_key = (conversation, keep), key
        if best_key is not None:
            self._conversations.move_to_end(best_key)
        return best

    def _batch_cache(self, sources: list[CachedConversation | None], keeps: list[int],
                     past: int) -> Any:
        """One batch cache of width `past`: row i's first keeps[i] kept positions, right-aligned."""
        template = next(source for source in sources if source is not None).layers
        layers = []
        for layer, (keys, values) in enumerate(template):
            shape = (len(sources), keys.shape[1], past, keys.shape[3])
            batch_keys = keys.new_zeros(shape)
            batch_values = values.new_zeros(shape[:3] + (values.shape[3],))
            for i, (source, keep) in enumerate(zip(sources, keeps)):
                if source is not None and keep:
                    source_keys, source_values = source.layers[layer]
                    batch_keys[i, :, past - keep:] = source_keys[0, :, :keep]
                    batch_values[i, :, past - keep:] = source_values[0, :, :keep]
            layers.append((batch_keys, batch_values))
        return cache_from_rows(layers)

    def _keep(self, rows: list[DecodeRow], attention: torch.Tensor, cache: Any) -> None:
        """Keep each row's conversation: the ids that went through the model and their
        keys / values (the row's unmasked columns). A kept conversation whose ids a new one
        extends is replaced by it."""
        layers = cache_rows(cache)
        if layers[0][0].shape[2] != attention.shape[1]:
            raise RuntimeError(f"the KV cache holds {layers[0][0].shape[2]} positions but the "
                               f"attention mask {attention.shape[1]}; cannot keep it")
        for i, row in enumerate(rows):
            columns = attention[i].nonzero().squeeze(1).to(self.device)
            ids = (row.request.prompt_ids + row.token_ids)[:len(columns)]
            kept = CachedConversation(ids, [(keys[i:i + 1, :, columns], values[i:i + 1, :, columns])
                                            for keys, values in layers])
            for key in [key for key, old in self._conversations.items()
                        if len(old.ids) <= len(ids) and ids[:len(old.ids)] == old.ids]:
                del self._conversations[key]
            self._conversations[self._next_key] = kept
            self._next_key += 1
        while len(self._conversations) > self.max_cached_conversations:
            self._conversations.popitem(last=False)

    def _pick_next_tokens(self, logits: torch.Tensor, rows: list[DecodeRow], step: int,
                          sampler: BatchSampler | None = None) -> torch.Tensor:
        """Choose and record one token per live row; finished rows get the pad id. Returns
        the [batch] ids to feed next (on the CPU).

        With a `sampler` (batched_sampling) every row's token comes from one draw on the
        logits' device and one host sync; otherwise each live row calls `_choose`, which
        subclasses may override (e.g. forced decoding in benchmarks) and keep the
        bookkeeping here. With lean_decode every row's sampling log-probs come from one
        batched log-softmax (trainers.engines.sampling.batch_log_probs, equal to the per-row
        one bit for bit); otherwise `_choose` gets None and each row computes its own.
        """
        log_probs = None
        if self.lean_decode or sampler is not None:
            log_probs = batch_log_probs(logits, [row.request.temperature for row in rows])
        if sampler is not None:
            positions = [len(row.token_ids) for row in rows]
            tokens, logprobs = sampler.draw(logits, positions, log_probs)
            choices = list(zip(tokens.tolist(), logprobs.tolist()))
        else:
            choices = [None if row.finish_reason is not None else
                       self._choose(logits[i], row, step,
                                    None if log_probs is None else log_probs[i])
                       for i, row in enumerate(rows)]
        next_ids: list[int] = []
        for row, choice in zip(rows, choices):
            if row.finish_reason is not None:
                next_ids.append(self.pad_token_id)
                continue
            token, logprob = choice
            row.token_ids.append(token)
            row.logprobs.append(logprob)
            self._update_finish(row)
            next_ids.append(token)
        return torch.tensor(next_ids, dtype=torch.long)

    def _choose(self, logits: torch.Tensor, row: DecodeRow, step: int,
                log_probs: torch.Tensor | None = None) -> tuple[int, float]:
        """One row's token and its log-prob, by trainers.engines.sampling's one rule (`log_probs`:
        the row's sampling log-probs if already computed)."""
        request = row.request
        return sample_token(logits, temperature=request.temperature, top_p=request.top_p,
                            top_k=request.top_k, banned_ids=request.banned_token_ids,
                            seed=row.seed, position=len(row.token_ids), log_probs=log_probs,
                            presence_penalty=request.presence_penalty, seen_ids=row.token_ids)

    def _update_finish(self, row: DecodeRow) -> None:
        request = row.request
        if row.token_ids[-1] in request.stop_token_ids:
            row.finish_reason = "stop"
            return
        stop = find_stop_string(self.tokenizer, row.token_ids, request.stop_strings)
        if stop is not None:
            row.finish_reason, row.stop_string = "stop_string", stop
        elif len(row.token_ids) >= request.max_new_tokens:
            row.finish_reason = "length"
