"""Choosing the next token: the one sampling rule of every local decoder.

    token, logprob = sample_token(logits, temperature=1.0, top_p=0.9, top_k=0,
                                  banned_ids=[...], seed=7, position=0)
    sampler = BatchSampler(requests, vocab_size=logits.shape[-1], device=logits.device)
    tokens, logprobs = sampler.draw(logits, positions)      # one call for the whole batch

`sample_token` is the rule for one row, written plainly; `BatchSampler.draw` is the same rule
as tensor ops over a whole decode step's [batch, vocab] logits on their own device (the
transformers engine, trainers.engines.hf.HFEngine, calls it once per step). Both give the same
token and log-prob for the same row (tests/test_sampling.py holds them to it), and both
draw from noise that is a pure function of (request seed, position): a seeded request gives
the same tokens whatever batch it shares and whatever device runs it.

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
* The draw is Gumbel-max: the token is argmax(filtered scaled logits + g), with g_v =
  -log(-log(u_v)) and u_v a uniform that a counter-based hash (murmur3's 32-bit finaliser,
  in integer tensor ops that cannot overflow) makes from (seed, position, v). That is an
  exact sample of softmax(filtered scaled logits), needs no generator state, and costs one
  hash per logit, so a whole batch draws in a few tensor ops. A request without a seed gets
  one from torch's global generator when its decoding starts.

Where we deviate and why: vLLM and transformers draw with `torch.multinomial` /
exponential noise from a generator whose state depends on what else it served, so a seeded
request's tokens depend on its batch; the counter-based noise here does not. The log-prob follows the temperature (verl divides the learner's
logits by the rollout temperature too); a raw log-prob at temperature != 1 would make the
importance ratio of the very first update differ from 1 for no change of the policy.
Hugging Face's `TopPLogitsWarper` keeps tokens while the
ascending cumulative mass is > 1 - top_p, which differs from vLLM exactly at ties with the
boundary; we follow vLLM because the vLLM engine is held to agree with the transformers one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from trainers.modeling.logprobs import sampling_log_probs

_MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9  # 2^32 / golden ratio: spreads consecutive counters over the word


class SamplingRequest(Protocol):
    """What the sampler reads of a request (trainers.engines.base.GenerationRequest has it)."""

    temperature: float
    top_p: float
    top_k: int
    banned_token_ids: list[int]
    presence_penalty: float


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """x <- (x * constant) mod 2^32, in place, for x in [0, 2^32) held in int64: in two
    16-bit halves, so no product leaves int64's range (signed overflow is not defined
    behaviour everywhere, and the result must be the same on every device)."""
    high = (x >> 16).mul_(constant).bitwise_and_(0xFFFF).bitwise_left_shift_(16)
    return x.bitwise_and_(0xFFFF).mul_(constant).add_(high).bitwise_and_(_MASK32)


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """h <- murmur3's 32-bit finaliser of h, in place: every input bit flips each output bit
    with probability ~1/2, so neighbouring counters give unrelated words."""
    h.bitwise_xor_(h >> 16)
    _mul32(h, 0x85EBCA6B)
    h.bitwise_xor_(h >> 13)
    _mul32(h, 0xC2B2AE35)
    return h.bitwise_xor_(h >> 16)


_TOKEN_WORDS: dict[tuple[int, str], torch.Tensor] = {}


def _token_words(vocab_size: int, device: torch.device) -> torch.Tensor:
    """[vocab] a mixed 32-bit word per token id (made once per vocabulary and device)."""
    key = (vocab_size, str(device))
    if key not in _TOKEN_WORDS:
        ids = torch.arange(vocab_size, dtype=torch.long, device=device)
        _TOKEN_WORDS[key] = _fmix32(_mul32(ids, _GOLDEN).add_(0x632BE5AB).bitwise_and_(_MASK32))
    return _TOKEN_WORDS[key]


def seed_keys(seeds: Sequence[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """[rows] a mixed 32-bit word per seed (its low 64 bits), made once per request."""
    low = torch.tensor([seed & _MASK32 for seed in seeds], dtype=torch.long, device=device)
    high = torch.tensor([(seed >> 32) & _MASK32 for seed in seeds], dtype=torch.long,
                        device=device)
    return _fmix32(_fmix32(low ^ _GOLDEN) ^ high)


def gumbel_noise(seeds: Sequence[int] | torch.Tensor, positions: Sequence[int] | torch.Tensor,
                 vocab_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Gumbel(0, 1) noise [len(seeds), vocab_size] (float64), a pure function of
    (seeds[i], positions[i], token id): the same row whatever else is in the batch.

    Args:
        seeds: one non-negative int per row (any size; its low 64 bits are used), or
            their `seed_keys` already made.
        positions: [rows] the index of the token being drawn in its request (0 = first).
        vocab_size: V, the width of the noise.
    """
    device = torch.device(device)
    keys = seeds if isinstance(seeds, torch.Tensor) else seed_keys(seeds, device)
    position = torch.as_tensor(positions, dtype=torch.long).to(device) & _MASK32
    # A row's key mixes seed and position; one more mix per (key, token) gives the word.
    key = _fmix32(keys ^ _mul32(position + 1, 0x27D4EB2F))
    words = _fmix32(key[:, None] ^ _token_words(vocab_size, device)[None, :])
    uniform = words.double().add_(0.5).div_(2.0 ** 32)  # in (0, 1): both logs stay finite
    return uniform.log_().neg_().log_().neg_()


def sample_token(logits: torch.Tensor, *, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, banned_ids: Sequence[int] = (), seed: int | None = None,
                 position: int = 0, presence_penalty: float = 0.0,
                 seen_ids: Sequence[int] = (), log_probs: torch.Tensor | None = None
                 ) -> tuple[int, float]:
    """The next token from one position's logits and its log-prob under
    softmax(logits / temperature) (raw for temperature 0; module header). The per-row
    reference of `BatchSampler.draw`.

    Args:
        logits: [vocab] float logits, unmodified (any device).
        temperature: 0 = greedy, else sample from softmax(logits / temperature).
        top_p, top_k: nucleus / top-k filtering when sampling (1.0 / 0 = off).
        banned_ids: ids never chosen (e.g. control tokens message text may not contain).
        seed, position: the draw's noise is gumbel_noise(seed, position); None = a seed from
            torch's global generator.
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
            sorted_logits, order = torch.sort(scaled, descending=True, stable=True)
            probs = torch.softmax(sorted_logits, dim=-1)
            drop = probs.cumsum(-1) - probs >= top_p
            scaled = scaled.clone()
            scaled[order[drop]] = float("-inf")
        seed = draw_seed() if seed is None else seed
        noise = gumbel_noise([seed], [position], scaled.numel(), scaled.device)[0]
        token = int(torch.argmax(scaled.double() + noise))
    return token, _logprob(log_probs, token)


def draw_seed() -> int:
    """A seed for a request that has none, from torch's global generator (so
    torch.manual_seed still makes an unseeded run repeatable)."""
    return int(torch.randint(0, 2 ** 62, (1,)))


class BatchSampler:
    """`sample_token`'s rule for a batch of requests, one call per decode step.

    Built once per batch: each row's temperature, top-k, top-p, penalty, banned ids and seed
    as tensors on `device`. `draw(logits, positions)` picks every row's token as tensor ops
    on the logits' device; the only host sync is reading the [batch] tokens and log-probs
    back. Row i's result equals sample_token(logits[i], ..., seed=seeds[i],
    position=positions[i], seen_ids=what row i drew so far).
    """

    def __init__(self, requests: Sequence[SamplingRequest], seeds: Sequence[int],
                 vocab_size: int, device: torch.device | str = "cpu"):
        if len(seeds) != len(requests):
            raise ValueError(f"{len(requests)} requests but {len(seeds)} seeds")
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self.keys = seed_keys(seeds, self.device)  # the seeds' part of the noise, made once

        def column(values: list[float], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=self.device)[:, None]

        self.temperatures = [float(r.temperature) for r in requests]
        self.greedy = column([t <= 0 for t in self.temperatures], torch.bool)
        # Greedy rows divide by 1 (x / 1 == x), so one division serves every row.
        self.divisor = column([t if t > 0 else 1.0 for t in self.temperatures], torch.float64)
        self.top_p = column([float(r.top_p) for r in requests], torch.float64)
        self.uses_top_p = bool((self.top_p < 1.0).any())
        top_k = [min(int(r.top_k), vocab_size) for r in requests]
        self.top_k = column(top_k, torch.long)
        self.uses_top_k = any(k > 0 for k in top_k)
        self.penalty = column([float(r.presence_penalty) for r in requests], torch.float64)
        self.uses_penalty = bool((self.penalty != 0).any())
        self.seen = torch.zeros((len(requests), vocab_size), dtype=torch.bool, device=self.device)
        self.banned = None
        if any(r.banned_token_ids for r in requests):
            self.banned = torch.zeros_like(self.seen)
            for i, request in enumerate(requests):
                self.banned[i, list(request.banned_token_ids)] = True

    def draw(self, logits: torch.Tensor, positions: Sequence[int] | torch.Tensor,
             log_probs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row's next token and its log-prob (module header's conventions).

        Args:
            logits: [batch, vocab] float logits, unmodified, on `device`.
            positions: [batch] each row's index of the token being drawn.
            log_probs: [batch, vocab] batch_log_probs(logits, temperatures) if computed.
        Returns:
            tokens [batch] (long) and their log-probs [batch] (float), on `device`.
        """
        if logits.shape != self.seen.shape:
            raise ValueError(f"logits of shape {tuple(logits.shape)} for a sampler of "
                             f"{tuple(self.seen.shape)}")
        if log_probs is None:
            log_probs = batch_log_probs(logits, self.temperatures)
        if self.uses_penalty:  # x - 0 == x: unpenalised rows are left as they were
            logits = logits - self.penalty.to(logits.dtype) * self.seen
        if self.banned is not None:
            logits = logits.masked_fill(self.banned, float("-inf"))
        tokens = torch.argmax(logits, dim=-1)
        if not bool(self.greedy.all()):
            scaled = self._filtered(logits / self.divisor.to(logits.dtype))
            noise = gumbel_noise(self.keys, positions, self.vocab_size, logits.device)
            sampled = torch.argmax(scaled.double() + noise, dim=-1)
            tokens = torch.where(self.greedy[:, 0], tokens, sampled)
        self.seen[torch.arange(len(tokens), device=tokens.device), tokens] = True
        logprobs = log_probs.gather(1, tokens[:, None])[:, 0].clamp(max=0.0)
        return tokens, logprobs

    def _filtered(self, scaled: torch.Tensor) -> torch.Tensor:
        """top-k then top-p as masks over the sorted rows (sample_token's rule: ties with
        the k-th kept, a token dropped once the mass before it covers top_p)."""
        if not (self.uses_top_k or self.uses_top_p):
            return scaled
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True, stable=True)
        if self.uses_top_k:
            kth = sorted_logits.gather(1, (self.top_k - 1).clamp(min=0))
            kth = kth.masked_fill(self.top_k == 0, float("-inf"))
            # Masking below the k-th keeps the sorted order of what is left.
            sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if self.uses_top_p:
            probs = torch.softmax(sorted_logits, dim=-1)
            drop = (probs.cumsum(-1) - probs >= self.top_p.to(probs.dtype)) & (self.top_p < 1.0)
            scaled = scaled.masked_fill(torch.zeros_like(drop).scatter(1, order, drop),
                                        float("-inf"))
        return scaled


def batch_log_probs(logits: torch.Tensor, temperatures: Sequence[float]) -> torch.Tensor:
    """Every row's sampling log-probs in one log-softmax: row i is what `sample_token`
    computes for logits[i] at temperatures[i], bit for bit (the same division per row, and
    log-softmax works row by row; tests/test_engines.py checks)."""
    if all(t <= 0 or t == 1.0 for t in temperatures):
        return sampling_log_probs(logits, 1.0)  # x / 1.0 == x: no division needed
    # Greedy rows use the raw logits: dividing them by 1 leaves them bit for bit.
    divisor = torch.tensor([t if t > 0 else 1.0 for t in temperatures], dtype=torch.float64)
    return sampling_log_probs(logits / divisor.to(logits.device, logits.dtype)[:, None], 1.0)


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
