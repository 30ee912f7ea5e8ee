"""The obviously correct information-gain reference the fast scorer is held to.

`reference_probe_scores` runs one teacher-forced forward per (boundary, answer probe);
trainers.algorithms.information_gain.fast_probe_scores scores all of them in one packed
forward and must agree with it (tests/test_ig_equality.py, within 1e-4 in fp32).
benchmarks/ig_speed.py times the two against each other.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trainers.algorithms.information_gain import check_inputs, eval_mode
from trainers.algorithms.probes import Probe
from trainers.modeling.logprobs import token_logprobs


@torch.no_grad()
def reference_probe_scores(model: torch.nn.Module, input_ids: torch.Tensor,
                           boundaries: torch.Tensor, probes: Sequence[Probe],
                           temperature: float = 1.0) -> torch.Tensor:
    """[K, G] probe scores, one plain forward of `input_ids[:b] + probe` per pair.

    input_ids: [L] int64; boundaries: [K] int64 in [0, L]. Uses the model exactly as
    configured (its own attention implementation and head).
    """
    check_inputs(input_ids, boundaries, probes)
    scores = torch.empty(len(boundaries), len(probes))
    for k, boundary in enumerate(boundaries.tolist()):
        for g, probe in enumerate(probes):
            probe_ids = torch.tensor(probe.ids, dtype=torch.long, device=input_ids.device)
            sequence = torch.cat([input_ids[:boundary], probe_ids])[None]
            with eval_mode(model):
                logits = model(sequence, logits_to_keep=len(probe.ids), use_cache=False).logits[0]
            # logits[j] (over probe positions) predicts probe token j + 1.
            logprobs, _ = token_logprobs(logits[probe.answer_start - 1:probe.answer_end - 1],
                                         probe_ids[probe.answer_start:probe.answer_end],
                                         temperature)
            scores[k, g] = logprobs.mean()
    return scores


@torch.no_grad()
def reference_policy_logprobs(model: torch.nn.Module, input_ids: torch.Tensor,
                              policy_mask: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """[L] log-probs of the policy tokens (0 elsewhere) from one plain forward."""
    with eval_mode(model):
        logits = model(input_ids[None], use_cache=False).logits[0]
    result = torch.zeros(input_ids.shape[0], device=input_ids.device)
    result[1:] = token_logprobs(logits[:-1], input_ids[1:], temperature)[0]
    return torch.where(policy_mask, result, torch.zeros_like(result))
