"""The algorithms that ship: IGPO (the DR-Venus recipe), GRPO and RLOO.

Each is a registered trainers.algorithms.registry.Algorithm; importing trainers.algorithms
registers them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from trainers.algorithms.advantages import (
    NORMALIZATION_MODES,
    broadcast_sequence_advantages,
    broadcast_turn_advantages,
    grpo_advantages,
    igpo_turn_advantages,
    rloo_advantages,
)
from trainers.algorithms.information_gain import InformationGainConfig, score_batch
from trainers.algorithms.probes import build_probe_template, build_probes, encode_text
from trainers.algorithms.registry import (
    Advantages,
    Algorithm,
    PolicyGradientConfig,
    PolicyScoring,
    register_algorithm,
)
from trainers.algorithms.rewards import (
    RewardConfig,
    TurnRewards,
    distractor_answers,
    probe_slots,
    turn_reward_metrics,
    turn_rewards,
)
from trainers.batch import RolloutBatch


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
                "discounting skips penalties, so they stay on their turn (trainers.algorithms.advantages); "
                "false: the paper's chain through every reward-bearing turn"})

    def __post_init__(self) -> None:
        if self.normalization not in NORMALIZATION_MODES:
            raise ValueError(f"normalization must be one of {NORMALIZATION_MODES}")


@register_algorithm("igpo")
class IGPO(Algorithm):
    """Information-gain turn rewards + outcome, group-normalised, discounted per turn."""

    config_class = IGPOConfig
    needs_probe_scores = True

    def score(self, policy: PolicyScoring, batch: RolloutBatch, answers: list[list[str]],
              distractors: list[list[str]] | None = None) -> dict[str, torch.Tensor]:
        """boundary_scores (each probed boundary's log-probability of the gold answer, or
        gold - distractors) and old_logprobs from one fused forward per trajectory
        (trainers.algorithms.information_gain.score_batch)."""
        template = self.probe_template(policy)
        probes = [build_probes(policy.tokenizer, template, gold) for gold in answers]
        wrong = None if distractors is None else [
            build_probes(policy.tokenizer, template, other) for other in distractors]
        with policy.autocast():
            scored = score_batch(policy.model, batch, probes, self.probe_slots(batch),
                                 InformationGainConfig(temperature=policy.temperature),
                                 distractors=wrong)
        return {"boundary_scores": scored.boundary_scores,
                "old_logprobs": scored.old_logprobs}

    def probe_template(self, policy: PolicyScoring) -> Any:
        """The probe continuation of a turn boundary for this policy's chat format: the
        policy's turns open with the assistant header followed by "<think>\n" (the DR-Venus
        turn format), and the probe continues exactly there. Built once per tokenizer."""
        cached = getattr(self, "_probe_template", None)
        if cached is None or cached[0] is not policy.tokenizer:
            template = build_probe_template(
                policy.tokenizer, list(policy.chat.generation_prompt_ids)
                + encode_text(policy.tokenizer, "<think>\n"),
                eos_token_id=policy.chat.end_of_turn_id)
            cached = self._probe_template = (policy.tokenizer, template)
        return cached[1]

    def probe_slots(self, batch: RolloutBatch) -> torch.Tensor:
        """[B, T+1] bool: the boundaries to probe (trainers.algorithms.information_gain.score_batch)."""
        return probe_slots(batch, self.config.reward)

    def turn_rewards(self, batch: RolloutBatch) -> TurnRewards:
        """Information gain, format penalty and outcome per turn (trainers.algorithms.rewards)."""
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
