"""The one gradient all-reduce of data-parallel training (SFT workers and RL learners), and
how both join or start Ray (`init_ray`).

Every replica computes the gradient of its share of a global batch, already scaled by that
share, so the replicas' gradients are summed (not averaged): the sum is the gradient of the
whole batch, the same as one replica computes alone.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch
import torch.distributed as dist


def all_reduce_gradients(parameters: Iterable[torch.nn.Parameter]) -> None:
    """Sum the gradients of the trainable `parameters` over the process group, in place.

    One flat all-reduce instead of one per tensor (a small model has hundreds of tensors and
    each collective has a fixed cost). A replica that got no rows this step (its gradients
    are None) still joins, with zeros, so every rank runs the same collective.
    """
    trainable = [p for p in parameters if p.requires_grad]
    for parameter in trainable:
        if parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
    flat = torch.cat([p.grad.reshape(-1) for p in trainable])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for parameter in trainable:
        n = parameter.numel()
        parameter.grad.copy_(flat[offset:offset + n].view_as(parameter.grad))
        offset += n


def init_ray(address: str = "", num_cpus: int | None = None) -> None:
    """Connect to a Ray cluster, or start a local one with `num_cpus`.

    A cluster is joined when `address` is given ("auto", "ray://...", "host:port") or when
    RAY_ADDRESS is set (what `ray job submit` does for the driver it starts). Resources may
    only be declared when starting a local Ray: Ray refuses num_cpus when connecting to an
    existing cluster, whose nodes declared theirs when they started. Without either, a
    local Ray is started even when `ray start` left a cluster on this machine (Ray itself
    would join that one): an empty address means a local Ray.
    """
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address or None, include_dashboard=False)
    else:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False)
