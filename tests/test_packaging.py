"""What `pip install .` gets: the wheel holds the default configs of `venus-gym demo`, the
packaged data and the packaged warm-start policy, and the defaults resolve through importlib.resources from the installed
package, without a source checkout or its working directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIGS = ("trainers/configs/demo_sft.yaml", "trainers/configs/demo_igpo.yaml")
WARM_START_FILES = tuple(f"trainers/warm_start/{name}" for name in (
    "model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json",
    "warm_start.json", "README.md"))
DATA_FILES = ("venus_gym/data/hotpotqa_dev_distractor_500.jsonl",
              "venus_gym/data/LICENSE-hotpotqa-CC-BY-SA-4.0.txt", "venus_gym/data/README.md")
# Build and run outputs a copy of the checkout leaves behind (without git to list files).
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "runs", "outputs",
                                    "*.egg-info", "__pycache__", ".*_cache", ".hypothesis",
                                    ".whl")


def _copy_source(dest: Path) -> Path:
    """The checkout's source files, copied: building in place would write build/ and
    *.egg-info into the checkout."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], cwd=REPO, capture_output=True,
                                check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an sdist)
        shutil.copytree(REPO, dest, ignore=NOT_SOURCE)
        return dest
    for name in filter(None, listed):
        if (REPO / name).is_file():  # a tracked file deleted in the worktree is skipped
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("setuptools", reason="building the wheel offline needs setuptools")
    work = tmp_path_factory.mktemp("wheel")
    source = _copy_source(work / "src")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(work / "dist"), str(source)],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    (built,) = (work / "dist").glob("venus_gym-*.whl")
    return built


def test_the_wheel_holds_the_default_configs_the_data_and_the_command(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
    assert set(DEFAULT_CONFIGS) <= names
    assert set(DATA_FILES) <= names
    assert set(WARM_START_FILES) <= names  # `warm-start` works from a non-editable install
    assert {"venus_gym/__init__.py", "envs/__init__.py", "envs/registration.py",
            "trainers/cli.py", "trainers/sft/recipe.py"} <= names
    assert not any(n.startswith(("tests/", "examples/", "benchmarks/")) for n in names)
    assert "venus-gym = trainers.cli:main" in scripts


def test_the_installed_package_runs_from_outside_any_checkout(wheel, tmp_path):
    """Unpacked (a pure-Python wheel installs by unpacking) and run from another directory,
    the package finds its default configs and its HotpotQA data."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = """
import json
import gymnasium as gym
import envs, trainers
from trainers.cli import build_parser
from trainers.pipeline import DEFAULT_RL_CONFIG, DEFAULT_SFT_CONFIG
from trainers.rl.config import load_rl_config
from trainers.sft.config import load_config
from trainers.modeling.models import resolve_model_path
demo = build_parser().parse_args(["demo"])
env = gym.make("DeepResearch-HotpotQA-v0").unwrapped
print(json.dumps({"package": trainers.__file__, "envs": envs.__file__,
                  "configs": [DEFAULT_SFT_CONFIG, DEFAULT_RL_CONFIG],
                  "demo": [demo.sft_config, demo.rl_config],
                  "episodes": load_config(DEFAULT_SFT_CONFIG).data.num_episodes,
                  "algorithm": load_rl_config(DEFAULT_RL_CONFIG).algorithm.name,
                  "hotpotqa_tasks": len(env.tasks),
                  "warm_start": str(resolve_model_path("warm-start"))}))
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, capture_output=True,
                            text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(site)})
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.splitlines()[-1])
    assert Path(found["package"]).is_relative_to(site)
    assert Path(found["envs"]).is_relative_to(site)
    assert found["configs"] == [str(site / name) for name in DEFAULT_CONFIGS]
    assert found["demo"] == found["configs"]
    assert found["episodes"] > 0 and found["algorithm"] == "igpo"
    assert found["hotpotqa_tasks"] > 0
    assert Path(found["warm_start"]) == site / "trainers" / "warm_start"


def test_the_default_configs_resolve_from_another_working_directory(tmp_path):
    """From the checkout too, the defaults come from the package (importlib.resources), not
    from a path relative to the working directory."""
    code = ("from trainers.pipeline import DEFAULT_RL_CONFIG, DEFAULT_SFT_CONFIG\n"
            "print(DEFAULT_SFT_CONFIG); print(DEFAULT_RL_CONFIG)")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    paths = [Path(line) for line in result.stdout.split()]
    assert paths == [REPO / name for name in DEFAULT_CONFIGS]
    assert all(path.is_file() for path in paths)
