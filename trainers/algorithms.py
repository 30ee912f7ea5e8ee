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
from trainers.losses import LossConfig, ppo_loss, turn_token_weights
from trainers.rewards import (
    RewardConfig,
    TurnRewards,
    distractor_answers,
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
    config: its config dataclass), wrapped in `Placebo` when the config says `placebo: true`."""
    algorithm = algorithm_class(name)(config)
    if getattr(algorithm.config, "placebo", False):
        return Placebo(algorithm)
    return algorithm


@dataclass
class PolicyGradientConfig:
    """Base config: every algorithm has a policy loss (and can run as a placebo)."""

    loss: LossConfig = field(default_factory=LossConfig, metadata={
        "help": "clipped-surrogate loss settings (trainers.losses.LossConfig)"})
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
    format_isolated: bool = field(default=True, metadata={
        "help": "a malformed turn's advantage is its own normalised penalty (never > 0) and "
                "discounting skips penalties, so they stay on their turn (trainers.advantages); "
                "false: the paper's chain through every reward-bearing turn"})

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

    def probe_distractors(self, batch: RolloutBatch, answers: list[list[str]]
                          ) -> list[list[str]] | None:
        """Other tasks' gold answers when ig_baseline is 'contrastive' (else None)."""
        if self.config.reward.ig_baseline != "contrastive":
            return None
        return distractor_answers(answers, batch.group_ids, self.config.reward.ig_distractors)

    def advantages(self, batch: RolloutBatch, rewards: TurnRewards) -> Advantages:
        turn_advantages, metrics = igpo_turn_advantages(
            rewards, batch.group_ids, self.config.normalization, self.config.gamma,
            (self.config.ig_scale_min, self.config.ig_scale_max),
            format_isolated=self.config.format_isolated,
            malformed=batch.turn_valid & ~batch.turn_format_ok)
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
