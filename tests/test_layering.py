"""The layering: venus_gym (protocol, tools, worlds) imports neither envs nor trainers, and
envs imports no trainers, not even inside a function; the `venus-gym` command's light
subcommands never load torch. One exception, by design: venus_gym/registration.py names
the environments' entry points ("envs.deep_research:DeepResearchEnv") as strings, which
Gymnasium imports only on gym.make, so `import venus_gym` registers the ids.

The static checks read every source file with `ast`, so an import that only runs on some
code path (a lazy import in a function, `importlib.import_module("trainers...")`, a
Gymnasium entry point string "envs.module:Class") fails here without being executed.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = {"venus_gym": ("envs", "trainers"), "envs": ("trainers",)}
# A string that names a module of a forbidden package: "trainers.cli", "envs",
# "envs.deep_research:DeepResearchEnv" (an entry point) or "envs:DeepResearch-v0" (a
# Gymnasium id that imports the package). Prose (docstrings) does not match.
MODULE_STRING = re.compile(r"^(?P<package>\w+)(\.\w+)*(:[\w.-]+)?$")
# The only module strings above its layer a file may hold: the lazy Gymnasium entry points.
ALLOWED_STRINGS = {"venus_gym/registration.py": {"envs.deep_research:DeepResearchEnv"}}


def _sources(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


def forbidden_imports(path: Path, forbidden: tuple[str, ...],
                      allowed_strings: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """'line: what' for every import of, or module string naming, a forbidden package
    (except the module strings in `allowed_strings`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []

    def top(name: str | None) -> str:
        return (name or "").split(".")[0]

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {alias.name}" for alias in node.names
                      if top(alias.name) in forbidden]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and top(node.module) in forbidden:
                found.append(f"{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = MODULE_STRING.match(node.value)
            if match and match["package"] in forbidden and node.value not in allowed_strings:
                found.append(f"{node.lineno}: module string {node.value!r}")
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_source_file_imports_a_package_above_its_layer(package):
    files = _sources(package)
    assert len(files) >= 5, f"found only {files} under {REPO / package}"
    found = {name: hits for path in files
             if (hits := forbidden_imports(path, FORBIDDEN[package], ALLOWED_STRINGS.get(
                 name := str(path.relative_to(REPO)), set())))}
    assert not found, (f"{package} must not depend on {' or '.join(FORBIDDEN[package])} "
                       f"(tests/test_layering.py): {found}")


@pytest.mark.parametrize("source, expected", [
    ("import trainers.rl.driver", ["1: import trainers.rl.driver"]),
    ("def f():\n    from trainers.pipeline import main", ["2: from trainers.pipeline import ..."]),
    ("import importlib\nimportlib.import_module('trainers.cli')",
     ["2: module string 'trainers.cli'"]),
    ("SPEC = {'entry_point': 'envs.deep_research:DeepResearchEnv'}",
     ["1: module string 'envs.deep_research:DeepResearchEnv'"]),
    ("gym_id = 'envs:DeepResearch-v0'", ["1: module string 'envs:DeepResearch-v0'"]),
    ("'''Docstring naming envs.config and trainers.'''\nfrom venus_gym import protocol\n"
     "from . import envs_helpers\nimport environment", []),
])
def test_the_check_sees_lazy_imports_and_module_strings(tmp_path, source, expected):
    path = tmp_path / "module.py"
    path.write_text(source)
    assert forbidden_imports(path, ("envs", "trainers")) == expected


def _python(code: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_importing_every_venus_gym_module_loads_neither_envs_nor_trainers():
    names = [".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
             for path in _sources("venus_gym")]
    code = f"""
import importlib, json, sys
for name in {names!r}:
    importlib.import_module(name)
print(json.dumps([len({names!r}), sorted({{m.split(".")[0] for m in sys.modules}}
                                         & {{"envs", "trainers"}})]))
"""
    result = _python(code)
    assert result.returncode == 0, result.stderr
    count, loaded = json.loads(result.stdout.splitlines()[-1])
    assert count >= 10 and loaded == []


def test_importing_envs_registers_the_ids_and_loads_no_trainers():
    code = """
import json, sys
import gymnasium as gym
before = "DeepResearch-v0" in gym.registry
import envs, envs.deep_research, envs.group, envs.wrappers, envs.resources
env = gym.make("DeepResearch-v0", world_size=200)
print(json.dumps([before, sorted(s["id"] for s in envs.registration.ENV_SPECS
                                 if s["id"] in gym.registry),
                  "trainers" in {m.split(".")[0] for m in sys.modules},
                  "torch" in sys.modules]))
"""
    result = _python(code)
    assert result.returncode == 0, result.stderr
    before, registered, trainers_loaded, torch_loaded = json.loads(
        result.stdout.splitlines()[-1])
    assert before is False
    assert registered == ["DeepResearch-HotpotQA-v0", "DeepResearch-v0"]
    assert trainers_loaded is False and torch_loaded is False


def test_the_allowance_is_only_the_entry_point_string(tmp_path):
    path = tmp_path / "registration.py"
    path.write_text("SPEC = 'envs.deep_research:DeepResearchEnv'\nimport envs\n"
                    "OTHER = 'envs.group:DeepResearchGroupEnv'")
    assert forbidden_imports(path, ("envs",), {"envs.deep_research:DeepResearchEnv"}) == [
        "2: import envs", "3: module string 'envs.group:DeepResearchGroupEnv'"]


def test_importing_venus_gym_registers_the_ids_lazily():
    """`import venus_gym` is enough for gym.make; envs is imported by gym.make itself, not
    by the import."""
    code = """
import json, sys
import gymnasium as gym
import venus_gym
loaded_at_import = "envs" in sys.modules
env = gym.make("DeepResearch-v0", world_size=200)
question, info = env.reset(seed=0)
print(json.dumps([loaded_at_import, type(env.unwrapped).__module__, bool(question),
                  "trainers" in sys.modules]))
"""
    result = _python(code)
    assert result.returncode == 0, result.stderr
    loaded_at_import, module, asked, trainers_loaded = json.loads(result.stdout.splitlines()[-1])
    assert loaded_at_import is False
    assert module == "envs.deep_research" and asked
    assert trainers_loaded is False


def test_the_gymnasium_id_with_the_module_prefix_imports_envs():
    result = _python('import gymnasium as gym\n'
                     'env = gym.make("envs:DeepResearch-v0", world_size=200)\n'
                     'print(type(env.unwrapped).__module__)')
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["envs.deep_research"]


@pytest.mark.parametrize("argv", [
    ["--help"], ["oracle", "--help"], ["demo", "--help"], ["rl", "--help"],
    ["world", "build", "--help"], ["env-help"],
    ["oracle", "--world-size", "200", "--show", "1", "--eval-tasks", "3"],
])
def test_light_subcommands_do_not_import_torch(argv, tmp_path):
    """The command's front end loads trainers lazily: --help of any subcommand, `oracle`,
    `world` and `env-help` run without torch (they work without the training extras)."""
    code = f"""
import sys
from trainers.cli import main
try:
    status = main({argv!r})
except SystemExit as stop:
    status = stop.code
print("STATUS", status, "torch" in sys.modules)
"""
    result = _python(code, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "STATUS 0 False"


def test_world_build_and_info_run_without_torch(tmp_path):
    code = f"""
import sys
from trainers.cli import main
assert main(["world", "build", {str(tmp_path / "w")!r}, "--pages", "150", "--seed", "1"]) == 0
assert main(["world", "info", {str(tmp_path / "w")!r}]) == 0
print("TORCH", "torch" in sys.modules)
"""
    result = _python(code, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "TORCH False" in result.stdout
    assert re.search(r"\d+ pages, \d+ tasks", result.stdout)
    assert (tmp_path / "w" / "corpus.jsonl").is_file()


MAX_MODULE_LINES = 600  # a module a reader can hold in mind; split by idea beyond that
MAX_TOP_LEVEL_TRAINERS_MODULES = 12  # the rest lives in its stage's subpackage


def test_modules_stay_small_and_trainers_is_organised_by_stage():
    too_long = {str(path.relative_to(REPO)): lines for package in ("envs", "trainers")
                for path in _sources(package)
                if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not too_long, (f"modules over {MAX_MODULE_LINES} lines: {too_long}; split them by "
                          f"idea (docs/design.md's file map names where each part lives)")
    top_level = sorted(path.name for path in (REPO / "trainers").glob("*.py"))
    assert len(top_level) <= MAX_TOP_LEVEL_TRAINERS_MODULES, (
        f"{len(top_level)} modules at the top of trainers/ ({top_level}): move stage code into "
        f"its subpackage (algorithms, engines, evaluation, modeling, rl, sft, data)")
