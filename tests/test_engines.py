"""Engines (trainers.engines): the transformers engine's exactness and stop handling, and the
OpenAI-compatible HTTP engine against a deterministic fake server on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import torch

from trainers.engines.base import (
    GenerationRequest,
    find_stop_string,
    text_before_stop_string,
)
from trainers.engines.hf import HFEngine
from trainers.engines.openai_http import EngineReplyError, OpenAIHTTPEngine
from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm

CORPUS = ["the mayor of the city by the river met the painter <tool_response> at noon"] * 30


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_chatml_tokenizer(CORPUS, vocab_size=320)


def _model(tokenizer: Any, seed: int = 0) -> Any:
    # A large init spread makes a random model's greedy output vary from step to step, so
    # comparisons see many different tokens rather than one repeated id.
    return build_tiny_causal_lm(tokenizer, hidden=64, layers=2, seed=seed, initializer_range=0.3)


@pytest.fixture(scope="module")
def engine(tokenizer: Any) -> HFEngine:
    return HFEngine(_model(tokenizer), tokenizer)


def _prompts(tokenizer: Any) -> list[list[int]]:
    return [tokenizer.encode(text) for text in
            ("the mayor", "the city by the river met", "painter at noon the mayor of the city")]


def _reference_logprobs(model: Any, prompt: list[int], generated: list[int],
                        temperature: float = 1.0) -> list[float]:
    """log_softmax(logits / temperature) of each generated id (raw for temperature 0)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + generated])).logits[0].float()
    log_probs = torch.log_softmax(logits / (temperature if temperature > 0 else 1.0), dim=-1)
    return [float(log_probs[len(prompt) - 1 + k, token]) for k, token in enumerate(generated)]


def test_batched_left_padded_generation_equals_single_requests(engine, tokenizer):
    requests = [GenerationRequest(p, max_new_tokens=12, temperature=0) for p in _prompts(tokenizer)]
    batched = engine.generate(requests)
    for request, result in zip(requests, batched):
        single = engine.generate([request])[0]
        assert result.token_ids == single.token_ids
        assert result.logprobs == pytest.approx(single.logprobs, abs=1e-5)
        assert result.finish_reason == "length" and len(result.token_ids) == 12
    assert len({tuple(r.token_ids) for r in batched}) > 1


def test_logprobs_are_the_tempered_model_logprobs_of_the_sampled_ids(engine, tokenizer):
    prompt = _prompts(tokenizer)[1]
    for request in (GenerationRequest(prompt, max_new_tokens=10, temperature=0),
                    GenerationRequest(prompt, max_new_tokens=10, temperature=0.7, top_k=5,
                                      top_p=0.9, seed=3)):
        result = engine.generate([request])[0]
        expected = _reference_logprobs(engine.model, prompt, result.token_ids,
                                       request.temperature)
        assert result.logprobs == pytest.approx(expected, abs=1e-5)


def test_presence_penalty_changes_the_engines_picks_not_the_reported_logprobs(engine,
                                                                             tokenizer):
    """A large presence penalty never lets a greedy turn repeat an id it generated; the
    reported log-probs stay those of the unpenalised distribution at the chosen ids."""
    prompt = _prompts(tokenizer)[2]
    plain, penalised = engine.generate([
        GenerationRequest(prompt, max_new_tokens=14, temperature=0.0),
        GenerationRequest(prompt, max_new_tokens=14, temperature=0.0, presence_penalty=1e4)])
    assert len(set(penalised.token_ids)) == len(penalised.token_ids)
    assert len(set(plain.token_ids)) < len(plain.token_ids)  # the prompt's model repeats
    expected = _reference_logprobs(engine.model, prompt, penalised.token_ids, 0.0)
    assert penalised.logprobs == pytest.approx(expected, abs=1e-5)


def test_sample_token_top_p_drops_a_token_once_the_tokens_before_it_cover_top_p():
    from trainers.engines.sampling import sample_token

    logits = torch.tensor([2.0, 1.0, 1.0]).log()  # probabilities 0.5, 0.25, 0.25

    def drawn(top_p: float) -> set[int]:
        return {sample_token(logits, temperature=1.0, top_p=top_p, seed=0, position=n)[0]
                for n in range(200)}

    assert drawn(0.5) == {0}  # the mass before token 1 is exactly 0.5: dropped
    assert drawn(0.75) == {0, 1}  # token 2 has 0.75 before it: dropped
    assert drawn(0.76) == {0, 1, 2}
    token, logprob = sample_token(logits, temperature=0.0, banned_ids=[0])
    assert token == 1 and logprob == pytest.approx(float(torch.tensor(0.25).log()))


def test_seeded_sampling_is_reproducible_and_seeds_differ(engine, tokenizer):
    prompt = _prompts(tokenizer)[0]

    def sample(seed: int) -> list[int]:
        request = GenerationRequest(prompt, max_new_tokens=16, temperature=1.5, seed=seed)
        return engine.generate([request])[0].token_ids

    assert sample(1) == sample(1)
    assert len({tuple(sample(seed)) for seed in range(4)}) > 1


def test_stop_token_ends_with_the_id_and_banned_ids_are_never_sampled(engine, tokenizer):
    prompt = _prompts(tokenizer)[2]
    free = engine.generate([GenerationRequest(prompt, max_new_tokens=8, temperature=0)])[0]
    stop_id = free.token_ids[3]
    stopped = engine.generate([GenerationRequest(prompt, max_new_tokens=8, temperature=0,
                                                 stop_token_ids=[stop_id])])[0]
    first = free.token_ids.index(stop_id)
    assert stopped.token_ids == free.token_ids[:first + 1]
    assert stopped.finish_reason == "stop"
    banned = engine.generate([GenerationRequest(prompt, max_new_tokens=8, temperature=0,
                                                banned_token_ids=[free.token_ids[0]])])[0]
    assert free.token_ids[0] not in banned.token_ids
    # Raw log-probs: the reported value ignores the ban (same model, same prefix).
    assert banned.logprobs == pytest.approx(
        _reference_logprobs(engine.model, prompt, banned.token_ids), abs=1e-5)


def test_stop_string_cuts_at_the_completing_token_even_mid_token(engine, tokenizer):
    prompt = _prompts(tokenizer)[1]
    free = engine.generate([GenerationRequest(prompt, max_new_tokens=12, temperature=0)])[0]
    pieces = [tokenizer.decode([i]) for i in free.token_ids]
    k = next(k for k, piece in enumerate(pieces) if k >= 2 and len(piece.strip()) >= 2)
    # A stop string made of the end of token k-1 and the start of token k: it ends mid-token.
    stop = pieces[k - 1][-1:] + pieces[k][:1]
    prefix_text = "".join(pieces[:k - 1]) + pieces[k - 1][:-1]
    if stop in prefix_text:
        pytest.skip("the random model's text already contains the stop string earlier")
    result = engine.generate([GenerationRequest(prompt, max_new_tokens=12, temperature=0,
                                                stop_strings=[stop])])[0]
    assert result.finish_reason == "stop_string" and result.stop_string == stop
    assert result.token_ids == free.token_ids[:k + 1]  # the whole completing token is kept
    text = tokenizer.decode(result.token_ids)
    assert text_before_stop_string(text, stop) == prefix_text


def test_find_stop_string_only_looks_at_the_tail(tokenizer):
    ids = tokenizer.encode("the mayor of the city <tool_response> by the river")
    cut = next(k for k in range(1, len(ids) + 1)
               if "<tool_response>" in tokenizer.decode(ids[:k]))
    assert find_stop_string(tokenizer, ids[:cut], ["<tool_response>"]) == "<tool_response>"
    assert find_stop_string(tokenizer, ids[:cut - 1], ["<tool_response>"]) is None
    assert text_before_stop_string("abc<x>d", "<x>") == "abc"
    assert text_before_stop_string("abc", None) == "abc"


def test_update_weights_makes_the_engine_generate_with_the_new_model(tokenizer):
    engine = HFEngine(_model(tokenizer, seed=0), tokenizer)
    new_model = _model(tokenizer, seed=1)
    request = GenerationRequest(_prompts(tokenizer)[0], max_new_tokens=10, temperature=0)
    before = engine.generate([request])[0]
    engine.update_weights(new_model.state_dict())
    after = engine.generate([request])[0]
    expected = HFEngine(new_model, tokenizer).generate([request])[0]
    assert after.token_ids == expected.token_ids
    assert after.logprobs == pytest.approx(expected.logprobs, abs=1e-6)
    assert after.logprobs != before.logprobs
    engine.update_weights(iter(_model(tokenizer, seed=0).state_dict().items()))  # pairs work too
    assert engine.generate([request])[0].token_ids == before.token_ids
    with pytest.raises(KeyError):
        engine.update_weights({"no.such.weight": torch.zeros(1)})


def test_requests_are_validated(engine):
    with pytest.raises(ValueError):
        engine.generate([GenerationRequest([], max_new_tokens=4)])
    with pytest.raises(ValueError):
        engine.generate([GenerationRequest([5], max_new_tokens=0)])
    with pytest.raises(ValueError):
        engine.generate([GenerationRequest([5], top_p=0.0)])
    assert engine.generate([]) == []


# --- OpenAI-compatible HTTP engine against a fake server --------------------------------
FAKE_VOCAB = 500
FAKE_LOGPROB = -0.25


def fake_continuation(prompt: list[int], max_tokens: int, stop_ids: list[int]) -> list[int]:
    """The fake model: counts up from the last prompt id, stops on a stop id."""
    out: list[int] = []
    token = prompt[-1]
    while len(out) < max_tokens:
        token = (token + 1) % FAKE_VOCAB
        out.append(token)
        if token in stop_ids:
            break
    return out


class _FakeCompletions(BaseHTTPRequestHandler):
    text_only = False
    bodies: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        if self.path != "/v1/completions":
            self.send_error(404)
            return
        stop_ids = body.get("stop_token_ids") or []
        ids = fake_continuation(body["prompt"], body["max_tokens"], stop_ids)
        stopped = bool(ids) and ids[-1] in stop_ids
        choice: dict[str, Any] = {
            "index": 0, "text": " ".join(f"t{i}" for i in ids),
            "finish_reason": "stop" if stopped else "length",
            "stop_reason": ids[-1] if stopped else None,
            "logprobs": {"token_logprobs": [FAKE_LOGPROB] * len(ids),
                         "tokens": [f"token_id:{i}" for i in ids]},
        }
        if type(self).text_only:
            choice["logprobs"] = None
        payload = json.dumps({"id": "cmpl-1", "object": "text_completion",
                              "choices": [choice]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def fake_server() -> Iterator[str]:
    _FakeCompletions.text_only = False
    _FakeCompletions.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeCompletions)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_http_engine_sends_token_ids_and_reads_ids_and_logprobs(fake_server):
    engine = OpenAIHTTPEngine(fake_server, model="fake", timeout_s=10)
    requests = [GenerationRequest([7, 8], max_new_tokens=5, temperature=0, stop_token_ids=[11],
                                  banned_token_ids=[1, 2], seed=4, top_k=20),
                GenerationRequest([100], max_new_tokens=3, temperature=0)]
    first, second = engine.generate(requests)
    assert first.token_ids == [9, 10, 11] and first.finish_reason == "stop"
    assert first.logprobs == [FAKE_LOGPROB] * 3
    assert second.token_ids == [101, 102, 103] and second.finish_reason == "length"
    body = next(b for b in _FakeCompletions.bodies if b["prompt"] == [7, 8])
    assert body["logit_bias"] == {"1": -100, "2": -100} and body["seed"] == 4
    assert body["logprobs"] == 1 and body["top_k"] == 20 and body["stop_token_ids"] == [11]
    with pytest.raises(NotImplementedError):
        engine.update_weights({})
    engine.close()


def test_http_engine_refuses_text_only_replies_unless_asked_to_retokenise(fake_server, tokenizer):
    _FakeCompletions.text_only = True
    request = GenerationRequest([7], max_new_tokens=2, temperature=0)
    with pytest.raises(EngineReplyError, match="without token ids"):
        OpenAIHTTPEngine(fake_server, model="fake").generate([request])
    result = OpenAIHTTPEngine(fake_server, model="fake",
                              retokenize_text_with=tokenizer).generate([request])[0]
    assert tokenizer.decode(result.token_ids) == "t8 t9"
    assert result.logprobs == [0.0] * len(result.token_ids)


def test_http_engine_reports_unreachable_servers():
    engine = OpenAIHTTPEngine("http://127.0.0.1:9/v1", model="x", timeout_s=2)
    with pytest.raises(EngineReplyError, match="unreachable|did not answer"):
        engine.generate([GenerationRequest([1], max_new_tokens=2)])
