"""trainers.policy: episodes played by a policy, and the evaluation summary's cut-turn rate
(turns that hit the token cap without an end-of-turn token: how repetition loops show up)."""

from __future__ import annotations

import gymnasium as gym

import venus_gym  # noqa: F401  (registers the environments)
from trainers.models import build_chatml_tokenizer, build_tiny_causal_lm
from trainers.policy import GeneratedTurn, TransformersPolicy, evaluate_policy, run_episode
from trainers.sft.pipeline import build_chat

ENV = {"world_size": 300, "world_seed": 3, "hops": (1,), "max_turns": 2}


class Replies(TransformersPolicy):
    """Returns the given texts in turn, encoded, with or without the end-of-turn id."""

    def __init__(self, model, chat, replies: list[tuple[str, bool]]):
        super().__init__(model, chat)
        self.replies = replies
        self.calls = 0

    def generate_turn(self, prompt_ids):
        text, closed = self.replies[self.calls % len(self.replies)]
        self.calls += 1
        ids = self.chat.tokenizer.encode(text, add_special_tokens=False)
        return GeneratedTurn(ids + [self.chat.end_of_turn_id] * closed, text, [0.0] * (
            len(ids) + closed))


def make_chat():
    return build_chat(build_chatml_tokenizer(["search visit answer think"] * 10,
                                             vocab_size=300))


def test_cut_turns_are_counted_per_episode_and_summarised():
    chat = make_chat()
    model = build_tiny_causal_lm(chat.tokenizer, hidden=32, layers=1, heads=1)
    env = gym.make("DeepResearch-v0", **ENV)
    # max_turns 2: two turns, then the forced final turn; the first and last are cut.
    policy = Replies(model, chat, [("loop loop loop", False), ("<think>x</think>", True),
                                   ("<think>y", False)])
    trajectory, stats = run_episode(env, policy, task_index=0, seed=0)
    assert stats.turns == 3 and stats.cut_turns == 2
    assert trajectory.input_ids[trajectory.turn_spans[0][1]] == chat.end_of_turn_id
    evaluation = evaluate_policy(Replies(model, chat, [("<think>z", False)]), ENV,
                                 num_tasks=2, progress=False)
    summary = evaluation.summary()
    assert summary["cut_turn_rate"] == 1.0 and summary["format_valid_rate"] == 0.0
