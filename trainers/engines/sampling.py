"""Choosing the next token: the one sampling rule of every local decoder.

    token, logprob = sample_token(logits, temperature=1.0, top_p=0.9, top_k=0,
                                  banned_ids=[...], generator=torch.Generator())

The batched transformers engine (trainers.engines.hf.HFEngine) calls this function on each
position's float logits, so the same logits and generator state give the same token and
log-prob whatever the batch.

Conventions
* The reported log-prob is the sampling policy's: log_softmax(logits / temperature) at the
  chosen token (for temperature 0, greedy, the unmodified logits'). top-k / top-p and
  banned ids change which token is picked, never the number, so with top_p 1 and top_k 0
  (the RL defaults) it is exactly the log-prob of the behaviour policy. The RL learner
  computes old / new log-probs and the IG probe scores from logits / the rollout temperature
  too (trainers.modeling.logprobs), so rollout log-probs, the PPO ratio, TIS
  and the rollout-drift metric all speak of the same distribution. At temperature 1 this is
  the raw log-prob, which is what vLLM's "raw_logprobs" report (they ignore the temperature;
  its "processed_logprobs" apply it but leave banned ids out of the normaliser, see
  trainers.engines.vllm_engine).
* temperature 0 is greedy: the argmax of the logits with banned ids removed.
* presence_penalty (OpenAI / vLLM semantics) subtracts the penalty once from the logit of
  every id in `seen_ids` (the ids generated so far in this request) before temperature,
  top-k / top-p and greedy choice (the reported log-prob ignores it, like top-k / top-p);
  0 (the default) leaves the logits alone. DR-Venus's
  inference uses it against repetition loops.
* top_k keeps the k largest scaled logits (ties with the k-th are kept).
* top_p (nucleus): sort descending; a token is dropped when the tokens before it already
  cover top_p (`mass_before >= top_p`), so the most likely token always stays. This is
  vLLM's rule (it drops tokens whose ascending cumulative mass is <= 1 - top_p), so the
  engines agree at the boundary.
* A batched decoder may compute every row's log-softmax at once (`batch_log_probs`, equal
  to the per-row one bit for bit) and pass the row's to `sample_token(log_probs=...)`.
* Sampling draws with `torch.multinomial` on the CPU from `generator` (a CPU generator), so
  a seeded request is reproducible whatever device computed the logits.

Where we deviate and why: the log-prob follows the temperature (verl divides the learner's
logits by the rollout temperature too); a raw log-prob at temperature != 1 would make the
importance ratio of the very first update differ from 1 for no change of the policy.
Hugging Face's `TopPLogitsWarper` keeps tokens while the
ascending cumulative mass is > 1 - top_p, which differs from vLLM exactly at ties with the
boundary; we follow vLLM because the vLLM engine is held to agree with the transformers one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trainers.modeling.logprobs import sampling_log_probs


def sample_token(logits: torch.Tensor, *, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, banned_ids: Sequence[int] = (),
                 generator: torch.Generator | None = None, presence_penalty: float = 0.0,
                 seen_ids: Sequence[int] = (), log_probs: torch.Tensor | None = None
                 ) -> tuple[int, float]:
    """The next token from one position's logits and its log-prob under
    softmax(logits / temperature) (raw for temperature 0; module header).

    Args:
        logits: [vocab] float logits, unmodified (any device).
        temperature: 0 = greedy, else sample from softmax(logits / temperature).
        top_p, top_k: nucleus / top-k filtering when sampling (1.0 / 0 = off).
        banned_ids: ids never chosen (e.g. control tokens message text may not contain).
        generator: a CPU generator for the draw (None = torch's global one).
        presence_penalty, seen_ids: subtract the penalty from the logits of the ids seen
            (module header); like top-k / top-p it changes the pick, not the reported
            log-prob.
        log_probs: this row's log_softmax(logits / temperature) (raw for temperature 0) if
            the caller computed it already (`batch_log_probs`); None = computed here.
    """
    if log_probs is None:
        log_probs = sampling_log_probs(logits, temperature)
    if presence_penalty and seen_ids:
        logits = logits.clone()
        logits[sorted(set(seen_ids))] -= presence_penalty
    if banned_ids:
        logits = logits.clone()
        logits[list(banned_ids)] = float("-inf")
    if temperature <= 0:
        token = int(torch.argmax(logits))
    else:
        scaled = logits / temperature
        if top_k > 0:
            kth = torch.topk(scaled, min(top_k, scaled.numel())).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if top_p < 1.0:
            sorted_logits, order = torch.sort(scaled, descending=True)
            probs = torch.softmax(sorted_logits, dim=-1)
            drop = probs.cumsum(-1) - probs >= top_p
            scaled = scaled.clone()
            scaled[order[drop]] = float("-inf")
        probs = torch.softmax(scaled, dim=-1)
        token = int(torch.multinomial(probs.cpu(), 1, generator=generator))
    return token, _logprob(log_probs, token)


def batch_log_probs(logits: torch.Tensor, temperatures: Sequence[float]) -> torch.Tensor:
    """Every row's sampling log-probs in one log-softmax: row i is what `sample_token`
    computes for logits[i] at temperatures[i], bit for bit (the same division per row, and
    log-softmax works row by row; tests/test_engines.py checks)."""
    scaled = logits
    for i, temperature in enumerate(temperatures):
        # Greedy rows use the raw logits; x / 1.0 == x, so temperature 1 needs no division.
        if temperature > 0 and temperature != 1.0:
            if scaled is logits:
                scaled = logits.clone()
            scaled[i] = logits[i] / temperature
    return sampling_log_probs(scaled, 1.0)


def raw_logprob(logits: torch.Tensor, token: int, log_probs: torch.Tensor | None = None) -> float:
    """The raw log-prob of `token` under one position's logits (for forced choices);
    `log_probs`: log_softmax(logits) if already computed."""
    return _logprob(sampling_log_probs(logits, 0.0) if log_probs is None else log_probs, token)


def forced_logprob(logits: torch.Tensor, token: int, temperature: float,
                   log_probs: torch.Tensor | None = None) -> float:
    """The raw log-prob of a forced `token`, reusing the row's sampling log-probs
    (`batch_log_probs`) where they are the raw ones (temperature 0 or 1)."""
    raw = log_probs if temperature in (0.0, 1.0) else None
    return raw_logprob(logits, token, raw)


def _logprob(log_probs: torch.Tensor, token: int) -> float:
    # log_softmax never exceeds 0 in exact arithmetic; the clamp keeps rounding from it.
    return min(0.0, float(log_probs[token]))
