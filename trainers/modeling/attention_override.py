"""Run a transformers model with a custom registered attention function, temporarily.

Both custom attention paths (IG probes in `packed_attention`, packed SFT samples in
`modeling.varlen`) need the same two things for the duration of one forward: the model's
attention implementation switched to the registered function, and that function's side
input (probe layout, sample spans) available through a context variable. Both are restored
on exit, even after an error. Not thread-safe for one model object shared by threads (the
config is shared).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any, TypeVar

import torch

T = TypeVar("T")


@contextlib.contextmanager
def attention_override(model: torch.nn.Module, implementation: str,
                       variable: contextvars.ContextVar[T], value: T) -> Iterator[None]:
    config: Any = model.config
    previous = config._attn_implementation
    token = variable.set(value)
    config._attn_implementation = implementation
    try:
        yield
    finally:
        config._attn_implementation = previous
        variable.reset(token)
