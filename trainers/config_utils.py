"""Typed dataclass configs from YAML, shared by the SFT and RL configs, and the env section
both of them embed.

    help_field("Learning rate.", 1e-5)        # a dataclass field with its help string
    config = load_yaml_config("run.yaml", SFTExperimentConfig)   # unknown keys refused
    config_to_dict(config)                    # the whole config, JSON-serialisable

`from_dict` builds a (nested) config dataclass from a mapping: unknown keys fail with the
list of known ones and the key's path, values are type-checked against the annotations
(int where a float is expected is widened; lists become tuples; an optional field takes
None or its type).

`EnvSection` is the environment part of a training config. It *is*
envs.config.DeepResearchConfig (every DeepResearch-v0 keyword, the same help strings and the
same validation, run on construction), with training defaults where they differ: tasks of
1-2 hops and 3 search results per query (short episodes for small models). `kwargs()` gives
the keywords for `gym.make("DeepResearch-v0", ...)` / `DeepResearchGroupEnv`.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from envs.config import DeepResearchConfig


def help_field(text: str, default: Any = dataclasses.MISSING,
               factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with a help string (`factory` for mutable defaults)."""
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata={"help": text})
    return field(default=default, metadata={"help": text})


def field_help(config_class: type) -> dict[str, str]:
    """{field name: help string} of a config dataclass."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(config_class)}


# A number in scientific notation without a dot ("5e-5", "1E6"), which YAML 1.1 leaves a string.
_YAML11_FLOAT = re.compile(r"[-+]?\d+[eE][-+]?\d+")


def _coerce(value: Any, hint: Any, where: str) -> Any:
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, where)
    origin = typing.get_origin(hint)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ValueError(f"{where} must be a list, got {value!r}")
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            item_hints = [args[0]] * len(value)
        else:  # a fixed-length tuple, e.g. betas: tuple[float, float]
            if len(value) != len(args):
                raise ValueError(f"{where} must have {len(args)} items, got {value!r}")
            item_hints = list(args)
        return tuple(_coerce(item, item_hint, f"{where}[{index}]")
                     for index, (item, item_hint) in enumerate(zip(value, item_hints, strict=True)))
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, str) and _YAML11_FLOAT.fullmatch(value.strip()):
        # PyYAML follows YAML 1.1, which reads `lr: 5e-5` (no dot) as the string "5e-5";
        # YAML 1.2 and JSON read it as a number, and so do we.
        return float(value)
    if hint in (int, float, str, bool) and not isinstance(value, hint):
        raise ValueError(f"{where} must be {hint.__name__}, got {value!r}")
    if isinstance(hint, types.UnionType) or origin is typing.Union:
        arms = [arm for arm in typing.get_args(hint) if arm is not type(None)]
        if value is None and len(arms) < len(typing.get_args(hint)):
            return None
        if len(arms) == 1:  # X | None: check and convert as X
            return _coerce(value, arms[0], where)
    return value


def from_dict(config_class: type, data: Any, where: str = "config") -> Any:
    """Build `config_class` from a nested dict, refusing unknown keys by name."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(config_class)
    known = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in {where}; known: {sorted(known)}")
    values = {name: _coerce(value, hints[name], f"{where}.{name}") for name, value in data.items()}
    return config_class(**values)


def load_yaml_config(path: str | Path, config_class: type) -> Any:
    """Load a YAML config file into `config_class` (unknown keys refused, with their path)."""
    with open(path, encoding="utf-8") as handle:
        return from_dict(config_class, yaml.safe_load(handle), where=str(path))


def config_to_dict(config: Any) -> dict[str, Any]:
    """The whole config as plain JSON-serialisable data (tuples become lists)."""
    def plain(value: Any) -> Any:
        if isinstance(value, tuple | list):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value
    return plain(dataclasses.asdict(config))


_ENV_FIELDS = {f.name: f for f in dataclasses.fields(DeepResearchConfig)}


def env_default(name: str, default: Any) -> Any:
    """DeepResearchConfig's field `name` (its help string) with another default."""
    return field(default=default, metadata=_ENV_FIELDS[name].metadata)


@dataclass
class EnvSection(DeepResearchConfig):
    """DeepResearch-v0 settings of a training config (envs.config.DeepResearchConfig, with
    training defaults for hops and search_top_k); validated on construction."""

    hops: tuple[int, ...] | None = env_default("hops", (1, 2))
    search_top_k: int = env_default("search_top_k", 3)

    def __post_init__(self) -> None:
        if isinstance(self.world, str) and self.world.startswith(("http://", "https://")):
            # A retrieval server serves pages, not questions: the tasks come from a file.
            raise ValueError(
                f"env.world {self.world!r} is a url, but a world must supply tasks: set "
                "env.world to a QA JSONL (docs/worlds.md) and serve its searches from the "
                f"server with search_backend: retrieval_server, retrieval_url: {self.world} "
                "(or backend: web, search_provider: retrieve, search_url: the url)")
        self.validate()

    def kwargs(self) -> dict[str, Any]:
        """Every DeepResearch-v0 keyword, as gym.make / DeepResearchGroupEnv take them."""
        values = {name: getattr(self, name) for name in _ENV_FIELDS}
        if values["hops"] is not None:
            values["hops"] = tuple(values["hops"])
        return values
