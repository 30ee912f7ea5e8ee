"""Turn rewards: information gain, browse-aware assignment, format penalty, outcome.

Pure functions of a scored RolloutBatch (outcome, per-turn format validity, probe scores):
the RL step's reward stage, between scoring and advantages (`Algorithm.turn_rewards`).
`turn_rewards` is IGPO's; `outcome_rewards` (outcome on the last turn only) is the
outcome-only algorithms'. Every turn gets one role:

    OUTCOME      the trajectory's last turn. Reward: the outcome score, or -format_penalty
                 if that turn is malformed. (A trajectory cut off by a limit also ends in
                 its outcome turn: its outcome score is whatever the environment gave, 0.)
    INFO_GAIN    a valid non-final IG turn; reward: its information gain.
    PENALTY      a malformed non-final turn; reward: -format_penalty (instead of its IG).
    CARRIER      a valid non-final turn without its own reward: with browse-aware
                 assignment, the search turns. It takes the advantage of the next INFO_GAIN
                 or OUTCOME turn after it, skipping penalised turns (trainers.algorithms.advantages):
                 "the search turns since the last browse share that browse turn's segment".
                 Search turns after the last browse share the outcome turn's segment.
INFO_GAIN and PENALTY turns are the "turn rewards" that group normalisation pools.

Information gain, from probe scores s at boundaries (trainers.algorithms.information_gain):
    browse_aware=False: every valid non-final turn t is an IG turn and
                        IG_t = s(h_<=t) - s(h_<t)   (boundary of turn t minus turn t-1)
    browse_aware=True:  only valid browse turns (kind in browse_kinds, default visit) are
                        IG turns and IG_t = s(h_<=t) - s(previous IG turn's boundary, or the
                        question-only baseline); the IGs of a trajectory then telescope to
                        s(last browse boundary) - s(question).
    ig_kind="log" (default, the DR-Venus paper) uses s as is (mean answer log-prob);
    ig_kind="prob" (IGPO's original) uses exp(s).
    ig_baseline (what IG is measured against):
      "question" (default, the paper)  as above: the previous IG turn's boundary, or the
                                       question-only history for the first one.
      "previous_turn"                  the boundary just before the IG turn, h_<t: a visit's
                                       IG is what that visit alone added (with browse-aware
                                       assignment the searches before it no longer count).
      "contrastive"                    as "question", but every score is contrastive:
                                       s_gold - mean s_distractor, distractors being other
                                       tasks' gold answers in the batch
                                       (`distractor_answers`, scored by score_batch).

Where we deviate and why: the paper has only "question". On a tiny model the question-only
score jumps ~+0.8 nats after any turn, malformed ones included, and about as much for wrong
answers as for the gold one (0.83 gold vs 0.74 other answers), so first-visit IG is mostly
a bonus for visiting. "contrastive" cancels the answer-independent part and
"previous_turn" drops the question-only baseline; benchmarks/ig_content.py measures which
variant carries content (docs/benchmarks.md). The default stays the paper's until a run
shows a variant learns better.

Malformed turns never get IG (they get the penalty instead), and an IG turn is never the
last turn (the last turn is scored by the outcome).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from trainers.batch import PAD_TURN, RolloutBatch, TurnKind

IG_KINDS = ("log", "prob")
IG_BASELINES = ("question", "previous_turn", "contrastive")


class TurnRole(enum.IntEnum):
    """Role codes stored in TurnRewards.role (PAD = -1 on padding turns)."""

    CARRIER = 0
    INFO_GAIN = 1
    PENALTY = 2
    OUTCOME = 3


@dataclass
class RewardConfig:
    """How turn rewards are assigned."""

    ig_kind: str = field(default="log", metadata={
        "help": "information gain as a difference of mean answer log-probs ('log', DR-Venus) "
                "or of their exponentials ('prob', the original IGPO)"})
    browse_aware: bool = field(default=True, metadata={
        "help": "IG only at browse turns, measured from the previous browse boundary; search "
                "turns share the next browse turn's advantage"})
    browse_kinds: tuple[str, ...] = field(default=("visit",), metadata={
        "help": "turn kinds that count as browsing when browse_aware is on"})
    format_penalty: float = field(default=1.0, metadata={
        "help": "a malformed turn's reward is -format_penalty (instead of IG or the outcome)"})
    ig_baseline: str = field(default="question", metadata={
        "help": "what IG is measured against: 'question' (previous IG boundary or the "
                "question-only history, the paper), 'previous_turn' (the boundary just "
                "before the IG turn) or 'contrastive' (as 'question' with gold-minus-"
                "distractor scores; distractors: other tasks' answers in the batch)"})
    ig_distractors: int = field(default=4, metadata={
        "help": "contrastive IG: most distractor answers per trajectory (the first gold "
                "answer of up to this many other groups of the step)"})

    def __post_init__(self) -> None:
        if self.ig_kind not in IG_KINDS:
            raise ValueError(f"ig_kind must be one of {IG_KINDS}, got {self.ig_kind!r}")
        if self.ig_baseline not in IG_BASELINES:
            raise ValueError(f"ig_baseline must be one of {IG_BASELINES}, got "
                             f"{self.ig_baseline!r}")
        if self.ig_baseline == "contrastive" and self.ig_kind != "log":
            raise ValueError("ig_baseline 'contrastive' subtracts mean distractor log-probs; "
                             "use it with ig_kind 'log'")
        if self.ig_distractors < 1:
            raise ValueError(f"ig_distractors must be >= 1, got {self.ig_distractors}")
        if self.format_penalty < 0:
            raise ValueError("format_penalty is a magnitude; give a value >= 0")
        for kind in self.browse_kinds:
            TurnKind.parse(kind)


@dataclass
class TurnRewards:
    """Per-turn rewards of a batch.

    reward:           [B, T] float32, the reward of INFO_GAIN, PENALTY and OUTCOME turns,
                      0 on carriers and padding.
    role:             [B, T] int64, TurnRole codes, -1 on padding turns.
    information_gain: [B, T] float32, IG of IG turns, NaN elsewhere (for diagnostics).
    """

    reward: torch.Tensor
    role: torch.Tensor
    information_gain: torch.Tensor

    @property
    def outcome(self) -> torch.Tensor:
        """[B] float32: the reward of each trajectory's OUTCOME turn (exactly one per row)."""
        return (self.reward.float() * (self.role == TurnRole.OUTCOME)).sum(1)


def ig_turn_mask(batch: RolloutBatch, config: RewardConfig) -> torch.Tensor:
    """[B, T] bool: turns whose reward is information gain."""
    eligible = batch.turn_valid & batch.turn_format_ok & ~batch.is_last_turn
    if config.browse_aware:
        browse_codes = torch.tensor([int(TurnKind.parse(k)) for k in config.browse_kinds],
                                    device=batch.turn_kind.device)
        eligible &= torch.isin(batch.turn_kind, browse_codes)
    return eligible


def ig_reference_slots(batch: RolloutBatch, config: RewardConfig) -> torch.Tensor:
    """[B, T] int64: the probe slot each turn's IG is measured from.

    Slots index boundary_scores: 0 = question-only baseline, t + 1 = end of turn t.
    """
    B, T = batch.turn_kind.shape
    device = batch.turn_kind.device
    turn_ids = torch.arange(T, device=device).expand(B, T)
    if not config.browse_aware or config.ig_baseline == "previous_turn":
        return turn_ids.clone()  # the previous turn's boundary is slot t
    ig_turn = ig_turn_mask(batch, config)
    last_ig_turn = torch.where(ig_turn, turn_ids, torch.full_like(turn_ids, -1)).cummax(1).values
    previous_ig_turn = torch.cat([torch.full((B, 1), -1, device=device), last_ig_turn[:, :-1]],
                                 dim=1)
    return previous_ig_turn + 1


def distractor_answers(answers: list[list[str]], group_ids: torch.Tensor, count: int
                       ) -> list[list[str]]:
    """Per row, up to `count` wrong answers: the first gold answer of each other group of
    the batch, taken in group order starting after the row's own group, skipping any that
    equals one of the row's gold answers or an answer already taken (case and surrounding
    spaces ignored).

    A pure function of the batch, so every learner count gives the same distractors.
    """
    first: dict[int, str] = {}
    for row, group in enumerate(group_ids.tolist()):
        if answers[row] and group not in first:
            first[group] = answers[row][0]
    groups = sorted(first)
    result = []
    for row, group in enumerate(group_ids.tolist()):
        own = {a.strip().lower() for a in answers[row]}
        start = next((i for i, g in enumerate(groups) if g > group), len(groups))
        ordered = groups[start:] + groups[:start]
        wrong: list[str] = []
        for other in ordered:
            key = first[other].strip().lower()
            if other != group and key not in own and len(wrong) < count:
                wrong.append(first[other])
                own.add(key)  # each distinct answer once
        result.append(wrong)
    return result


def probe_slots(batch: RolloutBatch, config: RewardConfig) -> torch.Tensor:
    """[B, T+1] bool: the boundaries whose probe scores turn_rewards will read."""
    ig_turn = ig_turn_mask(batch, config)
    B, T = batch.turn_kind.shape
    slots = torch.zeros(B, T + 1, dtype=torch.bool, device=batch.turn_kind.device)
    slots[:, 1:] |= ig_turn
    rows, turns = ig_turn.nonzero(as_tuple=True)
    slots[rows, ig_reference_slots(batch, config)[rows, turns]] = True
    return slots


def turn_rewards(batch: RolloutBatch, config: RewardConfig) -> TurnRewards:
    """Assign every turn its role and reward (see module docstring)."""
    valid, last = batch.turn_valid, batch.is_last_turn
    malformed = valid & ~batch.turn_format_ok
    ig_turn = ig_turn_mask(batch, config)
    penalty = -float(config.format_penalty)

    information_gain = torch.full(batch.turn_kind.shape, float("nan"), device=batch.turn_kind.device)
    if ig_turn.any():
        if batch.boundary_scores is None:
            raise ValueError("IG turns need probe scores: run trainers.algorithms.information_gain."
                             "score_batch(model, batch, probes, probe_slots(batch, config))")
        scores = batch.boundary_scores.float()
        if config.ig_kind == "prob":
            scores = scores.exp()
        current = scores[:, 1:]
        previous = scores.gather(1, ig_reference_slots(batch, config))
        gain = current - previous
        missing = ig_turn & ~torch.isfinite(gain)
        if missing.any():
            row, turn = (int(i) for i in missing.nonzero()[0])
            raise ValueError(f"row {row}, turn {turn}: probe score missing (NaN) at a boundary "
                             "that IG needs; probe the slots given by probe_slots(batch, config)")
        information_gain = torch.where(ig_turn, gain, information_gain)

    outcome = torch.where(batch.turn_format_ok, batch.outcome[:, None].float(),
                          torch.full_like(information_gain, penalty))
    reward = torch.zeros_like(information_gain)
    reward = torch.where(ig_turn, information_gain, reward)
    reward = torch.where(malformed & ~last, torch.full_like(reward, penalty), reward)
    reward = torch.where(last, outcome, reward)

    role = torch.full_like(batch.turn_kind, PAD_TURN)
    role[valid] = int(TurnRole.CARRIER)
    role[ig_turn] = int(TurnRole.INFO_GAIN)
    role[malformed & ~last] = int(TurnRole.PENALTY)
    role[last] = int(TurnRole.OUTCOME)
    return TurnRewards(reward=torch.where(valid, reward, torch.zeros_like(reward)), role=role,
                       information_gain=information_gain)


def outcome_rewards(batch: RolloutBatch) -> TurnRewards:
    """Outcome only (GRPO, RLOO): the outcome score on each trajectory's last turn, as it
    is (no format penalty), and no reward on the other turns, which are carriers."""
    last = batch.is_last_turn
    reward = torch.where(last, batch.outcome[:, None].float(),
                         torch.zeros(batch.turn_kind.shape, device=batch.turn_kind.device))
    role = torch.full_like(batch.turn_kind, PAD_TURN)
    role[batch.turn_valid] = int(TurnRole.CARRIER)
    role[last] = int(TurnRole.OUTCOME)
    return TurnRewards(reward=reward, role=role,
                       information_gain=torch.full_like(reward, float("nan")))


def turn_reward_metrics(batch: RolloutBatch, rewards: TurnRewards | None = None) -> dict[str, float]:
    """Diagnostics: format-error rates and IG mean/std/count per turn kind."""
    valid = batch.turn_valid
    metrics = {
        "format_error_rate": float((~batch.turn_format_ok[valid]).float().mean()),
        "format_error_rate_final": float((~batch.turn_format_ok[batch.is_last_turn]).float().mean()),
    }
    if rewards is None:
        return metrics
    has_ig = torch.isfinite(rewards.information_gain)
    for kind in TurnKind:
        values = rewards.information_gain[has_ig & (batch.turn_kind == int(kind))]
        if len(values):
            name = kind.name.lower()
            metrics[f"ig/{name}_mean"] = float(values.mean())
            metrics[f"ig/{name}_std"] = float(values.std(unbiased=False))
            metrics[f"ig/{name}_count"] = float(len(values))
    return metrics
