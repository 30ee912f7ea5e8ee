"""The payload of weight updates into a multi-process vLLM engine
(trainers/engines/vllm_weights.py), without vLLM: every dtype round-trips bit for bit, tied
tensors stay one storage, the receiver hands the worker's reload every tensor, and an
extension class that would drop the receiver is refused. The engine itself is tested in
tests/vllm/test_vllm_multiprocess.py (`make test-vllm`)."""

from __future__ import annotations

import pytest
import torch

from trainers.engines.vllm_weights import (
    WeightReceiver,
    check_worker_extension,
    pack_weights,
    unpack_weights,
)


def test_every_dtype_and_tied_tensors_round_trip_bit_for_bit():
    embed = torch.randn(5, 3)
    state = {"embed": embed, "lm_head": embed, "bf16": torch.randn(4).to(torch.bfloat16),
             "ids": torch.arange(6, dtype=torch.int64).view(2, 3)[:, 1:]}  # non-contiguous
    back = unpack_weights(pack_weights(state.items()))
    assert back.keys() == state.keys()
    for name, tensor in state.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor)
    assert back["embed"].untyped_storage().data_ptr() == \
        back["lm_head"].untyped_storage().data_ptr()
    tied = len(pack_weights({"embed": embed, "lm_head": embed}.items()))
    assert tied < len(pack_weights({"embed": embed, "lm_head": embed.clone()}.items()))


class FakeWorker(WeightReceiver):
    """Stands for the vLLM worker the extension is mixed into."""

    def __init__(self):
        self.loaded: list[tuple[str, torch.Tensor]] = []

    def reload_weights(self, weights_iterator):
        self.loaded = list(weights_iterator)


def test_the_receiver_hands_the_workers_reload_every_tensor():
    worker = FakeWorker()
    state = {"a": torch.ones(2), "b": torch.zeros(3, dtype=torch.float16)}
    assert worker.load_packed_weights(pack_weights(state.items())) == 2
    assert [name for name, _ in worker.loaded] == ["a", "b"]
    assert all(torch.equal(tensor, state[name]) for name, tensor in worker.loaded)


def test_an_extension_that_drops_the_receiver_is_refused():
    check_worker_extension("trainers.engines.vllm_weights.WeightReceiver")
    check_worker_extension(f"{__name__}.FakeWorker")  # a subclass keeps the receiver
    for name in ("collections.OrderedDict", "trainers.engines.vllm_weights.missing", "Bare"):
        with pytest.raises(ValueError, match="must name a subclass of"):
            check_worker_extension(name)
