"""One interface for every generation engine: batched requests in, token ids + log-probs out.

    engine.generate([GenerationRequest(prompt_ids, max_new_tokens, ...), ...])
        -> [GenerationResult(token_ids, logprobs, finish_reason), ...]   (same order)
    engine.update_weights(state_dict or iterable of (name, tensor))
    engine.forget_conversations()      # the caller's episodes ended (frees kept KV caches)
    engine.close()

Conventions every engine follows (tests hold the transformers and vLLM engines to them):

* Token in, token out. `prompt_ids` are the exact ids to continue; `token_ids` are the ids the
  engine sampled, never re-encoded from text. Text is the caller's business.
* Log-probs are the sampling policy's: log_softmax(logits / temperature) at the sampled
  token (the unmodified logits' when decoding greedily). top-k/top-p, presence penalty and
  banned tokens change which token is picked, not the reported number. This is the quantity
  the learner recomputes (old/new log-probs from logits / the rollout temperature;
  trainers.engines.sampling states the rule); vLLM's `raw_logprobs` are it at temperature 1 and
  for greedy rows (greedy rows use temperature 1; trainers.engines.vllm_engine says how
  other temperatures are handled).
* Stop conditions, checked after every sampled token:
    - a stop token id (the end-of-turn id `<|im_end|>`): kept as the last id; reason "stop";
    - a stop string (DR-Venus stops on `<tool_response>`): generation ends at the first token
      whose decoded text completes the string; ids are kept up to and including that token,
      reason "stop_string". If the string ends in the middle of a token, the whole token is
      kept (ids are never split or re-tokenised), so the decoded ids may run a few characters
      past the stop string; `text_before_stop_string` cuts the text for the environment.
      This is also what vLLM returns (its token ids include the completing token);
    - `max_new_tokens` reached: reason "length" (the per-turn token cap).
* `banned_token_ids`: never sampled (control tokens such as `<|im_start|>` that message
  text may not contain; trainers.rollout.banned_control_ids).
* Seeds: `seed` makes a sampled request reproducible. The transformers engine draws from
  noise that is a pure function of (seed, position), so its tokens do not depend on what
  else shares the batch (trainers.engines.sampling); vLLM's seeded requests are
  reproducible on the same engine and batch shape.

Where we deviate from verl / OpenRLHF and why: those return log-probs of the processed
distribution in some modes and recompute old log-probs in the learner anyway; we fix one
meaning (raw) so that rollout log-probs can be compared with the learner's directly (the
trajectory checker and the IS-ratio diagnostics rely on it).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "stop_string"]
NamedTensors = Mapping[str, Any] | Iterable[tuple[str, Any]]


@dataclass
class GenerationRequest:
    """One continuation to generate.

    temperature 0 means greedy; top_p 1.0 / top_k 0 switch those filters off;
    presence_penalty (OpenAI / vLLM semantics, DR-Venus's inference option against loops) is
    subtracted once from the logit of every id generated so far in this request (0 = off).
    """

    prompt_ids: list[int]
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: list[int] = field(default_factory=list)
    stop_strings: list[str] = field(default_factory=list)
    banned_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    presence_penalty: float = 0.0

    def validate(self) -> None:
        if not self.prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if any(not s for s in self.stop_strings):
            raise ValueError("stop strings must be non-empty")


@dataclass
class GenerationResult:
    """What one request produced: ids as sampled and the log-prob of each (module header)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    stop_string: str | None = None  # the stop string that ended it, if any


class Engine(abc.ABC):
    """A generation engine. Subclasses implement generate; the rest has safe defaults."""

    @abc.abstractmethod
    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Generate for all requests (one batch where the engine can); same order as given."""

    def update_weights(self, weights: NamedTensors) -> None:
        """Load new policy weights (a state dict or (name, tensor) pairs) into the engine."""
        raise NotImplementedError(f"{type(self).__name__} does not accept new weights")

    def forget_conversations(self) -> None:
        """The caller's conversations are over: drop state kept per conversation (the
        transformers engine's KV caches). Results never depend on it; only speed and memory."""
        return None  # engines that keep nothing per conversation have nothing to drop

    def close(self) -> None:
        """Release the engine's resources (idempotent)."""
        return None  # engines without resources have nothing to release

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def named_tensors(weights: NamedTensors) -> Iterable[tuple[str, Any]]:
    """(name, tensor) pairs from a state dict or from an iterable of pairs."""
    if isinstance(weights, Mapping):
        return list(weights.items())
    return weights


def find_stop_string(tokenizer: Any, generated_ids: Sequence[int],
                     stop_strings: Sequence[str]) -> str | None:
    """The stop string that the last id completed, if any.

    Decodes only a tail of the ids (enough tokens to spell the longest stop string, since a
    token decodes to at least one character or to part of one), so the check costs O(1) per
    sampled token. Called after every token, so a string found in the tail was completed by
    the last id.
    """
    if not stop_strings or not generated_ids:
        return None
    window = max(len(s) for s in stop_strings) + 4
    tail = tokenizer.decode(list(generated_ids[-window:]), skip_special_tokens=False,
                            clean_up_tokenization_spaces=False)
    for stop in stop_strings:
        if stop in tail:
            return stop
    return None


def text_before_stop_string(text: str, stop_string: str | None) -> str:
    """The text up to (without) the stop string: what the environment should read."""
    if stop_string is None:
        return text
    at = text.find(stop_string)
    return text if at < 0 else text[:at]
