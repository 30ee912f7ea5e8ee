"""Bucketed weight sync (trainers.rl.weight_sync): the plan groups tensors by dtype into
buckets, sends tied weights once, and a state dict broadcast over gloo between two processes
on 127.0.0.1 arrives bit for bit (fp32, bf16, int64, tied embeddings)."""

from __future__ import annotations

import multiprocessing

import pytest
import torch

from trainers.backends import free_address
from trainers.modeling.models import tiny_causal_lm
from trainers.rl.weight_sync import (
    join_sync_group,
    pack,
    plan_buckets,
    receive_buckets,
    send_buckets,
    unpack,
)


def mixed_state() -> dict[str, torch.Tensor]:
    """A real model's weights with the input and output embeddings tied, a bf16 copy of some
    of them and an int64 buffer, in an interleaved order."""
    model = tiny_causal_lm(vocab_size=300, hidden_size=64, num_layers=2, seed=3)
    model.lm_head.weight = model.model.embed_tokens.weight  # tied: one storage, two names
    state = dict(model.state_dict())
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    generator = torch.Generator().manual_seed(0)
    mixed: dict[str, torch.Tensor] = {}
    for i, (name, tensor) in enumerate(state.items()):
        mixed[name] = tensor
        if i % 3 == 0:
            mixed[f"bf16.{name}"] = (tensor + torch.randn(tensor.shape, generator=generator)
                                     ).to(torch.bfloat16)
    mixed["steps"] = torch.arange(7, dtype=torch.int64)
    return mixed


def test_plan_groups_by_dtype_caps_bucket_size_and_sends_tied_weights_once():
    state = mixed_state()
    plan = plan_buckets(state, bucket_bytes=8192)
    assert ("lm_head.weight", "model.embed_tokens.weight") in plan.aliases
    planned = [slot.name for bucket in plan.buckets for slot in bucket.slots]
    assert sorted(planned + [a for a, _ in plan.aliases]) == sorted(state)  # each name once
    for bucket in plan.buckets:
        assert {state[slot.name].dtype for slot in bucket.slots} == {bucket.dtype}
        # Only a tensor larger than a bucket makes a bucket larger than bucket_bytes.
        assert bucket.nbytes <= 8192 or len(bucket.slots) == 1
    assert {bucket.dtype for bucket in plan.buckets} == {torch.float32, torch.bfloat16,
                                                         torch.int64}
    bucket = plan.buckets[0]
    for name, view in unpack(pack(state, bucket), bucket).items():
        assert torch.equal(view, state[name])


def test_bad_bucket_size_is_refused():
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan_buckets({"w": torch.zeros(2)}, bucket_bytes=0)


def _receiver(address: str, plan, path: str) -> None:
    torch.set_num_threads(1)
    group = join_sync_group(address, rank=1, world_size=2, backend="gloo", timeout_s=60)
    torch.save(receive_buckets(group, plan, "cpu"), path)


def test_state_dict_broadcast_over_gloo_arrives_bit_for_bit(tmp_path):
    state = mixed_state()
    plan = plan_buckets(state, bucket_bytes=8192)
    address = free_address()
    path = str(tmp_path / "received.pt")
    context = multiprocessing.get_context("spawn")
    child = context.Process(target=_receiver, args=(address, plan, path))
    child.start()
    try:
        group = join_sync_group(address, rank=0, world_size=2, backend="gloo", timeout_s=60)
        sent = send_buckets(group, state, plan)
    finally:
        child.join(timeout=120)
    assert child.exitcode == 0
    received = torch.load(path)
    assert list(received) == list(state)
    for name, tensor in state.items():
        assert received[name].dtype == tensor.dtype, name
        assert torch.equal(received[name], tensor), name
    # Tied weights travel once and arrive as one tensor under both names.
    assert sent == sum(bucket.nbytes for bucket in plan.buckets)
    assert sent < sum(t.numel() * t.element_size() for t in state.values())
    assert received["lm_head.weight"].data_ptr() == received["model.embed_tokens.weight"
                                                             ].data_ptr()


def test_the_engines_get_tied_weights_once():
    """The learner's CPU copy of its weights (what the object store gets) keeps tied input
    and output embeddings as one tensor, so a push weighs 4 bytes a parameter in fp32, not
    4 more bytes per tied entry; the engine-side load still fills both names."""
    import pickle

    from trainers.modeling.models import build_tiny_causal_lm, cpu_state_copy, tiny_tokenizer
    from trainers.rl.strategy import DataParallel
    from trainers.rl.weight_sync import state_bytes

    model = build_tiny_causal_lm(tiny_tokenizer(300), hidden=32, layers=1)
    assert model.config.tie_word_embeddings
    parameters = sum(p.numel() for p in model.parameters())  # tied: counted once
    weights = DataParallel(1).weights(model)
    assert weights["lm_head.weight"] is weights["model.embed_tokens.weight"]
    assert state_bytes(weights) == 4 * parameters
    naive = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    assert state_bytes(naive) > state_bytes(weights)
    assert len(pickle.dumps(weights)) < len(pickle.dumps(naive))
    copy = build_tiny_causal_lm(tiny_tokenizer(300), hidden=32, layers=1, seed=1)
    copy.load_state_dict(weights)
    assert all(torch.equal(a, b) for a, b in zip(copy.state_dict().values(),
                                                 model.state_dict().values()))
    assert cpu_state_copy({"a": torch.ones(2)})["a"].device.type == "cpu"
