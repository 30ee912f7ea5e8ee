"""JSON over HTTP for remote backends (retrieval servers, OpenAI-compatible endpoints).

Standard library only (urllib), so the environment needs no HTTP client package. A
request's `timeout_s` is a deadline for all of it (`venus_gym.tools.deadline`). Every
failure — HTTP error status, timeout, unreachable host, a reply that is not JSON or not a
chat completion — becomes a `ToolBackendError` whose message names the service (`what`),
its url and the cause; callers turn it into an observation or a clear error.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from .base import ToolBackendError
from .deadline import Deadline, open_url, read_error_body


class HTTPStatusError(ToolBackendError):
    """A service answered with an HTTP error status (`status`); 429 and 5xx are worth a
    retry (`venus_gym.tools.web_search.JsonClient` retries them)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def post_json(url: str, payload: Any, *, timeout_s: float, what: str,
              headers: Mapping[str, str] | None = None) -> Any:
    """POST `payload` as JSON to `url` and return the decoded JSON reply.

    `timeout_s` is a deadline for the whole request, reply body included
    (`venus_gym.tools.deadline`): a server that trickles its answer cannot stretch it.
    """
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    request = urllib.request.Request(url, data=json.dumps(payload).encode("utf-8"),
                                     headers=all_headers, method="POST")
    try:
        with open_url(request, Deadline(timeout_s)) as response:
            raw = response.read()
    except urllib.error.HTTPError as e:
        detail = read_error_body(e, 300)
        raise HTTPStatusError(f"{what} {url} answered HTTP {e.code}: {detail}", e.code) from None
    except TimeoutError as e:  # socket.timeout is TimeoutError since Python 3.10
        raise ToolBackendError(f"{what} {url} did not answer within {timeout_s} s") from e
    except urllib.error.URLError as e:
        if isinstance(e.reason, TimeoutError):
            raise ToolBackendError(f"{what} {url} did not answer within {timeout_s} s") from e
        raise ToolBackendError(f"{what} {url} unreachable: {e.reason}") from e
    try:
        return json.loads(raw)
    except ValueError:
        raise ToolBackendError(f"{what} {url} sent invalid JSON: {raw[:200]!r}") from None


def chat_completion(base_url: str, model: str, messages: list[dict[str, str]], *,
                    timeout_s: float, what: str, api_key: str | None = None,
                    extra_body: Mapping[str, Any] | None = None) -> str:
    """The assistant text of one `/chat/completions` call on an OpenAI-compatible server.

    `base_url` is the API root, e.g. "http://127.0.0.1:8000/v1".
    """
    return chat_completion_with_usage(base_url, model, messages, timeout_s=timeout_s,
                                      what=what, api_key=api_key, extra_body=extra_body)[0]


def chat_completion_with_usage(base_url: str, model: str, messages: list[dict[str, str]], *,
                               timeout_s: float, what: str, api_key: str | None = None,
                               extra_body: Mapping[str, Any] | None = None
                               ) -> tuple[str, dict[str, int]]:
    """`chat_completion`, plus the reply's token usage {"prompt_tokens",
    "completion_tokens"} (zeros where the server reports none)."""
    url = base_url.rstrip("/") + "/chat/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    reply = post_json(url, {"model": model, "messages": messages, **(extra_body or {})},
                      timeout_s=timeout_s, what=what, headers=headers)
    try:
        content = reply["choices"][0]["message"]["content"]
        if not isinstance(content, str):
            raise TypeError("message content is not a string")
    except (KeyError, IndexError, TypeError) as e:
        raise ToolBackendError(f"{what} {url} sent no chat completion ({e}): "
                               f"{str(reply)[:200]}") from None
    usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else {}
    counts = {k: v if isinstance(v := usage.get(k), int) and not isinstance(v, bool) else 0
              for k in ("prompt_tokens", "completion_tokens")}
    return content, counts
