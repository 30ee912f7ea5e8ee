"""`venus-gym chat` (trainers.evaluation.chat) driven through a pseudo-terminal: a scripted
question, a scripted engine, the turns printed as they come, Ctrl-C ending the program
cleanly."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

DRIVER = r'''
import sys
from trainers.engines.scripted import ScriptedEngine
from trainers.evaluation.chat import ChatSession, chat_loop
from trainers.modeling.models import build_chatml_tokenizer
from trainers.rollout import SamplingConfig, text_token_counter
from trainers.sft.pipeline import build_chat
from venus_gym.corpus import World
from venus_gym.worlds import load_world

def respond(observations):
    """Searches first, then answers Paris; each turn 'thinks' first."""
    if len(observations) == 1:
        return ('<think>I should search.</think>\n<tool_call>{"name": "search", "arguments": '
                '{"query": ["capital of France"]}}</tool_call>')
    return "<think>The page says Paris.</think>\n<answer>Paris</answer>"

chat = build_chat(build_chatml_tokenizer(["capital of France Paris search answer think"] * 5,
                                         vocab_size=300))
base = load_world(sys.argv[1])
world = World(base.name, base.corpus, list(base.tasks))
session = ChatSession(ScriptedEngine(chat.tokenizer, respond, chat.end_of_turn_id), chat, world,
                      {"max_turns": 4, "token_counter": text_token_counter(chat)},
                      SamplingConfig(max_turn_tokens=512, temperature=0.0))
sys.exit(chat_loop(session))
'''


def read_until(fd: int, marker: str, seen: list[str], timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    while marker not in "".join(seen):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no {marker!r} in the terminal output:\n{''.join(seen)}")
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if ready:
            try:
                seen.append(os.read(fd, 4096).decode("utf-8", "replace"))
            except OSError:  # the child closed the terminal
                break
    return "".join(seen)


def test_chat_streams_turns_and_ends_cleanly_on_ctrl_c(tmp_path):
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"id": "q0", "question": "What is the capital of France?",
                              "answers": ["Paris"], "paragraphs": [
                                  {"title": "France", "is_supporting": True,
                                   "text": "The capital of France is Paris."}]}) + "\n")
    (tmp_path / "driver.py").write_text(DRIVER)
    master, slave = pty.openpty()

    def controlling_terminal():  # the pty becomes the child's terminal: Ctrl-C -> SIGINT
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        # As a terminal's shell starts a program: SIGINT at its default. A background job of a
        # non-interactive shell (`pytest ... &`) inherits SIGINT ignored, and Python then
        # installs no KeyboardInterrupt handler, so Ctrl-C would do nothing. A runner that
        # blocks SIGINT passes the blocked mask on through fork and exec: the signal would wait
        # pending forever. A terminal starts its shell with nothing blocked.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(qa)],
                             stdin=slave, stdout=slave, stderr=slave, env=env,
                             preexec_fn=controlling_terminal, close_fds=True)
    os.close(slave)
    seen: list[str] = []
    try:
        read_until(master, "question> ", seen)
        os.write(master, b"What is the capital of France?\n")
        text = read_until(master, "score", seen)
        # Ready for the next question: wait for the prompt printed after the score (the first
        # prompt is in `text` too, so looking in all of it would not wait; a Ctrl-C sent while
        # the answer is still being printed raced the child on a loaded machine).
        read_until(master, "question> ", [text[text.rindex("score"):]])
        for expected in ("[reasoning] I should search.", "[tool call] {\"name\": \"search\"",
                         "[tool response]", "[answer] Paris", "gold: Paris", "(score 1.00)"):
            assert expected in text, expected
        assert text.index("[tool call]") < text.index("[tool response]") < text.index(
            "[answer] Paris")
        assert "\033[" in text  # a terminal gets colours
        os.write(master, b"\x03")  # Ctrl-C at the prompt
        text = read_until(master, "bye", seen)
        assert child.wait(timeout=60) == 0
        assert "Traceback" not in text and "KeyboardInterrupt" not in text
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
            child.wait()
        os.close(master)


def test_chat_refuses_a_missing_policy(capsys):
    from trainers.cli import main

    assert main(["chat"]) == 2
    assert "--policy" in capsys.readouterr().err
