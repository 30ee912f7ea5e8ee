"""Wrappers over DeepResearch-v0.

`ChatHistory` turns the per-turn text observations into the full chat transcript that a
chat model consumes: [system, user(question), assistant(turn 1), user(tool reply 1), ...].
Tool replies go back as *user* messages, as in DR-Venus (design.md "Turn format").

The assistant messages are the actions as the environment shows them
(`venus_gym.protocol.sanitize_observation`, like every observation): an action holding
`<|im_end|>`, a control character or a lone surrogate cannot forge a turn boundary in a
consumer that renders the transcript with a chat template. The action as given is in
`info["raw_action"]`.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from venus_gym.protocol import sanitize_observation

from .spaces import MessageList


class ChatHistory(gym.Wrapper):
    """Observation = the whole conversation so far, as a list of role/content dicts.

    The list is a fresh copy each step (callers may keep or mutate it safely). The
    system message carries the tool schemas; pass `include_system=False` to leave it out
    (e.g. when the serving stack adds its own).
    """

    def __init__(self, env: gym.Env, include_system: bool = True):
        super().__init__(env)
        self.include_system = include_system
        self.observation_space = MessageList(env.observation_space)
        self._messages: list[dict[str, str]] = []

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        self._messages = []
        if self.include_system:
            self._messages.append({"role": "system",
                                   "content": self.env.unwrapped.system_prompt})
        self._messages.append({"role": "user", "content": obs})
        return [dict(m) for m in self._messages], info

    def step(self, action: str):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._messages.append({"role": "assistant", "content": sanitize_observation(action)})
        if obs:
            self._messages.append({"role": "user", "content": obs})
        return [dict(m) for m in self._messages], reward, terminated, truncated, info
