"""Algorithm registry: small objects with `turn_rewards`, `advantages` and `loss`.

The RL step (trainers.rl.driver and its learners) only knows this interface:

    algorithm = make_algorithm("igpo")                   # or "grpo", "rloo", your own
    algorithm.kl_coef, algorithm.loss_aggregation        # learners: reference copy, loss units
    distractors = algorithm.probe_distractors(batch, answers)   # contrastive IG, or None
    scores = algorithm.score(policy, batch, answers, distractors)   # on each learner:
        # old_logprobs, plus what the algorithm needs scored (IGPO: boundary_scores from
        # its fused probe pass); `policy` is the learner's PolicyScoring
    rewards = algorithm.turn_rewards(batch)              # TurnRewards [B, T], pure
    advantages, metrics = algorithm.weighted_advantages(batch, rewards)  # [B, L], pure
    batch = batch.replace(advantages=advantages)
    loss, metrics = algorithm.loss(batch, logprobs)      # logprobs [B, L] with grad

Rewards and advantages run once per step on the whole batch (group statistics need every
rollout of a group); the loss runs per micro-batch and needs only the batch's advantages
and log-probs.

Adding an algorithm is one file (docs/algorithms.md), registered by name or loaded by
`make_algorithm("package.module:ClassName")` (`venus-gym rl --algorithm package.module:Name`):

    @register_algorithm("my_algo")
    class MyAlgorithm(Algorithm):
        config_class = MyConfig                          # a dataclass with a `loss` field
        def advantages(self, batch, rewards): ...        # -> Advantages(tokens, metrics)

`turn_rewards` defaults to the outcome on each trajectory's last turn; the loss defaults to
the PPO/GRPO clipped surrogate of trainers.algorithms.losses with the config's LossConfig; override
either for something else.

Placebo control: every algorithm whose config inherits PolicyGradientConfig takes
`placebo: true`; make_algorithm then wraps it in `Placebo`, which multiplies each
trajectory's advantages by a random sign, +1 or -1, drawn from a hash of `placebo_seed` and
the trajectory's token ids (a pure function of the batch: the same run seed gives the same
trajectories and so the same signs, and a resumed run draws exactly the signs of the
uninterrupted one). The update then has the real run's magnitudes, clipping and step
sizes but no signal: learning beyond the placebo is learning from the rewards.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import torch

from trainers.algorithms.advantages import broadcast_turn_advantages, shared_context_baseline
from trainers.algorithms.copying import copied_tokens
from trainers.algorithms.losses import LossConfig, ppo_loss, turn_token_weights
from trainers.algorithms.rewards import (
    TurnRewards,
    outcome_rewards,
)
from trainers.batch import RolloutBatch

_REGISTRY: dict[str, type[Algorithm]] = {}


@dataclass(frozen=True)
class PolicyScoring:
    """What a learner lends an algorithm to score a batch with (Algorithm.score).

    model: the policy module that scores (eval mode, no gradients are taken);
    tokenizer, chat: its tokenizer and chat format (trainers.modeling.models.load_policy);
    temperature: the rollout temperature (scores use logits / temperature);
    logprobs(batch): [B, L] float32 log-probs of the batch's tokens under `model`, aligned
        with input_ids (the learner's packed or padded forward);
    autocast(): the learner's precision context for a forward of `model`.
    """

    model: torch.nn.Module
    tokenizer: Any
    chat: Any
    temperature: float
    logprobs: Callable[[RolloutBatch], torch.Tensor]
    autocast: Callable[[], AbstractContextManager[Any]]


class Advantages(NamedTuple):
    """tokens: [B, L] float32 advantages (0 off the policy tokens); metrics: diagnostics."""

    tokens: torch.Tensor
    metrics: dict[str, float]


def register_algorithm(name: str):
    """Class decorator: make an Algorithm subclass available as make_algorithm(name)."""

    def decorate(cls: type[Algorithm]) -> type[Algorithm]:
        if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
            raise TypeError(f"@register_algorithm({name!r}) expects an Algorithm subclass")
        existing = _REGISTRY.get(name)
        if existing is not None and existing.__qualname__ != cls.__qualname__:
            raise ValueError(f"algorithm {name!r} is already registered by {existing.__qualname__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def available_algorithms() -> list[str]:
    return sorted(_REGISTRY)


def algorithm_class(name: str) -> type[Algorithm]:
    """The Algorithm class called `name`: a registered name, or "package.module:ClassName"
    (a plug-in: the module is imported and the class is registered under that spelling, so
    make_algorithm and configs can name it; see docs/algorithms.md)."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" not in name:
        raise KeyError(f"unknown algorithm {name!r}; registered: {available_algorithms()}, or "
                       "name a plug-in as 'package.module:ClassName'")
    module_name, _, class_name = name.partition(":")
    if not module_name or not class_name:
        raise KeyError(f"algorithm {name!r}: a plug-in is named 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise KeyError(f"algorithm {name!r}: cannot import module {module_name!r} ({error}); "
                       "is it on PYTHONPATH or installed?") from error
    cls = getattr(module, class_name, None)
    if cls is None:
        public = sorted(n for n in vars(module) if not n.startswith("_"))
        raise KeyError(f"algorithm {name!r}: module {module_name!r} has no {class_name!r}; it "
                       f"defines {public}")
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise KeyError(f"algorithm {name!r}: {class_name} is not a subclass of "
                       "trainers.algorithms.Algorithm")
    # Registered under the spelling used to find it; a class that registered itself under a
    # short name by its decorator keeps that `name`.
    _REGISTRY[name] = cls
    if "name" not in vars(cls):  # not registered by its own decorator
        cls.name = name
    return cls


def make_algorithm(name: str, config: Any = None) -> Algorithm:
    """An instance of the algorithm `name` (a registered name or "package.module:Class";
    config: its config dataclass), wrapped in `Placebo` when the config says `placebo: true`."""
    algorithm = algorithm_class(name)(config)
    if getattr(algorithm.config, "placebo", False):
        return Placebo(algorithm)
    return algorithm


@dataclass
class PolicyGradientConfig:
    """Base config: every algorithm has a policy loss (and can run as a placebo)."""

    loss: LossConfig = field(default_factory=LossConfig, metadata={
        "help": "clipped-surrogate loss settings (trainers.algorithms.losses.LossConfig)"})
    placebo: bool = field(default=False, metadata={
        "help": "placebo control: multiply each trajectory's advantages by a random +1/-1 "
                "(same magnitudes, no signal); see trainers.algorithms"})
    placebo_seed: int = field(default=0, metadata={
        "help": "placebo: seed hashed with each trajectory's token ids into its sign"})


class Algorithm:
    """Base class. Subclasses set `config_class` and implement `advantages`; they may
    override `turn_rewards` (default: outcome only) and `loss` (default: clipped PPO)."""

    name: ClassVar[str] = ""
    config_class: ClassVar[type] = PolicyGradientConfig
    needs_probe_scores: ClassVar[bool] = False

    def __init__(self, config: Any = None) -> None:
        self.config = self.config_class() if config is None else config
        if not isinstance(self.config, self.config_class):
            raise TypeError(f"{type(self).__name__} takes a {self.config_class.__name__}, "
                            f"got {type(config).__name__}")

    @property
    def kl_coef(self) -> float:
        """Weight of the KL to the reference policy; the learners keep a frozen reference
        copy only when it is > 0. Default: the config's loss.kl_coef."""
        return float(self.config.loss.kl_coef or 0.0)

    @property
    def loss_aggregation(self) -> str:
        """How the loss averages over policy tokens ("token-mean" or "seq-mean"): the units
        each learner's share of a mini-batch is counted in. Default: the config's
        loss.aggregation."""
        return self.config.loss.aggregation

    def score(self, policy: PolicyScoring, batch: RolloutBatch, answers: list[list[str]],
              distractors: list[list[str]] | None = None) -> dict[str, torch.Tensor]:
        """What the learners compute for every row of a rollout batch before its rewards,
        without gradients: "old_logprobs" [B, L] (the behaviour log-probs of the PPO ratio)
        and any score the algorithm's turn_rewards read (IGPO: "boundary_scores" [B, T+1]).
        answers / distractors: per row, the gold answers and wrong ones to probe (or None).
        Default: the old log-probs only. The reference log-probs of the KL term are the
        learner's (it keeps the reference copy when kl_coef > 0)."""
        return {"old_logprobs": policy.logprobs(batch)}

    def probe_slots(self, batch: RolloutBatch) -> torch.Tensor:
        """[B, T+1] bool: the turn boundaries whose probe scores `score` computes
        (trainers.algorithms.information_gain.score_batch), when `needs_probe_scores`."""
        raise NotImplementedError(f"{type(self).__name__} sets needs_probe_scores but does "
                                  "not say which boundaries to probe (probe_slots)")

    def turn_rewards(self, batch: RolloutBatch) -> TurnRewards:
        """Per-turn rewards, a pure function of the scored batch (outcome, format validity,
        probe scores). Default: each trajectory's outcome on its last turn."""
        return outcome_rewards(batch)

    def probe_distractors(self, batch: RolloutBatch, answers: list[list[str]]
                          ) -> list[list[str]] | None:
        """Per row, wrong answers the learners score alongside the gold ones (contrastive
        IG), or None (the default: no distractors)."""
        return None

    def advantages(self, batch: RolloutBatch, rewards: TurnRewards) -> Advantages:
        """[B, L] token advantages and diagnostics from the batch and its turn rewards."""
        raise NotImplementedError

    def weighted_advantages(self, batch: RolloutBatch, rewards: TurnRewards) -> Advantages:
        """`advantages`, then the loss config's shared-context baseline
        (trainers.algorithms.advantages.shared_context_baseline) and its copied_token_weight
        on the tokens that continue a copied span (trainers.algorithms.copying); what the RL
        step calls. The whole step's batch is needed: groups for the baseline, and its rows'
        shared prefix (the system prompt) for the copies."""
        tokens, metrics = self.advantages(batch, rewards)
        loss = self.config.loss
        if loss.shared_context_baseline:
            bad_turns = (batch.turn_valid & ~batch.turn_format_ok).float()
            malformed = broadcast_turn_advantages(bad_turns, batch.turn_index,
                                                  batch.loss_mask.bool()) > 0
            tokens, baseline_metrics = shared_context_baseline(
                tokens, batch.input_ids, batch.lengths, batch.loss_mask, batch.group_ids,
                malformed)
            metrics = {**metrics, **baseline_metrics}
        if loss.copied_token_weight == 1.0:
            return Advantages(tokens, metrics)
        copied = copied_tokens(batch, loss.copy_ngram)
        policy = batch.loss_mask.bool()
        metrics = {**metrics, "copied_token_fraction":
                   float(copied.sum()) / max(1, int(policy.sum()))}
        return Advantages(torch.where(copied, tokens * loss.copied_token_weight, tokens), metrics)

    def loss(self, batch: RolloutBatch, logprobs: torch.Tensor,
             entropy: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """Scalar loss and diagnostics. logprobs / entropy: [B, L] aligned with input_ids."""
        if batch.advantages is None or batch.old_logprobs is None:
            raise ValueError("the batch needs advantages and old_logprobs before the loss: "
                             "batch.replace(advantages=algorithm.advantages(batch, "
                             "algorithm.turn_rewards(batch)).tokens)")
        if logprobs.shape != batch.input_ids.shape:
            raise ValueError(f"logprobs must be [B, L] = {list(batch.input_ids.shape)}, got "
                             f"{list(logprobs.shape)}")
        cap = self.config.loss.turn_weight_cap
        weights = None if cap is None else turn_token_weights(batch.turn_index,
                                                              batch.loss_mask, cap)
        loss, metrics = ppo_loss(logprobs, batch.old_logprobs, batch.advantages, batch.loss_mask,
                                 self.config.loss, ref_logprobs=batch.ref_logprobs,
                                 engine_logprobs=batch.engine_logprobs, entropy=entropy,
                                 token_weights=weights)
        return loss, metrics


def placebo_signs(batch: RolloutBatch, seed: int) -> torch.Tensor:
    """[B] float32 of +1 / -1: one sign per trajectory from a hash of `seed` and its real
    token ids (pure: the same trajectories and seed always give the same signs)."""
    signs = []
    for row in range(batch.batch_size):
        ids = batch.input_ids[row, :int(batch.lengths[row])].to(torch.int64).cpu().numpy()
        digest = hashlib.sha256(seed.to_bytes(8, "little", signed=True) + ids.tobytes()).digest()
        signs.append(1.0 if digest[0] & 1 else -1.0)
    return torch.tensor(signs, device=batch.input_ids.device)


class Placebo(Algorithm):
    """The wrapped algorithm with each trajectory's advantages times a random sign
    (placebo_signs). Everything else (probe slots, turn rewards, loss) is the wrapped one's."""

    def __init__(self, inner: Algorithm) -> None:
        self.inner = inner
        self.config = inner.config
        self.name = f"{inner.name}+placebo"
        self.needs_probe_scores = inner.needs_probe_scores

    @property
    def kl_coef(self) -> float:
        return self.inner.kl_coef

    @property
    def loss_aggregation(self) -> str:
        return self.inner.loss_aggregation

    def score(self, policy: PolicyScoring, batch: RolloutBatch, answers: list[list[str]],
              distractors: list[list[str]] | None = None) -> dict[str, torch.Tensor]:
        return self.inner.score(policy, batch, answers, distractors)

    def probe_slots(self, batch: RolloutBatch) -> torch.Tensor:
        return self.inner.probe_slots(batch)

    def probe_distractors(self, batch: RolloutBatch, answers: list[list[str]]
                          ) -> list[list[str]] | None:
        return self.inner.probe_distractors(batch, answers)

    def turn_rewards(self, batch: RolloutBatch) -> TurnRewards:
        return self.inner.turn_rewards(batch)

    def advantages(self, batch: RolloutBatch, rewards: TurnRewards) -> Advantages:
        tokens, metrics = self.inner.advantages(batch, rewards)
        signs = placebo_signs(batch, self.config.placebo_seed)
        return Advantages(tokens * signs[:, None].to(tokens.dtype),
                          {**metrics, "placebo_negated_fraction": float((signs < 0).float().mean())})

    def loss(self, batch: RolloutBatch, logprobs: torch.Tensor,
             entropy: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        return self.inner.loss(batch, logprobs, entropy)
