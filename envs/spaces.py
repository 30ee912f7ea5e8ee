"""Text spaces that accept what language models actually write.

Gymnasium's `spaces.Text` defaults to an alphanumeric charset, so a naive Text space
rejects ordinary LLM output (punctuation, newlines, tags, CJK, emoji). `UnicodeText`
accepts any Python `str` up to a documented length, and samples varied Unicode text
(including DR-Venus protocol tags) so random-action checks exercise the parser.

`MessageList` is the observation space of the chat-history wrapper: a list of
{"role": str, "content": str} dicts.

Vector environments: Gymnasium batches a Text space as a Tuple of Text spaces (sync mode
needs nothing more), but its shared memory (async mode) stores a Text as indices into the
space's charset and drops every other character, and it reads the buffer into a tuple of
str once, when the vector env is built, so every later observation is that stale tuple.
UnicodeText therefore brings its own shared-memory layout (per environment a length, then
the text's code points as UTF-32, lone surrogates included) and reads it as a live view,
`SharedTexts`, whose deep copy (what the vector env returns, `copy=True` by default) is a
tuple of str. So `gym.make_vec(..., vectorization_mode="async")` passes any observation
through unchanged and copies only the characters in use.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import (
    create_shared_memory,
    read_from_shared_memory,
    write_to_shared_memory,
)

# Pieces the sampler mixes: plain ASCII, accented Latin, CJK, emoji, whitespace and the
# protocol's own tags (so a sampled action sometimes looks almost like a real turn).
_SAMPLE_ALPHABETS = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?'\"()[]{}<>/\\-_=+*&^%$#@~`|",
    "àáâãäåæçèéêëìíîïñòóôõöùúûüýÿßœøÅÆØ",
    "研究搜索答案信息页面问题的是在不了人有我他这个们中来上大为和国地到以说时要就出会",
    "😀🔍📄✅❌🚀🧠",
    " \n\t",
)
_SAMPLE_TAGS = (
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<answer>", "</answer>",
    "<tool_response>", '{"name": "search", "arguments": {"query": ["x"]}}', "{", "}",
)


class UnicodeText(spaces.Text):
    """Any Unicode string of length `min_length..max_length` (characters, not tokens).

    Unlike `gymnasium.spaces.Text`, membership does not depend on a charset: every `str`
    within the length bounds is a member. `sample()` draws from a mix of scripts and
    protocol tags; `sample(mask=...)` is not supported (there is no finite charset).
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: Any = None):
        if max_length < 1 or min_length < 0 or min_length > max_length:
            raise ValueError(
                f"UnicodeText needs 0 <= min_length <= max_length and max_length >= 1, "
                f"got min_length={min_length}, max_length={max_length}")
        charset = "".join(dict.fromkeys("".join(_SAMPLE_ALPHABETS)))
        super().__init__(max_length, min_length=min_length, charset=charset, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        if mask is not None or probability is not None:
            raise NotImplementedError("UnicodeText has no finite charset to mask")
        rng = self.np_random
        # Most sampled strings are short: long random text only slows down env checks.
        upper = min(self.max_length, max(self.min_length, 200))
        target = int(rng.integers(self.min_length, upper + 1))
        pieces: list[str] = []
        size = 0
        while size < target:
            if rng.random() < 0.15:
                piece = _SAMPLE_TAGS[int(rng.integers(len(_SAMPLE_TAGS)))]
            else:
                alphabet = _SAMPLE_ALPHABETS[int(rng.integers(len(_SAMPLE_ALPHABETS)))]
                n = int(rng.integers(1, 12))
                piece = "".join(alphabet[i] for i in rng.integers(0, len(alphabet), size=n))
            pieces.append(piece)
            size += len(piece)
        return "".join(pieces)[:target]

    def __repr__(self) -> str:
        return f"UnicodeText(min_length={self.min_length}, max_length={self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return (isinstance(other, UnicodeText) and self.min_length == other.min_length
                and self.max_length == other.max_length)

    __hash__ = None  # type: ignore[assignment]  # mutable rng state, like other spaces


# --- shared memory for async vector environments -------------------------------------------
def _text_slots(space: UnicodeText, memory: Any, n: int) -> np.ndarray:
    return np.frombuffer(memory.get_obj(), dtype=np.int32).reshape(n, space.max_length + 1)


@create_shared_memory.register(UnicodeText)
def _create_unicode_text_memory(space: UnicodeText, n: int = 1, ctx: ModuleType = mp) -> Any:
    return ctx.Array(np.dtype(np.int32).char, n * (space.max_length + 1))


class SharedTexts(Sequence):
    """The n texts in a UnicodeText shared-memory buffer, read when accessed (a view, like
    the numpy arrays Gymnasium returns for Box spaces); `copy.deepcopy` gives a tuple."""

    def __init__(self, slots: np.ndarray):
        self._slots = slots

    def __len__(self) -> int:
        return len(self._slots)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return tuple(self)[i]
        slot = self._slots[i]
        return slot[1: 1 + int(slot[0])].tobytes().decode("utf-32-le", "surrogatepass")

    def __deepcopy__(self, memo: dict) -> tuple[str, ...]:
        return tuple(self)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __repr__(self) -> str:
        return f"SharedTexts({tuple(self)!r})"


@read_from_shared_memory.register(UnicodeText)
def _read_unicode_text(space: UnicodeText, shared_memory: Any, n: int = 1) -> SharedTexts:
    return SharedTexts(_text_slots(space, shared_memory, n))


@write_to_shared_memory.register(UnicodeText)
def _write_unicode_text(space: UnicodeText, index: int, values: str, shared_memory: Any) -> None:
    codes = np.frombuffer(values.encode("utf-32-le", "surrogatepass"), dtype=np.int32)
    if len(codes) > space.max_length:
        raise ValueError(f"observation of {len(codes)} characters does not fit {space!r}")
    destination = np.frombuffer(shared_memory.get_obj(), dtype=np.int32)
    start = index * (space.max_length + 1)
    destination[start] = len(codes)
    destination[start + 1: start + 1 + len(codes)] = codes


class MessageList(spaces.Space[list]):
    """A chat transcript: a list of {"role": str, "content": str} dicts.

    Roles are limited to `roles`; each content must fit `content_space`.
    """

    def __init__(self, content_space: UnicodeText,
                 roles: tuple[str, ...] = ("system", "user", "assistant"),
                 max_messages: int = 100_000, seed: Any = None):
        super().__init__(shape=None, dtype=None, seed=seed)
        self.content_space = content_space
        self.roles = tuple(roles)
        self.max_messages = max_messages

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        if not isinstance(x, list) or len(x) > self.max_messages:
            return False
        return all(
            isinstance(m, dict) and m.keys() == {"role", "content"}
            and m["role"] in self.roles and self.content_space.contains(m["content"])
            for m in x)

    def sample(self, mask: Any = None, probability: Any = None) -> list:
        n = int(self.np_random.integers(1, 5))
        return [{"role": self.roles[int(self.np_random.integers(len(self.roles)))],
                 "content": self.content_space.sample()} for _ in range(n)]

    def seed(self, seed: int | None = None) -> list[int]:
        seeds = super().seed(seed)
        self.content_space.seed(int(np.asarray(seeds).ravel()[0]) + 1)
        return seeds

    def __repr__(self) -> str:
        return f"MessageList(roles={self.roles}, content={self.content_space!r})"

    def __eq__(self, other: Any) -> bool:
        return (isinstance(other, MessageList) and self.roles == other.roles
                and self.content_space == other.content_space)

    __hash__ = None  # type: ignore[assignment]
