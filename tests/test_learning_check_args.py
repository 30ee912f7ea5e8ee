"""benchmarks/learning_check.py --trained: policies an earlier check trained are played
instead of trained again, and a wrong pair is refused with its reason."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def learning_check():
    sys.path.insert(0, str(BENCHMARKS))  # the script imports its sibling rl_checks
    try:
        spec = importlib.util.spec_from_file_location("learning_check",
                                                      BENCHMARKS / "learning_check.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCHMARKS))


def _policy(directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text("{}")
    return directory


def test_trained_arms_map_to_their_directories(learning_check, tmp_path):
    igpo = _policy(tmp_path / "igpo" / "final")
    placebo = _policy(tmp_path / "placebo" / "final")
    assert learning_check.parse_trained([f"igpo={igpo}", f"placebo={placebo}"], ["grpo"]) \
        == {"igpo": str(igpo), "placebo": str(placebo)}
    assert learning_check.parse_trained([], ["igpo"]) == {}


@pytest.mark.parametrize("pair, arms, says", [
    ("ppo={p}", ["grpo"], "ARM one of"),          # not an arm of the check
    ("{p}", ["grpo"], "ARM one of"),              # no ARM=
    ("igpo={p}", ["igpo", "grpo"], "in --arms"),  # trained here as well
    ("igpo={p}/missing", ["grpo"], "not a saved policy"),
])
def test_wrong_trained_pairs_are_refused_with_the_reason(learning_check, tmp_path, pair, arms,
                                                         says):
    policy = _policy(tmp_path / "final")
    with pytest.raises(SystemExit, match=says):
        learning_check.parse_trained([pair.format(p=policy)], arms)


def test_an_arm_given_twice_is_refused(learning_check, tmp_path):
    policy = _policy(tmp_path / "final")
    with pytest.raises(SystemExit, match="already given"):
        learning_check.parse_trained([f"igpo={policy}", f"igpo={policy}"], ["grpo"])
