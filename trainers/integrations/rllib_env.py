"""DeepResearch-v0 as a token-id environment for RLlib's env runners: one step = one turn.

    from trainers.integrations.rllib_env import register_rllib_env
    register_rllib_env()            # ray.tune.register_env("DeepResearch-v0", ...)
    config = PPOConfig().environment("DeepResearch-v0", env_config={
        "policy_path": "runs/sft/final", "env": {"world_size": 2000, "max_turns": 8}})

RLlib's env runners batch observations and actions as arrays, and a language-model policy
works on token ids, so `TokenTurnEnv` wraps the text environment in the policy's tokenizer:

* observation: the ids the policy has not seen yet, as the chat template gives them: on
  reset the system prompt + question + generation prompt; after a turn the closing of the
  assistant message, the environment's reply and the next generation prompt. Concatenating
  every observation and action of an episode gives exactly the project's trajectory ids
  (`trainers.rollout.rollout_group` builds them with the same `ConversationBuilder`), and
  the loss mask is 1 on the actions' ids, 0 on the observations'.
* action: the turn's generated ids, verbatim (ending with the end-of-turn id unless cut by
  the per-turn limit). The wrapper decodes them only because the environment speaks text,
  cuts the text at a stop string as the rollout does, and never encodes that text again.
* spaces: `MultiDiscrete([V + 1] * length)` (V = the tokenizer's size); id V is padding, so
  a space holds any shorter id list. An observation longer than `max_observation_tokens`
  raises with that setting named rather than being cut (cutting would break token in, token
  out). On the episode's last step the observation is the trajectory's closing ids.
* budgets: the environment's own (turns, its context budget with the forced final answer)
  apply; the rollout's hard context cap `max_context_tokens` truncates an episode whose
  next prompt has no room left, as `rollout_group` does.
* info: the environment's info plus `task_id` on reset and `valid` / `kind` per turn, which
  `trainers.integrations.rllib.TurnMetricsCallback` turns into the format-valid rate.

Rewards are the environment's: the answer's score on the answer turn, -format_penalty on a
malformed turn, 0 otherwise. Information-gain turn rewards need the policy and the gold
answer and are computed by the project's own trainer only (docs/rllib.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from envs.deep_research import DeepResearchEnv
from trainers.config_utils import from_dict, help_field
from trainers.engines.base import find_stop_string, text_before_stop_string
from trainers.modeling.tokenization import ChatTokenizer, ConversationBuilder
from trainers.rollout import DEFAULT_STOP_STRINGS, text_token_counter

RLLIB_ENV_NAME = "DeepResearch-v0"


@dataclass
class TokenTurnConfig:
    """The `env_config` RLlib passes to the env creator (a dict with these keys)."""

    policy_path: str = help_field(
        "directory of the policy (transformers checkpoint with its tokenizer and chat "
        "template, e.g. an SFT run's final/): the tokenizer that maps text to ids", "")
    env: dict[str, Any] = help_field(
        "DeepResearch-v0 keyword arguments (world, world_size, max_turns, budgets, ...); "
        "token_counter defaults to the policy tokenizer's count", factory=dict)
    max_observation_tokens: int = help_field(
        "length of the observation space; a longer observation raises (raise it)", 2048)
    max_turn_tokens: int = help_field(
        "length of the action space: the most ids one turn may generate", 64)
    max_context_tokens: int = help_field(
        "hard cap on an episode's ids; an episode whose next prompt leaves no room is "
        "truncated (trainers.rollout's rule)", 2048)
    stop_strings: tuple[str, ...] = help_field(
        "the environment reads a turn's text up to the first of these", DEFAULT_STOP_STRINGS)

    @classmethod
    def from_env_config(cls, env_config: Any) -> TokenTurnConfig:
        """Build from RLlib's EnvContext / a dict; unknown keys are refused by name."""
        config = from_dict(cls, dict(env_config or {}), where="env_config")
        if not config.policy_path:
            raise ValueError("env_config.policy_path is required: the policy directory whose "
                             "tokenizer maps the environment's text to ids")
        for name in ("max_observation_tokens", "max_turn_tokens", "max_context_tokens"):
            if getattr(config, name) < 1:
                raise ValueError(f"env_config.{name} must be >= 1, got {getattr(config, name)}")
        budget = config.env.get("max_context_tokens")
        if budget is not None and budget >= config.max_context_tokens:
            raise ValueError(f"env_config.env.max_context_tokens ({budget}) must be below "
                             f"env_config.max_context_tokens ({config.max_context_tokens}) so "
                             "the forced final turn fits (docs/rl.md)")
        config.stop_strings = tuple(config.stop_strings)
        return config


def token_space(vocab_size: int, length: int) -> gym.spaces.MultiDiscrete:
    """Up to `length` ids in [0, vocab_size); the value vocab_size pads."""
    return gym.spaces.MultiDiscrete(np.full(length, vocab_size + 1, dtype=np.int64))


def padded(ids: list[int], length: int, pad: int, what: str) -> np.ndarray:
    if len(ids) > length:
        raise ValueError(f"{what}: {len(ids)} ids do not fit the space of {length}; raise "
                         f"env_config.{'max_observation_tokens' if what == 'observation' else 'max_turn_tokens'}")
    out = np.full(length, pad, dtype=np.int64)
    out[:len(ids)] = ids
    return out


def unpadded(array: Any, pad: int) -> list[int]:
    return [int(i) for i in np.asarray(array).reshape(-1) if int(i) != pad]


class TokenTurnEnv(gym.Env):
    """DeepResearchEnv with token-id observations and actions (module header)."""

    metadata = {"render_modes": []}

    def __init__(self, config: TokenTurnConfig, chat: ChatTokenizer | None = None):
        if chat is None:
            from trainers.modeling.models import load_tokenizer

            chat = load_tokenizer(config.policy_path)[1]
        self.config = config
        self.chat = chat
        self.pad_id = len(chat.tokenizer)
        env_kwargs = {"token_counter": text_token_counter(chat), **config.env}
        self.env = DeepResearchEnv(**env_kwargs)
        self.observation_space = token_space(self.pad_id, config.max_observation_tokens)
        self.action_space = token_space(self.pad_id, config.max_turn_tokens)
        self._builder: ConversationBuilder | None = None
        self._known = 0  # ids the agent has seen or generated this episode
        self._done = True

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        question, info = self.env.reset(seed=seed, options=options)
        self._builder = ConversationBuilder(self.chat, [
            {"role": "system", "content": self.env.system_prompt},
            {"role": "user", "content": question}])
        prompt = self._builder.prompt_ids()
        self._known = len(prompt)
        self._done = False
        return padded(prompt, self.config.max_observation_tokens, self.pad_id,
                      "observation"), {**info, "task_id": self.env.task.id}

    def step(self, action: Any):
        if self._done or self._builder is None:
            raise RuntimeError("step() after the episode ended; call reset()")
        ids = unpadded(action, self.pad_id)
        if not ids:
            raise ValueError("the action holds no token id: a turn needs at least one")
        builder, chat = self._builder, self.chat
        ended_by_eot = ids[-1] == chat.end_of_turn_id
        text = chat.tokenizer.decode(ids[:-1] if ended_by_eot else ids,
                                     skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)
        builder.add_generation(ids, text)
        self._known += len(ids)
        # Engines stop at the id that completes a stop string, so the ids' tail shows it
        # (the engine's GenerationResult.stop_string, which the action does not carry).
        stop = find_stop_string(chat.tokenizer, ids, self.config.stop_strings)
        observation, reward, terminated, truncated, info = self.env.step(
            text_before_stop_string(text, stop))
        if observation:
            builder.add_env_reply(observation)
        if not (terminated or truncated):
            prompt = builder.prompt_ids()
            if len(prompt) >= self.config.max_context_tokens:
                truncated, info = True, {**info, "budget": "rollout_context"}
        if terminated or truncated:
            self._done = True
            new = builder.finish().input_ids[self._known:]
        else:
            new = prompt[self._known:]
        self._known += len(new)
        info = {**info, "task_id": self.env.task.id}
        return (padded(new, self.config.max_observation_tokens, self.pad_id, "observation"),
                float(reward), bool(terminated), bool(truncated), info)

    def close(self):
        self.env.close()


def make_token_turn_env(env_config: Any) -> TokenTurnEnv:
    """The env creator RLlib calls with its EnvContext (a dict of TokenTurnConfig keys)."""
    return TokenTurnEnv(TokenTurnConfig.from_env_config(env_config))


def register_rllib_env(name: str = RLLIB_ENV_NAME) -> str:
    """Register the token-turn env with Ray Tune's registry under `name`; returns it."""
    from ray.tune import register_env

    register_env(name, make_token_turn_env)
    return name


__all__ = ["RLLIB_ENV_NAME", "TokenTurnConfig", "TokenTurnEnv", "make_token_turn_env",
           "register_rllib_env", "token_space", "unpadded"]
