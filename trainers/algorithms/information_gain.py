"""Probe scores for information gain, fused with the old-log-prob pass.

(docs/design.md, "Information gain in one pass")

For one trajectory (token ids [L]) and K boundaries b_1..b_K, the score of boundary k and
gold answer g is

    s[k, g] = mean_j log softmax(logits / temperature)[a*_g,j]   over the answer span of
              probe g appended (as ids) at b_k: the policy reads trajectory[:b_k] + probe_g.

Two implementations that must agree (tests/test_ig_equality.py, within 1e-4 in fp32):

- `reference_probe_scores` (tests/ig_reference.py): one teacher-forced forward per
  (boundary, answer). Obviously correct, costs ~K * L/2 tokens per answer.
- `fast_probe_scores`: one forward over `[trajectory | probes of b_1 | ... | probes of b_K]`
  with the packed attention of trainers.algorithms.packed_attention; the same forward also returns the
  log-probs of the trajectory's policy tokens (the old-log-prob pass), since the policy and
  the trajectory are the same. Costs ~L + K * G * |probe| tokens.

`score_batch` runs the fast path over a RolloutBatch and fills `boundary_scores` (best
answer per boundary) and `old_logprobs`. With distractor probes (wrong answers, e.g. other
tasks' gold answers) it stores the contrastive score instead:

    c[k] = max_g s[k, gold g] - mean_d s[k, distractor d]

scored in the same packed forward. Any change of the history that moves every answer's
log-prob alike (a turn that only makes "<answer>" more expected) cancels in c, so
differences of c measure evidence for the gold answer rather than for answering.

Deviation from the public code: the score of a boundary with several gold answers is the
best (max) over answers, where the public code used the first answer only.
Only decoders whose logits are exactly `lm_head(final hidden state)` are supported by the
fast path (Llama, Qwen2/3, Mistral, ...); models with logit soft-capping or logit scaling
are rejected with an error rather than scored slightly wrong.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from trainers.algorithms.packed_attention import (
    BLOCKSPARSE,
    FLEX,
    PackedProbeLayout,
    attach_flex_block_mask,
    dense_mask,
    packed_probe_attention,
    plan_chunks,
)
from trainers.algorithms.probes import Probe
from trainers.batch import RolloutBatch
from trainers.modeling.logprobs import hidden_token_logprobs

BACKENDS = ("auto", "dense", "blocksparse", "flex")


@dataclass
class InformationGainConfig:
    """How probe scores are computed (the numbers do not depend on these, only the cost)."""

    temperature: float = field(default=1.0, metadata={
        "help": "rollout sampling temperature; logits are divided by it before log-softmax"})
    backend: str = field(default="auto", metadata={
        "help": "packed attention: auto (dense up to dense_max_tokens, else blocksparse), "
                "dense, blocksparse, or flex (flex_attention, opt-in, meant for GPUs)"})
    dense_max_tokens: int = field(default=512, metadata={
        "help": "auto picks the dense [N, N] mask at or below this packed length"})
    chunk_query_tokens: int = field(default=256, metadata={
        "help": "blocksparse: most probe queries per attention chunk"})
    max_mask_elements: int = field(default=1 << 24, metadata={
        "help": "blocksparse: most mask entries (queries x keys) per chunk; bounds memory"})
    logit_chunk_elements: int = field(default=1 << 26, metadata={
        "help": "most logits (rows x vocab) materialised at once when scoring tokens"})
    compile_flex: bool = field(default=True, metadata={
        "help": "flex backend: torch.compile flex_attention (False runs eagerly, tests only)"})

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")


@dataclass
class ProbeScores:
    """scores: [K, G] float32 per boundary and gold answer; policy_logprobs: [L] float32
    (log-prob of each policy token under the model, 0 elsewhere) or None."""

    scores: torch.Tensor
    policy_logprobs: torch.Tensor | None = None

    @property
    def best(self) -> torch.Tensor:
        """[K] best score over gold answers (see best_answer_scores)."""
        return best_answer_scores(self.scores)


def best_answer_scores(scores: torch.Tensor) -> torch.Tensor:
    """[K, G] -> [K]: the score of the best-supported gold answer at each boundary."""
    return scores.max(dim=-1).values


def check_inputs(input_ids: torch.Tensor, boundaries: torch.Tensor,
                  probes: Sequence[Probe]) -> None:
    if input_ids.ndim != 1:
        raise ValueError(f"input_ids must be one trajectory [L], got shape {list(input_ids.shape)}")
    if boundaries.ndim != 1:
        raise ValueError(f"boundaries must be [K], got shape {list(boundaries.shape)}")
    if not probes:
        raise ValueError("at least one probe (gold answer) is needed")
    if len(boundaries) and (boundaries.min() < 0 or boundaries.max() > input_ids.shape[0]):
        raise ValueError(f"boundaries must lie in [0, {input_ids.shape[0]}], got "
                         f"{boundaries.min().item()}..{boundaries.max().item()}")


def _check_plain_lm_head(model: torch.nn.Module) -> None:
    config = model.config
    for name in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        value = getattr(config, name, None)
        if value not in (None, 1, 1.0):
            raise NotImplementedError(
                f"{type(model).__name__} transforms its logits ({name}={value}); the fast probe "
                "pass applies lm_head directly and would score it wrongly")


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Probe scores and old log-probs are deterministic: no dropout, whatever the caller's mode."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def build_layout(trajectory_length: int, sorted_boundaries: torch.Tensor,
                 probe_lengths: Sequence[int], config: InformationGainConfig,
                 device: torch.device) -> PackedProbeLayout:
    """Packed layout for K sorted boundaries x G probes (probe blocks ordered by boundary)."""
    K, G = len(sorted_boundaries), len(probe_lengths)
    lengths = torch.tensor(list(probe_lengths), dtype=torch.long, device=device)
    block = int(lengths.sum())
    # Offset of each token inside its probe, and the probe (k, g) -> id k * G + g it is in.
    within_probe = torch.cat([torch.arange(n, device=device) for n in probe_lengths])
    probe_of_token = torch.arange(G, device=device).repeat_interleave(lengths)
    probe_ids = (torch.arange(K, device=device)[:, None] * G + probe_of_token[None, :]).reshape(-1)
    boundary_of_token = sorted_boundaries.to(device).repeat_interleave(block)
    trajectory_positions = torch.arange(trajectory_length, device=device)
    layout = PackedProbeLayout(
        trajectory_length=trajectory_length,
        segment=torch.cat([torch.full((trajectory_length,), -1, device=device), probe_ids]),
        visible_prefix=torch.cat([torch.zeros_like(trajectory_positions), boundary_of_token]),
        position_ids=torch.cat([trajectory_positions, boundary_of_token + within_probe.repeat(K)]),
    )
    probe_starts = torch.cumsum(lengths.repeat(K), 0) - lengths.repeat(K)
    layout.chunks = plan_chunks(trajectory_length, probe_starts, probe_starts + lengths.repeat(K),
                                sorted_boundaries.repeat_interleave(G),
                                config.chunk_query_tokens, config.max_mask_elements)
    return layout


def _resolve_backend(config: InformationGainConfig, total_length: int) -> str:
    if config.backend == "auto":
        return "dense" if total_length <= config.dense_max_tokens else "blocksparse"
    return config.backend


@torch.no_grad()
def fast_probe_scores(model: torch.nn.Module, input_ids: torch.Tensor,
                      boundaries: torch.Tensor, probes: Sequence[Probe],
                      config: InformationGainConfig | None = None,
                      policy_mask: torch.Tensor | None = None) -> ProbeScores:
    """[K, G] probe scores (and [L] policy log-probs if policy_mask [L] bool is given)
    from one packed forward. Same numbers as reference_probe_scores.
    """
    config = config or InformationGainConfig()
    check_inputs(input_ids, boundaries, probes)
    _check_plain_lm_head(model)
    if policy_mask is not None and (policy_mask.shape != input_ids.shape
                                    or policy_mask.dtype != torch.bool):
        raise ValueError(f"policy_mask must be bool {list(input_ids.shape)}, got "
                         f"{policy_mask.dtype} {list(policy_mask.shape)}")
    device = input_ids.device
    L, K, G = input_ids.shape[0], len(boundaries), len(probes)
    order = torch.argsort(boundaries, stable=True)
    sorted_boundaries = boundaries[order].to(device)
    # Causal attention: tokens after the last scored row (the answer's final token and the
    # suffix) cannot change the scores, so they are not packed at all.
    packed_probes = [p.ids[:p.answer_end - 1] for p in probes]
    lengths = [len(ids) for ids in packed_probes]
    layout = build_layout(L, sorted_boundaries, lengths, config, device)
    probe_block = torch.tensor([i for ids in packed_probes for i in ids], dtype=torch.long,
                               device=device)
    packed_ids = torch.cat([input_ids, probe_block.repeat(K)])

    backend = _resolve_backend(config, layout.total_length)
    call_kwargs = {}
    if backend == "dense":
        implementation = "sdpa"
        call_kwargs["attention_mask"] = dense_mask(layout)
    elif backend == "blocksparse":
        implementation = BLOCKSPARSE
    else:
        implementation = FLEX
        attach_flex_block_mask(layout, compiled=config.compile_flex)

    decoder = model.get_decoder()
    with eval_mode(model), packed_probe_attention(model, layout, implementation):
        hidden = decoder(input_ids=packed_ids[None], position_ids=layout.position_ids[None],
                         use_cache=False, **call_kwargs).last_hidden_state[0]
    lm_head = model.get_output_embeddings()

    # Answer token j of probe (k, g), packed at offset o, is predicted by row o + start + j - 1.
    lengths_t = torch.tensor(lengths, device=device)
    probe_offsets = (L + torch.arange(K, device=device)[:, None] * int(lengths_t.sum())
                     + (torch.cumsum(lengths_t, 0) - lengths_t)[None, :])  # [K, G]
    starts = torch.tensor([p.answer_start for p in probes], device=device)
    spans = torch.tensor([p.answer_end - p.answer_start for p in probes], device=device)
    answer_probe = torch.arange(G, device=device).repeat_interleave(spans)  # [A] probe g
    answer_token = torch.cat([torch.arange(int(n), device=device) for n in spans])  # [A] j
    predictor_rows = (probe_offsets[:, answer_probe] + starts[answer_probe] - 1
                      + answer_token).reshape(-1)  # [K * A]
    pair_index = (torch.arange(K, device=device)[:, None] * G + answer_probe[None, :]).reshape(-1)
    targets = torch.tensor([i for p in probes for i in p.answer_ids], device=device).repeat(K)
    answer_logprobs, _ = hidden_token_logprobs(hidden[predictor_rows], targets, lm_head,
                                               config.temperature, config.logit_chunk_elements)
    sums = torch.zeros(K * G, device=device).index_add_(0, pair_index, answer_logprobs)
    sorted_scores = (sums.view(K, G) / spans[None, :]).cpu()
    scores = torch.empty_like(sorted_scores)
    scores[order.cpu()] = sorted_scores

    policy_logprobs = None
    if policy_mask is not None:
        policy_logprobs = _policy_logprobs(hidden[:L], input_ids, policy_mask, lm_head, config)
    return ProbeScores(scores=scores, policy_logprobs=policy_logprobs)


def _policy_logprobs(hidden: torch.Tensor, input_ids: torch.Tensor, policy_mask: torch.Tensor,
                     lm_head: torch.nn.Module, config: InformationGainConfig) -> torch.Tensor:
    """[L] log-probs of policy tokens from the trajectory's hidden states [L, hidden]."""
    positions = policy_mask.nonzero().squeeze(-1)
    if len(positions) and positions[0] == 0:
        raise ValueError("a policy token at position 0 has no context to be predicted from")
    result = torch.zeros(input_ids.shape[0], device=input_ids.device)
    result[positions] = hidden_token_logprobs(hidden[positions - 1], input_ids[positions],
                                              lm_head, config.temperature,
                                              config.logit_chunk_elements)[0]
    return result


def boundary_positions(batch: RolloutBatch) -> torch.Tensor:
    """[B, T+1] token index of every probe slot: slot 0 = question_end, slot t+1 = turn_end[t]
    (-1 on padding turns)."""
    return torch.cat([batch.question_end[:, None], batch.turn_end], dim=1)


def score_batch(model: torch.nn.Module, batch: RolloutBatch, probes: Sequence[Sequence[Probe]],
                slots: torch.Tensor, config: InformationGainConfig | None = None,
                distractors: Sequence[Sequence[Probe]] | None = None) -> RolloutBatch:
    """Fill `boundary_scores` [B, T+1] (best answer, NaN where slots is False) and
    `old_logprobs` [B, L] with one packed forward per trajectory.

    probes: per trajectory, its gold-answer probes (rollouts of one group share them).
    slots:  [B, T+1] bool, which boundaries to probe (trainers.algorithms.rewards.probe_slots).
    distractors: per trajectory, wrong-answer probes (at least one each); the boundary score
        becomes best gold score - mean distractor score (module docstring).
    """
    config = config or InformationGainConfig()
    if len(probes) != batch.batch_size:
        raise ValueError(f"need one probe list per trajectory ({batch.batch_size}), got {len(probes)}")
    if distractors is not None:
        if len(distractors) != batch.batch_size:
            raise ValueError(f"need one distractor list per trajectory ({batch.batch_size}), "
                             f"got {len(distractors)}")
        if any(not wrong for wrong in distractors):
            raise ValueError("contrastive probe scores need at least one distractor answer per "
                             "trajectory (other tasks' answers: run >= 2 queries per step)")
    positions = boundary_positions(batch)
    if slots.shape != positions.shape:
        raise ValueError(f"slots must have shape {list(positions.shape)}, got {list(slots.shape)}")
    if (slots & (positions < 0)).any():
        raise ValueError("slots selects a padding turn")
    device = next(model.parameters()).device
    scores = torch.full(positions.shape, float("nan"), device=batch.input_ids.device)
    old_logprobs = torch.zeros(batch.input_ids.shape, device=batch.input_ids.device)
    for row in range(batch.batch_size):
        length = int(batch.lengths[row])
        selected = slots[row].nonzero().squeeze(-1)
        row_probes = list(probes[row]) + (list(distractors[row]) if distractors else [])
        result = fast_probe_scores(model, batch.input_ids[row, :length].to(device),
                                   positions[row, selected].to(device), row_probes, config,
                                   policy_mask=batch.loss_mask[row, :length].to(device))
        gold = len(probes[row])
        best = best_answer_scores(result.scores[:, :gold])
        if distractors:
            best = best - result.scores[:, gold:].mean(dim=-1)
        scores[row, selected] = best.to(scores.device)
        old_logprobs[row, :length] = result.policy_logprobs.to(old_logprobs.device)
    return batch.replace(boundary_scores=scores, old_logprobs=old_logprobs)
