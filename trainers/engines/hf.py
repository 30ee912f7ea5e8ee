"""The transformers engine: batched decoding with a KV cache on a Hugging Face causal LM.

`HFEngine(model, tokenizer)` runs its own decode loop rather than `model.generate`, because
the engine contract (trainers.engines.base) needs per-request things generate does not give
together: a seed per request, stop strings cut at a token boundary per row, banned ids, and
raw log-probs of the sampled ids (the token rule is trainers.sampling's, shared with the
single-conversation policy). The loop is the textbook one:

    left-pad the prompts -> one prefill forward (attention mask + explicit position ids)
    -> repeat: pick a token per live row, append, one forward of the new column.

Rows that finished keep receiving the pad id (masked out) until every row is done, so the
batch keeps its shape and the cache needs no surgery; with G rollouts of similar length
this wastes little. Logits are taken in float32 whatever the model dtype.

Where we deviate from verl / OpenRLHF: they use vLLM/SGLang for every rollout and HF only
for log-prob recomputation. Here the transformers engine is the CPU default (tiny models in
tests, 2-core laptops), so it implements the whole contract, and vLLM is held to agree with
it (tests/vllm).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trainers.models import kv_cache_argument, returned_kv_cache
from trainers.sampling import sample_token

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
    generator: torch.Generator | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop_string: str | None = None


class HFEngine(Engine):
    """Generation with a transformers causal LM (CPU default).

    Args:
        model: a causal LM (put in eval mode here).
        tokenizer: its tokenizer (decodes generated tails for stop strings; gives the pad id).
        max_batch_size: requests per forward batch; larger calls are split. None = no limit.
    """

    def __init__(self, model: Any, tokenizer: Any, max_batch_size: int | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_token_id = int(pad if pad is not None else 0)
        self.device = next(model.parameters()).device
        self._cache_argument = kv_cache_argument(model)

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
        own = self.model.state_dict()
        for name, tensor in named_tensors(weights):
            if name not in own:
                raise KeyError(f"unknown parameter {name!r} for {type(self.model).__name__}")
            own[name].copy_(tensor.to(own[name].device, own[name].dtype))

    def close(self) -> None:
        self.model = None

    # --- decoding --------------------------------------------------------------------
    @torch.no_grad()
    def _generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        rows = [DecodeRow(r, None if r.seed is None else torch.Generator().manual_seed(r.seed))
                for r in requests]
        width = max(len(r.prompt_ids) for r in requests)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for i, request in enumerate(requests):
            input_ids[i, width - len(request.prompt_ids):] = torch.tensor(request.prompt_ids)
            attention[i, width - len(request.prompt_ids):] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        logits, cache = self._forward(input_ids, attention, positions, None)
        max_steps = max(r.max_new_tokens for r in requests)
        for step in range(max_steps):
            was_live = [row.finish_reason is None for row in rows]
            next_ids = self._pick_next_tokens(logits, rows, step)
            if all(row.finish_reason is not None for row in rows):
                break
            column = torch.tensor(next_ids, dtype=torch.long)[:, None]
            # Rows that were already done feed padding, hidden from attention.
            live = torch.tensor(was_live, dtype=torch.long)[:, None]
            attention = torch.cat([attention, live], dim=1)
            positions = positions[:, -1:] + 1
            logits, cache = self._forward(column, attention, positions, cache)
        return [GenerationResult(row.token_ids, row.logprobs, row.finish_reason or "length",
                                 row.stop_string) for row in rows]

    def _forward(self, input_ids: torch.Tensor, attention: torch.Tensor,
                 positions: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
        output = self.model(input_ids=input_ids.to(self.device),
                            attention_mask=attention.to(self.device),
                            position_ids=positions.to(self.device), use_cache=True,
                            logits_to_keep=1, **{self._cache_argument: cache})
        return output.logits[:, -1].float().cpu(), returned_kv_cache(output)

    def _pick_next_tokens(self, logits: torch.Tensor, rows: list[DecodeRow], step: int) -> list[int]:
        """Choose and record one token per live row; finished rows get the pad id.

        Subclasses may override `_choose` (e.g. forced decoding in benchmarks) and keep
        the bookkeeping here.
        """
        next_ids: list[int] = []
        for i, row in enumerate(rows):
            if row.finish_reason is not None:
                next_ids.append(self.pad_token_id)
                continue
            token, logprob = self._choose(logits[i], row, step)
            row.token_ids.append(token)
            row.logprobs.append(logprob)
            self._update_finish(row)
            next_ids.append(token)
        return next_ids

    def _choose(self, logits: torch.Tensor, row: DecodeRow, step: int) -> tuple[int, float]:
        """One row's token and its raw log-prob, by trainers.sampling's one rule."""
        request = row.request
        return sample_token(logits, temperature=request.temperature, top_p=request.top_p,
                            top_k=request.top_k, banned_ids=request.banned_token_ids,
                            generator=row.generator)

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
