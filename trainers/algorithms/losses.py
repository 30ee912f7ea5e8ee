"""Policy losses as pure tensor functions: PPO/GRPO clipped surrogate with dual clip, k3 KL to
a frozen reference, truncated importance sampling (TIS) against the engine, entropy bonus.

All per-token tensors are [B, L], aligned with the token they score (trainers.batch), and
only positions where `mask` is True (the policy tokens) take part. Non-finite log-probs or
advantages on those positions raise FloatingPointError: a NaN that silently turns the ratio
off was one of the peers' worst bugs (design.md "Pitfalls").

    ratio   = exp(logp - old_logp)
    A       = A * w_neg                   where A < 0        (negative_advantage_weight, 1)
    pg      = max(-A * ratio, -A * clip(ratio, 1 - eps_low, 1 + eps_high))
    pg      = min(pg, -A * c)             where A < 0        (dual clip, c = 3)
    pg      = pg * min(exp(old_logp - engine_logp), tis_cap)  (optional TIS, no gradient)
    kl_k3   = exp(ref - logp) - (ref - logp) - 1              (skipped when kl_coef == 0;
                                                               min(kl_k3, kl_max) if set)
    loss    = agg(pg) + kl_coef * agg(kl_k3) - entropy_coef * agg(entropy)

agg is token-mean (default: sum over all policy tokens of the batch / their count) or
seq-mean (mean over trajectories of each trajectory's token mean; "seq-mean-token-mean" is
verl's name for the same).

Shared-context baseline (`shared_context_baseline`, off by default): before the loss, each
policy token's advantage loses the mean advantage of the other rows of its group that chose
a token in the same context (trainers.algorithms.advantages.shared_context_baseline, applied
by Algorithm.weighted_advantages). Why an option: IGPO's per-turn discounted returns do not
sum to zero over a group, so a first turn that all G rollouts wrote alike (at a low
temperature, often) is pushed up or down as a whole although the group chose nothing there;
a random-sign placebo pushes such shared contexts at random.

Turn weight cap (`turn_weight_cap: n`): the policy-gradient term of a turn with m > n
policy tokens has each token weighted n / m, so a turn counts as at most n tokens (the
denominators stay the token / trajectory counts, so the learners' loss shares do not
change). Why: turns cut at the per-turn token cap are long by construction; on the demo's
tiny policy malformed turns, mostly cut ones, held ~59% of the policy tokens, so a
token-mean loss was mostly about them. seq-mean limits a long trajectory's weight, not a
long turn's within it; the cap limits the turn's. Off by default (the papers' token-mean).

Negative-advantage weight (`negative_advantage_weight: w`, default 1 = the papers'
symmetric loss): negative advantages are multiplied by w before the surrogate. Why an
option: at a low rollout temperature the start gives most sampled tokens p close to 1, so
positive advantages can barely raise them while negative ones lower the policy's
confidence wherever it decides (docs/benchmarks.md "Learning check"); w < 1 weights pushing
down less than pulling up.

Copied-token weight (`copied_token_weight: w`, default 1 = off): the advantages of tokens
that continue a span copied from the context (trainers.algorithms.copying) are multiplied by
w when the step's advantages are computed (Algorithm.weighted_advantages), before the
mini-batches. Why an option: on a small policy the copying of names, URLs and facts is
SFT's work and the reward does not judge it token by token (docs/algorithms.md "Losses").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

AGGREGATIONS = ("token-mean", "seq-mean", "seq-mean-token-mean")
KL_LOG_RATIO_CLAMP = 20.0  # keeps exp() finite when a token's log-ratio is extreme


@dataclass
class LossConfig:
    """Policy-loss hyperparameters (defaults: design.md "RL")."""

    clip_ratio: float = field(default=0.2, metadata={"help": "PPO clip epsilon (lower side)"})
    clip_ratio_high: float | None = field(default=None, metadata={
        "help": "upper clip epsilon if different from clip_ratio (DAPO-style clip-higher)"})
    dual_clip: float | None = field(default=3.0, metadata={
        "help": "dual-clip constant c > 1 bounding the loss of negative-advantage tokens; "
                "None disables"})
    aggregation: str = field(default="token-mean", metadata={
        "help": "token-mean over all policy tokens of the batch, or seq-mean (= verl's "
                "seq-mean-token-mean: each trajectory's token mean, averaged)"})
    turn_weight_cap: int | None = field(default=None, metadata={
        "help": "a turn with more policy tokens than this counts as this many in the "
                "policy-gradient term (each token weighted cap / its turn's tokens); limits "
                "long, often cut-off turns; None = off"})
    copied_token_weight: float = field(default=1.0, metadata={
        "help": "multiplies the advantage of policy tokens that continue a span copied from "
                "the question or a tool reply (trainers.algorithms.copying; 1 = off, the "
                "papers'; 0 leaves copies to SFT and the KL term)"})
    copy_ngram: int = field(default=3, metadata={
        "help": "a policy token is a copy when the copy_ngram tokens ending at it occur in "
                "its context's environment tokens; a span's first copy_ngram - 1 tokens stay"})
    shared_context_baseline: bool = field(default=False, metadata={
        "help": "subtract from each policy token's advantage the mean advantage of the other "
                "rows of its group that chose a token in the same context (the same prefix "
                "of token ids): contexts where the group made no choice get no net push "
                "(trainers.algorithms.advantages.shared_context_baseline); False = the "
                "papers' advantages"})
    kl_coef: float = field(default=0.001, metadata={
        "help": "weight of the k3 KL to the reference policy; 0 skips it (no ref log-probs)"})
    kl_max: float | None = field(default=None, metadata={
        "help": "cap on each token's k3 KL term (verl caps it at 10); a token that fell "
                "further below the reference takes no KL gradient, so one collapsed token "
                "cannot outweigh the batch (the k3 gradient grows as exp(ref - logp)); None = "
                "uncapped, only the 20-nat log-ratio clamp"})
    negative_advantage_weight: float = field(default=1.0, metadata={
        "help": "multiplies negative advantages before the surrogate (1 = symmetric, the "
                "papers'; < 1 pushes sampled tokens down less than it pulls them up)"})
    entropy_coef: float = field(default=0.0, metadata={
        "help": "weight of the entropy bonus; needs per-token entropy"})
    tis_cap: float | None = field(default=None, metadata={
        "help": "truncated importance sampling cap for old/engine ratios; None disables"})

    def __post_init__(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {self.dual_clip}")
        if not (math.isfinite(self.negative_advantage_weight)
                and self.negative_advantage_weight >= 0):
            raise ValueError(f"negative_advantage_weight must be a finite number >= 0, got "
                             f"{self.negative_advantage_weight}")
        if not (math.isfinite(self.copied_token_weight) and self.copied_token_weight >= 0):
            raise ValueError(f"copied_token_weight must be a finite number >= 0, got "
                             f"{self.copied_token_weight}")
        if self.copy_ngram < 2:
            raise ValueError(f"copy_ngram must be >= 2 (tokens), got {self.copy_ngram}")
        if self.kl_max is not None and not self.kl_max > 0:
            raise ValueError(f"kl_max must be > 0 or None, got {self.kl_max}")
        if self.tis_cap is not None and self.tis_cap <= 0:
            raise ValueError(f"tis_cap must be > 0, got {self.tis_cap}")
        if self.turn_weight_cap is not None and self.turn_weight_cap < 1:
            raise ValueError(f"turn_weight_cap must be >= 1 (tokens) or None, got "
                             f"{self.turn_weight_cap}")


def require_finite(name: str, values: torch.Tensor, mask: torch.Tensor) -> None:
    """Raise FloatingPointError if `values` is NaN/inf anywhere `mask` is True."""
    bad = mask & ~torch.isfinite(values)
    if bad.any():
        position = [int(i) for i in bad.nonzero()[0]]
        raise FloatingPointError(
            f"{name} is not finite at {int(bad.sum())} policy token(s), first at {position}; "
            "check the model's dtype/overflow and the log-prob alignment")


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    """Reduce [B, L] per-token values over the mask to a scalar (see module docstring)."""
    maskf = mask.to(values.dtype)
    if mode == "token-mean":
        return (values * maskf).sum() / maskf.sum().clamp(min=1)
    if mode in ("seq-mean", "seq-mean-token-mean"):
        tokens = maskf.sum(1)
        per_sequence = (values * maskf).sum(1) / tokens.clamp(min=1)
        has_tokens = tokens > 0
        return per_sequence[has_tokens].sum() / has_tokens.sum().clamp(min=1)
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {mode!r}")


def turn_token_weights(turn_index: torch.Tensor, mask: torch.Tensor, cap: int) -> torch.Tensor:
    """[B, L] float32 weights: min(1, cap / tokens of the token's turn) on the mask, 0 off it.

    turn_index: [B, L] int64 turn of each policy token (-1 elsewhere); mask: [B, L] bool.
    """
    mask = mask.bool()
    turns = turn_index.clamp(min=0)
    width = int(turns.max()) + 1 if turns.numel() else 1
    counts = torch.zeros(turn_index.shape[0], width, device=turn_index.device)
    counts.scatter_add_(1, turns, mask.float())
    per_token = counts.gather(1, turns).clamp(min=1)
    return torch.where(mask, (cap / per_token).clamp(max=1.0), torch.zeros_like(per_token))


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref): exp(r) - r - 1 with r = ref - logp (>= 0)."""
    log_ratio = (ref_logprobs - logprobs).clamp(-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
    return torch.exp(log_ratio) - log_ratio - 1.0


def clipped_surrogate(logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                      advantages: torch.Tensor, clip_low: float, clip_high: float,
                      dual_clip: float | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token PPO loss [B, L] with optional dual clip, and per-token indicator tensors."""
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    indicators = {"ratio": ratio.detach(), "clipped": (clipped > unclipped).detach()}
    if dual_clip is not None:
        bound = -advantages * dual_clip
        dual = (advantages < 0) & (loss > bound)
        loss = torch.where(dual, bound, loss)
        indicators["dual_clipped"] = dual.detach()
    return loss, indicators


def ppo_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
             mask: torch.Tensor, config: LossConfig, ref_logprobs: torch.Tensor | None = None,
             engine_logprobs: torch.Tensor | None = None,
             entropy: torch.Tensor | None = None,
             token_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Scalar policy loss and diagnostics.

    logprobs [B, L] (with grad), old_logprobs / advantages / ref_logprobs / engine_logprobs /
    entropy / token_weights [B, L], mask [B, L] bool. token_weights (e.g. turn_token_weights)
    multiply the policy-gradient term per token; the aggregation's denominators stay. Raises FloatingPointError on non-finite inputs where
    the mask is True, ValueError when a term's inputs are missing.
    """
    mask = mask.bool()
    require_finite("logprobs", logprobs, mask)
    require_finite("old_logprobs", old_logprobs, mask)
    require_finite("advantages", advantages, mask)
    # Masked-out positions may hold anything (even NaN): zero them so no NaN leaks via 0 * NaN.
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    logprobs = torch.where(mask, logprobs, zero)
    old_logprobs = torch.where(mask, old_logprobs.to(logprobs.dtype), zero).detach()
    advantages = torch.where(mask, advantages.to(logprobs.dtype), zero).detach()
    if config.negative_advantage_weight != 1.0:
        advantages = torch.where(advantages < 0, advantages * config.negative_advantage_weight,
                                 advantages)
    clip_high = config.clip_ratio if config.clip_ratio_high is None else config.clip_ratio_high
    token_loss, indicators = clipped_surrogate(logprobs, old_logprobs, advantages,
                                               config.clip_ratio, clip_high, config.dual_clip)
    metrics: dict[str, float] = {}
    if config.tis_cap is not None:
        if engine_logprobs is None:
            raise ValueError("tis_cap is set but the batch has no engine_logprobs")
        require_finite("engine_logprobs", engine_logprobs, mask)
        engine = torch.where(mask, engine_logprobs.to(logprobs.dtype), zero)
        weight = torch.exp(old_logprobs - engine).clamp(max=config.tis_cap).detach()
        token_loss = token_loss * weight
        metrics["tis_weight_mean"] = float(aggregate(weight, mask))
    if token_weights is not None:
        token_loss = token_loss * torch.where(mask, token_weights.to(logprobs.dtype), zero).detach()
        metrics["token_weight_mean"] = float(aggregate(token_weights.to(logprobs.dtype), mask))
    policy_loss = aggregate(token_loss, mask, config.aggregation)
    loss = policy_loss
    if config.kl_coef != 0.0:
        if ref_logprobs is None:
            raise ValueError("kl_coef != 0 needs ref_logprobs (set kl_coef=0 to skip the KL)")
        require_finite("ref_logprobs", ref_logprobs, mask)
        ref = torch.where(mask, ref_logprobs.to(logprobs.dtype), zero).detach()
        per_token_kl = kl_k3(logprobs, ref)
        kl = aggregate(per_token_kl, mask, config.aggregation)
        if config.kl_max is not None:
            # The loss takes the capped term; the logged kl stays the true one, so a token
            # that collapsed still shows in the diagnostics.
            capped = per_token_kl.clamp(max=config.kl_max)
            loss = loss + config.kl_coef * aggregate(capped, mask, config.aggregation)
            metrics["kl_capped_fraction"] = float(
                (per_token_kl.detach() >= config.kl_max)[mask].float().mean())
        else:
            loss = loss + config.kl_coef * kl
        metrics["kl"] = float(kl.detach())
    if entropy is not None:
        require_finite("entropy", entropy, mask)
        entropy_mean = aggregate(torch.where(mask, entropy, zero), mask, config.aggregation)
        if config.entropy_coef != 0.0:
            loss = loss - config.entropy_coef * entropy_mean
        metrics["entropy"] = float(entropy_mean.detach())
    elif config.entropy_coef != 0.0:
        raise ValueError("entropy_coef != 0 needs per-token entropy")

    ratio = indicators["ratio"][mask]
    metrics.update({
        "policy_loss": float(policy_loss.detach()),
        "clip_fraction": float(indicators["clipped"][mask].float().mean()) if mask.any() else 0.0,
        "ratio_mean": float(ratio.mean()) if mask.any() else 1.0,
        "ratio_min": float(ratio.min()) if mask.any() else 1.0,
        "ratio_max": float(ratio.max()) if mask.any() else 1.0,
        "approx_kl_old": float(kl_k3(logprobs.detach(), old_logprobs)[mask].mean())
        if mask.any() else 0.0,
    })
    if "dual_clipped" in indicators:
        metrics["dual_clip_fraction"] = (float(indicators["dual_clipped"][mask].float().mean())
                                         if mask.any() else 0.0)
    return loss, metrics
