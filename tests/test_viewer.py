"""`venus-gym view` (trainers.evaluation.viewer): the page's data, its escaping, and the page itself in a
real headless Chromium (loads without console errors, lists the right number of
trajectories, filters through the URL hash, never runs markup found in a trajectory)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from trainers.cli import main as cli_main
from trainers.evaluation.viewer import embedded_json, split_turn, view_item, write_viewer
from trainers.trajectory import Trajectory, Turn, write_trajectories

XSS = ('</script><script>document.body.dataset.pwned="1"</script>'
       '<img src=x onerror="document.body.dataset.pwned=\'1\'">')


def trajectory(index: int, *, correct: bool, hops: int, malformed: bool = False,
               text: str = "Paris", advantages: list[float] | None = None) -> Trajectory:
    turns = [Turn(kind="search", valid=True, env_reply=f"<tool_response>hits {text}</tool_response>",
                  assistant=f'<think>look up {text}</think>\n<tool_call>{{"name": "search", '
                            f'"arguments": {{"query": ["{index}"]}}}}</tool_call>',
                  ig_reward=0.25)]
    if malformed:
        turns.append(Turn(kind="invalid", valid=False, assistant="<think>oops", env_reply="error",
                          reason="missing </think>", format_reward=-1.0))
    turns.append(Turn(kind="answer", valid=True, assistant=f"<think>done</think>\n<answer>{text}"
                      "</answer>", outcome_reward=float(correct)))
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": f"q{index}"}]
    for turn in turns:
        messages.append({"role": "assistant", "content": turn.assistant})
        if turn.env_reply:
            messages.append({"role": "user", "content": turn.env_reply})
    metadata = {"hops": hops}
    if advantages:
        metadata["turn_advantages"] = advantages
    return Trajectory(id=f"t{index}", messages=messages, task_id=f"task{index}",
                      question=f"Question {index} about {text}?", answers=["Paris"], turns=turns,
                      outcome=float(correct), metadata=metadata)


def sample_file(tmp_path):
    trajectories = [trajectory(0, correct=False, hops=2, malformed=True, text=XSS),
                    trajectory(1, correct=True, hops=1),
                    trajectory(2, correct=True, hops=2, advantages=[0.5, -0.2]),
                    trajectory(3, correct=False, hops=1),
                    trajectory(4, correct=True, hops=2)]
    path = tmp_path / "samples.jsonl"
    write_trajectories(path, trajectories)
    return path


def test_view_items_carry_turn_parts_rewards_and_reasons(tmp_path):
    parts = split_turn('<think>a</think>\n<tool_call>{"x": 1}</tool_call> tail')
    assert [p["kind"] for p in parts] == ["think", "call", "text"]
    item = view_item(trajectory(2, correct=True, hops=2, malformed=True,
                                advantages=[0.5, -0.2, 0.1]).to_json())
    assert item["correct"] and item["hops"] == 2 and item["errors"] == 1
    assert item["turns"][1]["reason"] == "missing </think>" and not item["turns"][1]["valid"]
    assert item["turns"][0]["ig"] == 0.25 and item["turns"][0]["advantage"] == 0.5
    assert item["turns"][2]["reward"] == 1.0
    safe = embedded_json({"text": XSS + "&\u2028"})
    assert not set("<>&") & set(safe) and json.loads(safe)["text"] == XSS + "&\u2028"


def test_view_command_writes_one_self_contained_page(tmp_path, capsys):
    path = sample_file(tmp_path)
    assert cli_main(["view", str(path), "-o", str(tmp_path / "page.html")]) == 0
    assert "5 trajectories" in capsys.readouterr().out
    page = (tmp_path / "page.html").read_text()
    # No network: nothing is fetched from anywhere, and the CSP forbids it anyway.
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert "default-src 'none'" in page
    assert page.count("</script>") == 2  # the data block and the page's script, nothing else
    assert cli_main(["view", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "x.html")]) == 2


# --- in a real browser ------------------------------------------------------------------------
def _install_chromium() -> str | None:
    """The system Chromium, installed with apt-get when missing and possible."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    if shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0:
        for command in (["apt-get", "install", "-y", "-q", "chromium"],
                        ["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
            subprocess.run(command, capture_output=True, timeout=900, check=False)
            if shutil.which("chromium"):
                return shutil.which("chromium")
    return None


@pytest.fixture(scope="module")
def chromium():
    browser = _install_chromium()
    if browser is None:
        pytest.skip("no Chromium and none installable here (needs apt-get as root); "
                    "CI installs it (.ci/run)")
    return browser


def browse(chromium, tmp_path, page, fragment=""):
    """(DOM after the page's script ran, console lines) of the page at #fragment."""
    result = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
         "--dump-dom", page.as_uri() + fragment],
        capture_output=True, text=True, timeout=120, check=False)
    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line]
    return result.stdout, console


def shown(dom):
    found = re.search(r'id="count"[^>]*data-shown="(\d+)"', dom)
    assert found, dom[:2000]
    return int(found.group(1)), len(re.findall(r'<li class="traj', dom))


def test_page_in_headless_chromium(chromium, tmp_path):
    page, count = write_viewer(sample_file(tmp_path), tmp_path / "page.html")
    dom, console = browse(chromium, tmp_path, page)
    assert console == [] and 'data-ready="1"' in dom  # the script ran to its end, silently
    assert shown(dom) == (5, 5) and count == 5
    # The first trajectory (shown in the detail pane) holds markup: it appears as text only.
    assert "data-pwned" not in dom and not re.search(r"<img[\s>]", dom)
    assert "&lt;img src=x onerror=" in dom and "malformed: missing &lt;/think&gt;" in dom
    assert "tool response" in dom and "reasoning" in dom
    for fragment, expected in (("#outcome=wrong", 2), ("#outcome=correct&hops=2", 2),
                               ("#format=errors", 1), ("#hops=1", 2), ("#q=question%203", 1)):
        dom, console = browse(chromium, tmp_path, page, fragment)
        assert console == [] and shown(dom) == (expected, expected), fragment
    dom, _ = browse(chromium, tmp_path, page, "#traj=t2")
    assert "advantage 0.500" in dom and "IG 0.250" in dom
