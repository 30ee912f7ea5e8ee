"""Algorithm registry: small objects with `turn_rewards`, `advantages` and `loss`.

The RL step (trainers.rl.driver) only knows this interface:

    algorithm = make_algorithm("igpo")                   # or "grpo", "rloo", your own
    if algorithm.needs_probe_scores:                     # IGPO: the fused probe pass
        slots = algorithm.probe_slots(batch)
        batch = score_batch(model, batch, probes, slots) # boundary_scores + old_logprobs
    rewards = algorithm.turn_rewards(batch)              # TurnRewards [B, T], pure
    advantages, metrics = algorithm.advantages(batch, rewards)  # [B, L] float32, pure
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
the PPO/GRPO clipped surrogate of trainers.losses with the config's LossConfig; override
either for something else.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import torch

from trainers.advantages import (
    NORMALIZATION_MODES,
    broadcast_sequence_advantages,
    broadcast_turn_advantages,
    grpo_advantages,
    igpo_turn_advantages,
    rloo_advantages,
)
from trainers.batch import RolloutBatch
from trainers.losses import LossConfig, ppo_loss
from trainers.rewards import (
    RewardConfig,
    TurnRewards,
    outcome_rewards,
    probe_slots,
    turn_reward_metrics,
    turn_rewards,
)

_REGISTRY: dict[str, type[Algorithm]] = {}


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
    config: its config dataclass)."""
    return algorithm_class(name)(config)


@dataclass
class PolicyGradientConfig:
    """Base config: every algorithm has a policy loss."""

    loss: LossConfig = field(default_factory=LossConfig, metadata={
        "help": "clipped-surrogate loss settings (trainers.losses.LossConfig)"})


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

    def turn_rewards(self, batch: RolloutBatch) -> TurnRewards:
        """Per-turn rewards, a pure function of the scored batch (outcome, format validity,
        probe scores). Default: each trajectory's outcome on its last turn."""
        return outcome_rewards(batch)

    def advantages(self, batch: RolloutBatch, rewards: TurnRewards) -> Advantages:
        """[B, L] token advantages and diagnostics from the batch and its turn rewards."""
        raise NotImplementedError

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
        loss, metrics = ppo_loss(logprobs, batch.old_logprobs, batch.advantages, batch.loss_mask,
                                 self.config.loss, ref_logprobs=batch.ref_logprobs,
                                 engine_logprobs=batch.engine_logprobs, entropy=entropy)
        return loss, metrics


@dataclass
class IGPOConfig(PolicyGradientConfig):
    """IGPO with the DR-Venus changes (docs/algorithms.md)."""

    reward: RewardConfig = field(default_factory=RewardConfig, metadata={
        "help": "turn reward assignment (IG kind, browse-aware, format penalty)"})
    normalization: str = field(default="scaled_separate", metadata={
        "help": "group normalisation: scaled_separate (with IG-Scale), separate or joint"})
    gamma: float = field(default=0.95, metadata={
        "help": "discount over reward-bearing turn boundaries"})
    ig_scale_min: float = field(default=0.3, metadata={
        "help": "IG-Scale floor on mean|o~| (keeps IG alive when outcomes are all equal)"})
    ig_scale_max: float = field(default=10.0, metadata={"help": "IG-Scale upper bound"})

    def __post_init__(self) -> None:
        if self.normalization not in NORMALIZATION_MODES:
            raise ValueError(f"normalization must be one of {NORMALIZATION_MODES}")


@register_algorithm("igpo")
class IGPO(Algorithm):
    """Information-gain turn rewards + outcome, group-normalised, discounted per turn."""

    config_class = IGPOConfig
    needs_probe_scores = True

    def probe_slots(self, batch: RolloutBatch) -> torch.Tensor:
        """[B, T+1] bool: the boundaries to probe (trainers.information_gain.score_batch)."""
        return probe_slots(batch, self.config.reward)

    def turn_rewards(self, batch: RolloutBatch) -> TurnRewards:
        """Information gain, format penalty and outcome per turn (trainers.rewards)."""
        return turn_rewards(batch, self.config.reward)

    def advantages(self, batch: RolloutBatch, rewards: TurnRewards) -> Advantages:
        turn_advantages, metrics = igpo_turn_advantages(
            rewards, batch.group_ids, self.config.normalization, self.config.gamma,
            (self.config.ig_scale_min, self.config.ig_scale_max))
        metrics.update(turn_reward_metrics(batch, rewards))
        tokens = broadcast_turn_advantages(turn_advantages, batch.turn_index, batch.loss_mask)
        return Advantages(tokens, metrics)


@register_algorithm("grpo")
class GRPO(Algorithm):
    """Outcome only: each trajectory's z-scored outcome on all its policy tokens (the
    paper's baseline)."""

    def advantages(self, batch: RolloutBatch, rewards: TurnRewards) -> Advantages:
        per_sequence = grpo_advantages(rewards.outcome, batch.group_ids)
        return Advantages(broadcast_sequence_advantages(per_sequence, batch.loss_mask),
                          {"advantage_abs_mean": float(per_sequence.abs().mean())})


@register_algorithm("rloo")
class RLOO(Algorithm):
    """REINFORCE leave-one-out: outcome minus the mean outcome of the group's other
    rollouts, unnormalised, on all policy tokens."""

    def advantages(self, batch: RolloutBatch, rewards: TurnRewards) -> Advantages:
        per_sequence = rloo_advantages(rewards.outcome, batch.group_ids)
        return Advantages(broadcast_sequence_advantages(per_sequence, batch.loss_mask),
                          {"advantage_abs_mean": float(per_sequence.abs().mean())})
