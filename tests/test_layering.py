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
    too_long = {str(path.relative_to(REPO)): lines for package in ("envs", "trainers", "venus_gym")
                for path in _sources(package)
                if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not too_long, (f"modules over {MAX_MODULE_LINES} lines: {too_long}; split them by "
                          f"idea (docs/design.md's file map names where each part lives)")
    top_level = sorted(path.name for path in (REPO / "trainers").glob("*.py"))
    assert len(top_level) <= MAX_TOP_LEVEL_TRAINERS_MODULES, (
        f"{len(top_level)} modules at the top of trainers/ ({top_level}): move stage code into "
        f"its subpackage (algorithms, engines, evaluation, modeling, rl, sft, data)")


# --- the stages inside trainers/ --------------------------------------------------------------
# Lowest first. A part of trainers/ (a subpackage or a top-level module) may import parts of
# lower rows only, whether at module level, inside a function or under TYPE_CHECKING: the
# model sits below everything, the RL and SFT trainers above evaluation, the pipeline and the
# command on top. A new part fails test_every_part_of_trainers_has_a_stage until placed here.
# RL sits above SFT, as the recipe's stage 2 above its stage 1: an RL update may train on
# SFT's samples with SFT's loss (learner.sft_coef, trainers/rl/sft_mix.py); SFT knows no RL.
TRAINERS_STAGES = (
    ("modeling", "batch", "config_yaml", "checkpoint_files", "backends"),
    ("trajectory", "config_utils", "distributed", "algorithms", "engines"),
    ("run_log", "rollout", "data"),
    ("evaluation", "integrations"),
    ("sft",),
    ("rl",),
    ("pipeline",),
    ("cli",),
)
STAGE_OF = {part: row for row, parts in enumerate(TRAINERS_STAGES) for part in parts}
# Data, not code: folders of package data (configs, the packaged policy) and the package.
NOT_PARTS = {"__init__", "configs", "warm_start"}


def trainers_part(module: str) -> str | None:
    """'rl' for trainers.rl.driver, 'batch' for trainers.batch, None for other packages."""
    parts = module.split(".")
    return parts[1] if parts[0] == "trainers" and len(parts) > 1 else None


def trainers_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of every import of a trainers module in `source`, wherever it sits;
    `from trainers import rl` names trainers.rl."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names
                      if alias.name.split(".")[0] == "trainers"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "trainers":
                found += [(node.lineno, f"trainers.{alias.name}") for alias in node.names]
            elif node.module.split(".")[0] == "trainers":
                found.append((node.lineno, node.module))
    return found


def stage_violations(source: str, part: str) -> list[str]:
    """'line: part imports other (stage a -> b)' for every import that does not go down."""
    found = []
    for line, module in trainers_imports(source):
        other = trainers_part(module)
        if other is None or other == part:
            continue
        if other not in STAGE_OF or STAGE_OF[other] >= STAGE_OF[part]:
            found.append(f"{line}: {part} imports {module} (stage {STAGE_OF[part]} -> "
                         f"{STAGE_OF.get(other, 'none')})")
    return found


def _part_of_file(path: Path) -> str:
    relative = path.relative_to(REPO / "trainers")
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def test_every_part_of_trainers_has_a_stage():
    parts = {_part_of_file(path) for path in _sources("trainers")} - NOT_PARTS
    assert len(parts) >= 15
    assert parts - set(STAGE_OF) == set(), "place new parts of trainers/ in TRAINERS_STAGES"
    assert set(STAGE_OF) - parts == set(), "TRAINERS_STAGES names a part that is gone"


def test_trainers_imports_go_down_the_stages():
    found = {str(path.relative_to(REPO)): hits for path in _sources("trainers")
             if _part_of_file(path) not in NOT_PARTS
             and (hits := stage_violations(path.read_text(), _part_of_file(path)))}
    assert not found, f"imports against the stage order (tests/test_layering.py): {found}"


@pytest.mark.parametrize("source, part, expected", [
    ("def f():\n    from trainers.rl.driver import train", "modeling",
     ["2: modeling imports trainers.rl.driver (stage 0 -> 5)"]),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trainers.sft.config import X",
     "evaluation", ["3: evaluation imports trainers.sft.config (stage 3 -> 4)"]),
    ("from trainers import pipeline", "rl", ["1: rl imports trainers.pipeline (stage 5 -> 6)"]),
    ("from trainers.rl.config import RLConfig", "sft",
     ["1: sft imports trainers.rl.config (stage 4 -> 5)"]),
    ("from trainers.sft.packing import collate", "rl", []),  # rl stands above sft
    ("import trainers.rollout", "engines", ["1: engines imports trainers.rollout (stage 1 -> 2)"]),
    ("from trainers.evaluation import paired", "sft", []),  # sft stands above evaluation
    ("from trainers.rl.learner import Learner", "rl", []),   # within a part
    ("from trainers.batch import collate", "algorithms", []),
])
def test_the_stage_check_sees_a_planted_back_edge(source, part, expected):
    assert stage_violations(source, part) == expected


def module_graph(package: str = "trainers") -> dict[str, set[str]]:
    """module -> the modules of `package` it imports (anywhere in the file)."""
    modules = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
               for p in _sources(package)}

    def resolve(name: str) -> str | None:
        parts = name.split(".")
        return next((".".join(parts[:i]) for i in range(len(parts), 0, -1)
                     if ".".join(parts[:i]) in modules), None)

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets |= {resolve(f"{node.module}.{alias.name}") for alias in node.names}
            elif isinstance(node, ast.Import):
                targets |= {resolve(alias.name) for alias in node.names}
        graph[module] = {t for t in targets if t and t != module
                         and not module.startswith(t + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while component[-1:] != [node]:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles_between_trainers_modules():
    graph = module_graph()
    assert len(graph) >= 80 and sum(map(len, graph.values())) >= 200
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_type_only_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
