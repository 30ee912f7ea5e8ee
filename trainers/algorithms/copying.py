"""Which policy tokens continue a span the policy copies from its context.

A deep-research turn copies a lot: the question into its reasoning, an entity's name into a
search query, a URL from the search results into a visit, a fact from a page into the
answer. The choice of what to copy is made at the span's first tokens; the rest of the span
follows from the context. `copied_tokens` marks those continuation tokens, so that the RL
loss can weigh them less (`loss.copied_token_weight`): the reward judges the choice, while
the copying itself is a capability that SFT built and that every update's noise can wear
down (docs/algorithms.md "Losses").

A policy token at position i is copied when the n tokens ending at i (i - n + 1 .. i)
occur, in that order, inside the context before it that came from the environment: the
question and the tool replies (the non-policy tokens), less the prefix that every row of
the batch begins with (the system prompt, whose tool-call examples would otherwise mark the
policy's own format tokens as copies). The span's first n - 1 tokens are never marked, so
the decision of which span to copy stays in the loss. With one query a step the question is
part of that shared prefix, and copies from it are not marked.

Token in, token out: everything here works on token ids, never on decoded text.
"""

from __future__ import annotations

import torch

from trainers.batch import RolloutBatch


def shared_prefix_length(input_ids: torch.Tensor, lengths: torch.Tensor) -> int:
    """Length of the token prefix that every row of [B, L] `input_ids` begins with (within
    each row's real tokens)."""
    if input_ids.shape[0] == 0:
        return 0
    limit = int(lengths.min())
    same = (input_ids[:, :limit] == input_ids[:1, :limit]).all(dim=0)
    differs = (~same).nonzero()
    return int(differs[0]) if len(differs) else limit


def copied_tokens(batch: RolloutBatch, ngram: int) -> torch.Tensor:
    """[B, L] bool: policy tokens whose `ngram`-gram ending there occurs in the earlier
    environment tokens of their row, outside the batch's shared prefix (module docstring).

    ngram >= 2 (with 1 every token of a name already in the context would count, the choice
    included).
    """
    if ngram < 2:
        raise ValueError(f"copy n-gram length must be >= 2, got {ngram}")
    ids = batch.input_ids.cpu()
    policy = batch.loss_mask.cpu().bool()
    lengths = batch.lengths.cpu()
    shared = shared_prefix_length(ids, lengths)
    out = torch.zeros(ids.shape, dtype=torch.bool)
    # A set per row, once per step: 0.06-0.2 s for 32 rows of up to 5,000 tokens on a 2-core
    # CPU, about half the time of a torch.unique version that marks the same tokens.
    for row in range(ids.shape[0]):
        tokens = ids[row, :int(lengths[row])].tolist()
        is_policy = policy[row, :len(tokens)].tolist()
        sources: set[tuple[int, ...]] = set()
        env_run = 0  # how many environment tokens end at i (an n-gram source needs n)
        for i in range(len(tokens)):
            if not is_policy[i]:
                env_run = env_run + 1 if i >= shared else 0
                if env_run >= ngram:
                    sources.add(tuple(tokens[i - ngram + 1:i + 1]))
                continue
            env_run = 0
            if i >= ngram - 1 and tuple(tokens[i - ngram + 1:i + 1]) in sources:
                out[row, i] = True
    return out.to(batch.input_ids.device)
