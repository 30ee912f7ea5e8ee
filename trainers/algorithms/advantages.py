"""Advantages as pure tensor functions (design.md "RL", order: normalise -> scale ->
discount -> broadcast).

Conventions shared by every function here:
- z-score within a group: z = (x - mean) / (std + 1e-6), with std = sqrt(population
  variance + 1e-8), and std = 1 when the group's set has <= 1 element (so a lone value
  becomes 0 and no division blows up).
- Groups are the G rollouts of one query (`group_ids`); "the set" is whatever is pooled for
  that group: G outcomes, or all turn rewards of the G trajectories.

IGPO modes:
    scaled_separate (default)  o~ = z(outcomes per group); r~ = z(turn rewards per group);
                               r~ <- s * r~ with the IG-Scale
                               s = min(10, max(0.3, mean|o~|) / (mean|r~| + 1e-6)),
                               both means over the whole batch (s = 1 if the batch has no
                               turn rewards).
    separate                   the same without the IG-Scale.
    joint                      one z-score per group over outcomes and turn rewards pooled.
Then the discounted return over the reward-bearing turns b_1 < ... < b_K of a trajectory
(INFO_GAIN, PENALTY and, last, the OUTCOME turn b_K): A_K = o~, A_k = r~_k + gamma * A_{k+1}.
A carrier turn (a search turn under browse-aware assignment) takes the A of the next
INFO_GAIN or OUTCOME turn, i.e. of the browse turn whose segment it belongs to; it consumes
no discount step. Each turn's A is broadcast to that turn's policy tokens only, never to
tool or prompt tokens.

Format isolation (`format_isolated`, IGPO's default): a PENALTY turn's advantage is its own
normalised penalty only, A_k = min(r~_k, 0), and the discount chain skips PENALTY turns
(A_k of an earlier turn = r~_k + gamma * A of the next INFO_GAIN / OUTCOME turn). A
malformed OUTCOME turn keeps its o~ (the trajectory's outcome), clamped at 0 from above.
So a malformed turn never gets a positive advantage, and a penalty never lands on the
valid turns before it.

Deviations
* Normalisation happens before discounting (one public release discounted raw rewards and
  normalised afterwards, mixing scales).
* Format isolation. The paper's return A_k = r~_k + gamma * A_{k+1} runs through every
  reward-bearing turn, so a malformed turn followed by a good answer gets a positive
  advantage (its sampled tokens are reinforced) and a valid search followed by malformed
  turns collects their penalties. On the demo's tiny policy 20% of malformed-turn tokens got
  a positive advantage and a valid search followed by 7 malformed turns got A = -2.29.
  Penalties still join the group's turn-reward pool (a valid turn is rated against the
  group's malformed ones); the clamp matters only where a penalty's z-score comes out
  positive (IGs below -format_penalty). `format_isolated: false` restores the paper's chain.
"""

from __future__ import annotations

import torch

from trainers.algorithms.rewards import TurnRewards, TurnRole

STD_EPS = 1e-6  # added to std in the z-score denominator
VAR_EPS = 1e-8  # added to the population variance before the square root
NORMALIZATION_MODES = ("scaled_separate", "separate", "joint")


def group_zscore(values: torch.Tensor, group_ids: torch.Tensor,
                 valid: torch.Tensor | None = None) -> torch.Tensor:
    """z-score of `values` within each group, over the entries where `valid` is True.

    values: [N] float; group_ids: [N] int64 (any ids); valid: [N] bool (default all).
    Returns [N] float32, 0 where not valid.
    """
    values = values.float()
    valid = torch.ones_like(values, dtype=torch.bool) if valid is None else valid
    _, group = torch.unique(group_ids, return_inverse=True)
    n_groups = int(group.max()) + 1 if group.numel() else 0
    weight = valid.float()
    safe_values = torch.where(valid, values, torch.zeros_like(values))
    count = torch.zeros(n_groups, device=values.device).index_add_(0, group, weight)
    total = torch.zeros(n_groups, device=values.device).index_add_(0, group, safe_values)
    mean = total / count.clamp(min=1)
    centered = torch.where(valid, values - mean[group], torch.zeros_like(values))
    variance = torch.zeros(n_groups, device=values.device).index_add_(0, group, centered**2)
    variance = variance / count.clamp(min=1)
    std = torch.where(count <= 1, torch.ones_like(variance), torch.sqrt(variance + VAR_EPS))
    return torch.where(valid, centered / (std[group] + STD_EPS), torch.zeros_like(values))


def ig_scale(outcome_z: torch.Tensor, turn_z: torch.Tensor, turn_valid: torch.Tensor,
             lower: float = 0.3, upper: float = 10.0) -> torch.Tensor:
    """IG-Scale s = min(upper, max(lower, mean|o~|) / (mean|r~| + 1e-6)) as a 0-d tensor.

    outcome_z: [B]; turn_z: [B, T]; turn_valid: [B, T] bool (the turn rewards). Returns 1
    when there is no turn reward in the batch (nothing to scale).
    """
    if not turn_valid.any():
        return torch.tensor(1.0, device=outcome_z.device)
    outcome_magnitude = outcome_z.abs().mean().clamp(min=lower)
    turn_magnitude = turn_z[turn_valid].abs().mean()
    return torch.clamp(outcome_magnitude / (turn_magnitude + STD_EPS), max=upper)


def discounted_turn_advantages(turn_values: torch.Tensor, role: torch.Tensor,
                               gamma: float, isolate_penalties: bool = False) -> torch.Tensor:
    """Backward discounted return over reward-bearing turns.

    turn_values: [B, T] float, normalised turn reward r~ at INFO_GAIN / PENALTY turns and o~
    at the OUTCOME turn; role: [B, T] int64 TurnRole codes (-1 padding). Returns [B, T]
    float32: A = o~ at the outcome turn, A = r~ + gamma * A_next at INFO_GAIN / PENALTY
    turns (A_next: the next reward-bearing turn's A), at carrier turns the A of the next
    INFO_GAIN or OUTCOME turn, 0 on padding.
    isolate_penalties: a PENALTY turn's A is its own value (no discounted future) and the
    chain skips it (the turns before it discount from the next INFO_GAIN / OUTCOME turn).
    """
    B, T = turn_values.shape
    advantages = torch.zeros(B, T, device=turn_values.device)
    # A of the next reward-bearing turn (the discount chain) and of the next INFO_GAIN /
    # OUTCOME turn (what carriers take), filled in as the scan moves backwards.
    next_reward_turn = torch.zeros(B, device=turn_values.device)
    next_segment_end = torch.zeros(B, device=turn_values.device)
    for t in range(T - 1, -1, -1):  # loop over turn positions, vectorised over the batch
        value, kind = turn_values[:, t].float(), role[:, t]
        current = torch.where(kind == TurnRole.OUTCOME, value, value + gamma * next_reward_turn)
        current = torch.where(kind == TurnRole.CARRIER, next_segment_end, current)
        if isolate_penalties:
            current = torch.where(kind == TurnRole.PENALTY, value, current)
        current = torch.where(kind >= 0, current, torch.zeros_like(current))
        advantages[:, t] = current
        bears_reward = (kind == TurnRole.OUTCOME) | (kind == TurnRole.INFO_GAIN)
        if not isolate_penalties:
            bears_reward |= kind == TurnRole.PENALTY
        next_reward_turn = torch.where(bears_reward, current, next_reward_turn)
        ends_segment = (kind == TurnRole.OUTCOME) | (kind == TurnRole.INFO_GAIN)
        next_segment_end = torch.where(ends_segment, current, next_segment_end)
    return advantages


def igpo_turn_advantages(rewards: TurnRewards, group_ids: torch.Tensor,
                         mode: str = "scaled_separate", gamma: float = 0.95,
                         scale_bounds: tuple[float, float] = (0.3, 10.0),
                         format_isolated: bool = False, malformed: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, dict[str, float]]:
    """Turn-level IGPO advantages [B, T] and diagnostics.

    rewards: TurnRewards ([B, T] reward and role); group_ids: [B] int64.
    format_isolated: PENALTY turns keep their own normalised penalty and leave the discount
        chain; every malformed turn's A is clamped at 0 from above (module docstring).
    malformed: [B, T] bool, the malformed turns (a malformed final turn is an OUTCOME turn,
        so the roles alone do not show it); default: the PENALTY turns.
    Metrics: `turn_reward_z_abs_mean` is mean|r~| before IG-Scale, `ig_scale` the scale,
    `turn_reward_scaled_abs_mean` mean|r~| after it; with malformed turns,
    `malformed_positive_fraction` is the share of them whose A is > 0.
    """
    if mode not in NORMALIZATION_MODES:
        raise ValueError(f"mode must be one of {NORMALIZATION_MODES}, got {mode!r}")
    role, reward = rewards.role, rewards.reward.float()
    B, T = reward.shape
    is_outcome = role == TurnRole.OUTCOME
    is_turn_reward = (role == TurnRole.INFO_GAIN) | (role == TurnRole.PENALTY)
    outcome = (reward * is_outcome).sum(1)  # exactly one outcome turn per row
    turn_groups = group_ids[:, None].expand(B, T)
    metrics: dict[str, float] = {}
    if mode == "joint":
        values = torch.cat([outcome, reward.reshape(-1)])
        groups = torch.cat([group_ids, turn_groups.reshape(-1)])
        valid = torch.cat([torch.ones(B, dtype=torch.bool, device=reward.device),
                           is_turn_reward.reshape(-1)])
        z = group_zscore(values, groups, valid)
        outcome_z, turn_z = z[:B], z[B:].view(B, T)
    else:
        outcome_z = group_zscore(outcome, group_ids)
        turn_z = group_zscore(reward.reshape(-1), turn_groups.reshape(-1),
                              is_turn_reward.reshape(-1)).view(B, T)
    if is_turn_reward.any():  # before IG-Scale: after it, it would equal outcome_z_abs_mean
        metrics["turn_reward_z_abs_mean"] = float(turn_z[is_turn_reward].abs().mean())
    if mode == "scaled_separate":
        scale = ig_scale(outcome_z, turn_z, is_turn_reward, *scale_bounds)
        turn_z = turn_z * scale
        metrics["ig_scale"] = float(scale)
        if is_turn_reward.any():
            metrics["turn_reward_scaled_abs_mean"] = float(turn_z[is_turn_reward].abs().mean())
    values = torch.where(is_outcome, outcome_z[:, None].expand(B, T), turn_z)
    advantages = discounted_turn_advantages(values, role, gamma, isolate_penalties=format_isolated)
    if malformed is None:
        malformed = role == TurnRole.PENALTY
    malformed = malformed & (role >= 0)
    if format_isolated:
        advantages = torch.where(malformed, advantages.clamp(max=0.0), advantages)
    metrics["outcome_z_abs_mean"] = float(outcome_z.abs().mean())
    if malformed.any():
        metrics["malformed_positive_fraction"] = float((advantages[malformed] > 0).float().mean())
    return advantages, metrics


def broadcast_turn_advantages(turn_advantages: torch.Tensor, turn_index: torch.Tensor,
                              loss_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] turn advantages -> [B, L] token advantages (0 off the policy tokens).

    turn_index: [B, L] int64 (turn of each policy token, -1 elsewhere); loss_mask: [B, L].
    """
    gathered = turn_advantages.gather(1, turn_index.clamp(min=0))
    return torch.where(loss_mask, gathered, torch.zeros_like(gathered))


def broadcast_sequence_advantages(advantages: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """[B] per-trajectory advantages -> [B, L] on the policy tokens, 0 elsewhere."""
    expanded = advantages.float()[:, None].expand(loss_mask.shape)
    return torch.where(loss_mask, expanded, torch.zeros_like(expanded))


def grpo_advantages(outcome: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """GRPO: [B] outcome z-scored within its group (same std convention as above)."""
    return group_zscore(outcome, group_ids)


def rloo_advantages(outcome: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """RLOO: [B] outcome minus the mean outcome of the other rollouts of its group.

    Equals G / (G - 1) * (o - mean_group); 0 for a group of one (no baseline exists).
    """
    outcome = outcome.float()
    _, group = torch.unique(group_ids, return_inverse=True)
    n_groups = int(group.max()) + 1
    count = torch.zeros(n_groups, device=outcome.device).index_add_(0, group, torch.ones_like(outcome))
    total = torch.zeros(n_groups, device=outcome.device).index_add_(0, group, outcome)
    others = (count[group] - 1).clamp(min=1)
    leave_one_out_mean = (total[group] - outcome) / others
    return torch.where(count[group] > 1, outcome - leave_one_out_mean, torch.zeros_like(outcome))


def shared_context_baseline(advantages: torch.Tensor, input_ids: torch.Tensor,
                            lengths: torch.Tensor, loss_mask: torch.Tensor,
                            group_ids: torch.Tensor, malformed: torch.Tensor | None = None
                            ) -> tuple[torch.Tensor, dict[str, float]]:
    """Token advantages less a leave-one-out baseline over the rows that share the token's
    context.

    advantages: [B, L] float (0 off the policy tokens); input_ids: [B, L] int64;
    lengths: [B] real tokens per row; loss_mask: [B, L] bool (the policy tokens);
    group_ids: [B] int64; malformed: [B, L] bool, the tokens of malformed turns (or None).
    Returns [B, L] float32 and diagnostics.

    A malformed turn can begin like a valid turn of another row; there the baseline never
    raises its tokens above max(0, their own advantage), so IGPO's format isolation (a
    malformed turn's advantage is never positive) still holds (without this, seed 0 of the
    learning check collapsed a token at a step with 67% malformed turns).

    Within a group, policy token p of row i has the context input_ids[i, :p]. The rows j of
    its group whose first p tokens are the same, and for which p is a policy token too,
    were in the same state when they chose token p; with them,
    A'[i, p] = A[i, p] - mean_j A[j, p] (the others only: the baseline does not depend on
    row i's own choice, so the policy gradient stays unbiased). Where no other row shares
    the context, A' = A. Over the rows sharing a context, A' sums to zero: a context where
    the group made no choice (identical prefixes; at a low temperature often a whole first
    turn, or whole identical trajectories) gets no net push, whatever the algorithm's
    per-turn returns gave it, and the credit lands where the rows parted. Zero-sum
    sequence-level advantages (GRPO, RLOO) are only rescaled at the contexts every row
    shares (by G / (G - 1), RLOO's leave-one-out).

    Metrics: `shared_context_token_fraction`, the share of policy tokens whose context
    another row shares; `shared_context_mean_advantage_abs`, the mean over those tokens of
    |mean advantage of the rows sharing the context, the row included| before the baseline
    (0 when the algorithm's advantages already cancel there).
    """
    out = advantages.float().clone()
    mask = loss_mask.bool()
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)
    shared_tokens, bias_sum = 0, 0.0
    for group in torch.unique(group_ids):
        rows = (group_ids == group).nonzero().flatten()
        if len(rows) < 2:
            continue
        ids, row_mask, values = input_ids[rows], mask[rows], out[rows]
        n = lengths[rows].to(positions.device)
        # common[i, j]: how many leading tokens rows i and j share (within both real lengths)
        within = positions[None, None, :] < torch.minimum(n[:, None], n[None, :])[:, :, None]
        differs = ~((ids[:, None, :] == ids[None, :, :]) & within)
        common = torch.where(differs.any(-1), differs.int().argmax(-1),
                             torch.full_like(n[:, None].expand(-1, len(rows)), ids.shape[1]))
        # shares[i, j, p]: row j chose its token p in row i's state (same first p tokens)
        shares = (positions[None, None, :] <= common[:, :, None]) & row_mask[None, :, :]
        others = shares & ~torch.eye(len(rows), dtype=torch.bool,
                                     device=shares.device)[:, :, None]
        count = others.sum(1)                                         # [G, L]
        total = (others * values[None, :, :]).sum(1)
        has_others = row_mask & (count > 0)
        out[rows] = torch.where(has_others, values - total / count.clamp(min=1), values)
        shared_tokens += int(has_others.sum())
        bias_sum += float(((total + values) / (count + 1)).abs()[has_others].sum())
    if malformed is not None:
        out = torch.where(malformed, torch.minimum(out, advantages.float().clamp(min=0.0)), out)
    policy_tokens = int(mask.sum())
    metrics = {"shared_context_token_fraction": shared_tokens / max(1, policy_tokens),
               "shared_context_mean_advantage_abs": bias_sum / max(1, shared_tokens)}
    return torch.where(mask, out, torch.zeros_like(out)), metrics
