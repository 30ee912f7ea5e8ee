"""An engine over any OpenAI-compatible `/v1/completions` server, token in / token out.

`OpenAIHTTPEngine("http://127.0.0.1:8000/v1", model="policy")` sends each request's prompt
as a list of token ids (vLLM and SGLang accept `prompt: [int, ...]`) with `logprobs: 1`, and
reads back the generated ids and their log-probs. Requests of one `generate` call go out
concurrently (one HTTP request each, since sampling options differ per request); the server
batches them.

Where the ids come from, in order of preference:
1. `choices[i].token_ids` (vLLM with `return_token_ids: true`);
2. `choices[i].logprobs.tokens` spelled "token_id:<id>" (vLLM's
   `return_tokens_as_token_ids: true`, sent with every request);
3. only with `retokenize_text_with=tokenizer`: the returned text encoded again. This is the
   caveat for servers that return only text: the encoding may differ from the ids the model
   sampled (BPE boundary drift, design.md "Pitfalls"), so such trajectories are not
   exactly token in / token out; log-probs are then unavailable for the re-encoded ids and
   come back as 0.0. Off by default: an id-less reply raises `EngineReplyError`.

Log-probs are whatever the server reports for the sampled token. The engine contract is
log_softmax(logits / temperature) with banned ids counted in the normaliser: a vLLM
server's default, raw_logprobs, is exactly that at temperature 1 and for greedy requests;
for another temperature start it with `--logprobs-mode processed_logprobs`, which applies
the temperature but leaves the banned ids (logit_bias) out of the normaliser
(trainers.engines.vllm_engine).
Banned ids go out as `logit_bias` -100 (the OpenAI API's floor). The end-of-turn stop id
is kept in the returned ids when the server drops it from a reply that ended with "stop"
on it (`stop_reason` names the id), so the trajectory still ends the turn with it (log-prob
0.0 is then recorded for it; vLLM includes it itself).

No weight updates: a served model is evaluated as it is (update_weights raises).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from venus_gym.tools.base import ToolBackendError
from venus_gym.tools.http import post_json

from .base import Engine, GenerationRequest, GenerationResult

TOKEN_ID_PREFIX = "token_id:"


class EngineReplyError(RuntimeError):
    """The server's reply has no usable token ids or is not a completion."""


class OpenAIHTTPEngine(Engine):
    """Generation through an OpenAI-compatible completions endpoint.

    Args:
        base_url: the API root, e.g. "http://127.0.0.1:8000/v1".
        model: the served model's name.
        api_key: sent as a bearer token when given.
        timeout_s: deadline of one HTTP request, the whole reply included.
        max_concurrency: requests in flight at once.
        retokenize_text_with: a tokenizer to encode text-only replies (see module doc).
        presence_penalty: sent with every request when nonzero (the OpenAI API's option;
            DR-Venus's inference uses it against loops). Set on the engine rather than per
            request because only served models take it (GenerationRequest has no field the
            transformers engine would have to honour).
    """

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None,
                 timeout_s: float = 600.0, max_concurrency: int = 64,
                 retokenize_text_with: Any = None, presence_penalty: float = 0.0):
        self.url = base_url.rstrip("/") + "/completions"
        self.model = model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self.timeout_s = timeout_s
        self.retokenizer = retokenize_text_with
        self.presence_penalty = presence_penalty
        self._pool = ThreadPoolExecutor(max_concurrency)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        for request in requests:
            request.validate()
        return list(self._pool.map(self._complete, requests))

    def close(self) -> None:
        self._pool.shutdown(wait=False)

    def payload(self, request: GenerationRequest) -> dict[str, Any]:
        """The JSON body for one request (vLLM's extensions are ignored by other servers)."""
        body: dict[str, Any] = {
            "model": self.model, "prompt": list(request.prompt_ids),
            "max_tokens": request.max_new_tokens, "temperature": request.temperature,
            "top_p": request.top_p, "logprobs": 1, "echo": False,
            "return_tokens_as_token_ids": True, "return_token_ids": True,
            "skip_special_tokens": False, "include_stop_str_in_output": True,
        }
        if request.top_k > 0:
            body["top_k"] = request.top_k
        if request.stop_strings:
            body["stop"] = list(request.stop_strings)
        if request.stop_token_ids:
            body["stop_token_ids"] = list(request.stop_token_ids)
        if request.banned_token_ids:
            body["logit_bias"] = {str(i): -100 for i in request.banned_token_ids}
        if request.seed is not None:
            body["seed"] = request.seed
        presence_penalty = request.presence_penalty or self.presence_penalty
        if presence_penalty:
            body["presence_penalty"] = presence_penalty
        return body

    def _complete(self, request: GenerationRequest) -> GenerationResult:
        try:
            reply = post_json(self.url, self.payload(request), timeout_s=self.timeout_s,
                              what="completions server", headers=self.headers)
            choice = reply["choices"][0]
        except ToolBackendError as e:
            raise EngineReplyError(str(e)) from None
        except (KeyError, IndexError, TypeError):
            raise EngineReplyError(f"{self.url} sent no completion: {str(reply)[:200]}") from None
        token_ids, logprobs = self._ids_and_logprobs(choice)
        reason = choice.get("finish_reason") or "length"
        stop_reason = choice.get("stop_reason")
        stop_string = stop_reason if isinstance(stop_reason, str) else None
        if (reason == "stop" and isinstance(stop_reason, int)
                and stop_reason in request.stop_token_ids and token_ids[-1:] != [stop_reason]):
            token_ids, logprobs = [*token_ids, stop_reason], [*logprobs, 0.0]
        if stop_string is None and reason == "stop" and token_ids[-1:] and (
                token_ids[-1] not in request.stop_token_ids) and request.stop_strings:
            stop_string = self._stop_string_in(choice.get("text", ""), request.stop_strings)
        finish = "stop_string" if stop_string is not None else (
            "stop" if reason == "stop" else "length")
        return GenerationResult(token_ids, logprobs, finish, stop_string)  # type: ignore[arg-type]

    def _ids_and_logprobs(self, choice: dict[str, Any]) -> tuple[list[int], list[float]]:
        logprob_block = choice.get("logprobs") or {}
        reported = [0.0 if x is None else min(0.0, float(x))
                    for x in logprob_block.get("token_logprobs") or []]
        ids = choice.get("token_ids")
        if ids is None:
            tokens = logprob_block.get("tokens") or []
            if tokens and all(isinstance(t, str) and t.startswith(TOKEN_ID_PREFIX)
                              for t in tokens):
                ids = [int(t[len(TOKEN_ID_PREFIX):]) for t in tokens]
        if ids is not None:
            ids = [int(i) for i in ids]
            if len(reported) != len(ids):
                raise EngineReplyError(f"{len(reported)} log-probs for {len(ids)} token ids")
            return ids, reported
        if self.retokenizer is None:
            raise EngineReplyError(
                "the server returned text without token ids; pass retokenize_text_with="
                "tokenizer to accept re-encoded ids (not exact token in / token out)")
        ids = self.retokenizer.encode(choice.get("text", ""), add_special_tokens=False)
        return [int(i) for i in ids], [0.0] * len(ids)

    @staticmethod
    def _stop_string_in(text: str, stop_strings: Sequence[str]) -> str | None:
        for stop in stop_strings:
            if stop in text:
                return stop
        return None
