"""Engines that play a scripted policy, for tests and benchmarks.

A random tiny model never writes a valid tool call, so rollouts driven by it never exercise
search and visit. These engines take a `respond(observations) -> turn text` function (e.g.
the world's oracle agent replayed over the observations so far) instead:

* `ScriptedEngine`: no model at all; returns the script's ids with log-prob 0.0.
* `ForcedHFEngine`: runs the real transformers decode loop (same forwards, same cost per
  token as `HFEngine`) but forces each row's next token to the script's. Benchmarks use it
  to time a real engine driving real tool use.

Both read the observations back from the prompt ids by decoding them and splitting the
ChatML user messages: fine for tests, never used in training paths.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from trainers.engines.sampling import forced_logprob

from .base import Engine, GenerationRequest, GenerationResult
from .hf import DecodeRow, HFEngine

Respond = Callable[[list[str]], str]


def chatml_user_messages(prompt_text: str) -> list[str]:
    """The contents of the user messages of a ChatML rendering, in order."""
    header = "<|im_start|>user\n"
    messages = []
    for piece in prompt_text.split(header)[1:]:
        messages.append(piece.split("<|im_end|>", 1)[0])
    return messages


def _script_ids(tokenizer: object, respond: Respond, prompt_ids: Sequence[int],
                end_of_turn_id: int) -> list[int]:
    prompt_text = tokenizer.decode(list(prompt_ids), skip_special_tokens=False,  # type: ignore[attr-defined]
                                   clean_up_tokenization_spaces=False)
    text = respond(chatml_user_messages(prompt_text))
    return [*tokenizer.encode(text, add_special_tokens=False), end_of_turn_id]  # type: ignore[attr-defined]


class ScriptedEngine(Engine):
    """Answers each request with `respond`'s text, encoded, then the end-of-turn id."""

    def __init__(self, tokenizer: object, respond: Respond, end_of_turn_id: int):
        self.tokenizer = tokenizer
        self.respond = respond
        self.end_of_turn_id = end_of_turn_id

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        results = []
        for request in requests:
            ids = _script_ids(self.tokenizer, self.respond, request.prompt_ids,
                              self.end_of_turn_id)
            reason = "stop"
            if len(ids) > request.max_new_tokens:
                ids, reason = ids[:request.max_new_tokens], "length"
            results.append(GenerationResult(ids, [0.0] * len(ids), reason))  # type: ignore[arg-type]
        return results


class ForcedHFEngine(HFEngine):
    """HFEngine whose token choice follows the script (log-probs are still the model's)."""

    def __init__(self, model: object, tokenizer: object, respond: Respond,
                 end_of_turn_id: int, max_batch_size: int | None = None):
        super().__init__(model, tokenizer, max_batch_size=max_batch_size)
        self.respond = respond
        self.end_of_turn_id = end_of_turn_id
        self._targets: dict[int, list[int]] = {}

    def _generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        self._targets = {}
        return super()._generate_batch(requests)

    def _choose(self, logits: torch.Tensor, row: DecodeRow, step: int,
                log_probs: torch.Tensor | None = None) -> tuple[int, float]:
        target = self._targets.get(id(row))
        if target is None:
            target = _script_ids(self.tokenizer, self.respond, row.request.prompt_ids,
                                 self.end_of_turn_id)
            self._targets[id(row)] = target
        token = target[step] if step < len(target) else self.end_of_turn_id
        return token, forced_logprob(logits, token, row.request.temperature, log_probs)
