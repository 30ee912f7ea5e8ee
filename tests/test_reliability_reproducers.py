"""Faults found by using venus-gym as a hostile user would, each replayed as a test.

1. JSONL records holding U+2028 / U+2029 / U+0085 were split on read (eval resume, viewer).

The tests use only the public entry points (commands, environments, constructors), so each
can be run against older code to see it fail there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import envs  # noqa: F401  (registers DeepResearch-v0)

REPO = Path(__file__).resolve().parents[1]
LINE_BREAKERS = "a\u2028b\u2029c\x85d\ufeffe"


# --- 1. JSONL: every reader reads what its writer wrote ------------------------------------
class AlwaysParis:
    """Builds a policy that answers "Paris" to every question."""

    @staticmethod
    def make(chat):
        from trainers.models import build_tiny_causal_lm
        from trainers.policy import GeneratedTurn, TransformersPolicy

        class Policy(TransformersPolicy):
            calls = 0

            def generate_turn(self, prompt_ids):
                Policy.calls += 1
                text = "<think>I know it.</think>\n<answer>Paris</answer>"
                ids = self.chat.tokenizer.encode(text, add_special_tokens=False)
                return GeneratedTurn(ids + [self.chat.end_of_turn_id], text,
                                     [0.0] * (len(ids) + 1))

        return Policy(build_tiny_causal_lm(chat.tokenizer, hidden=32, layers=1, heads=1), chat)


def test_1_eval_keeps_and_resumes_tasks_whose_text_holds_line_separators(tmp_path):
    pytest.importorskip("torch")
    from tests.test_eval_cli import tiny_chat, write_qa
    from trainers.eval_run import EvalRunConfig, run_eval

    pairs = [("What is the capital of France?", "Paris"),
             (f"Which city {LINE_BREAKERS} hosts the Louvre?", "Paris"),
             ("Which city\u2029is on the Seine?", "Paris")]
    write_qa(tmp_path / "qa.jsonl", pairs)
    chat = tiny_chat()
    config = EvalRunConfig(out=str(tmp_path / "out"), policy="scripted", k=1,
                           benchmark=str(tmp_path / "qa.jsonl"), max_turns=2,
                           max_turn_tokens=16, bootstrap_samples=10)
    policy = AlwaysParis.make(chat)
    first = run_eval(config, policy=policy, chat=chat, progress=False, log=lambda _: None)
    assert first["tasks"] == 3
    calls = type(policy).calls
    again = run_eval(config, policy=policy, chat=chat, progress=False, log=lambda _: None)
    assert type(policy).calls == calls, "a finished task was played again"
    assert again["tasks"] == 3


def test_1_viewer_shows_records_whose_text_holds_line_separators(tmp_path):
    from tests.test_viewer import trajectory
    from trainers.trajectory import write_trajectories
    from trainers.viewer import write_viewer

    trajectories = [trajectory(i, correct=bool(i % 2), hops=1, text=f"P{LINE_BREAKERS}{i}")
                    for i in range(14)]
    write_trajectories(tmp_path / "s.jsonl", trajectories)
    _, shown = write_viewer(tmp_path / "s.jsonl", tmp_path / "page.html")
    assert shown == 14
