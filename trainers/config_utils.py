"""Typed dataclass configs from YAML, shared by the SFT and RL configs, and the env section
both of them embed.

    help_field("Learning rate.", 1e-5)        # a dataclass field with its help string
    config = load_yaml_config("run.yaml", SFTExperimentConfig)   # unknown keys refused
    config = load_yaml_config("run.yaml", RLConfig, ["learner.lr=3e-4", "run.steps=2"])
    config_to_dict(config)                    # the whole config, JSON-serialisable
    print(config_to_yaml(config))             # what `--print-config` prints

`from_dict` builds a (nested) config dataclass from a mapping: unknown keys fail with the
list of known ones and the key's path, values are type-checked against the annotations
(int where a float is expected is widened; lists become tuples; an optional field takes
None or its type).

Overrides (`venus-gym rl --config F learner.lr=3e-4 rollout.group_size=16`) are
`dotted.key=value` strings, as OmegaConf's dotlist (and torchtune) spell them. The value is
read as a YAML value by the reader of the config files (trainers.config_yaml: one typing
path for both), so `3e-4` is a number, `[1, 2]` a list, `{dtype: bfloat16}` a mapping,
`null` None, `2025-01-01` a string, and a quoted value a string. A bool is no number and a
float must be finite (`rollout.group_size=true`, `learner.lr=.nan` are refused), a mapping
field takes a mapping and a list field a list. Each key is checked against the config
dataclasses first (an unknown key fails naming the closest valid ones: `unknown key
learner.lrr; did you mean learner.lr?`); then the values are merged into the YAML file's
mapping (a mapping value merges, anything else replaces) and the result goes through
`from_dict` like the file alone, so an override is typed and validated exactly as the same
value in the file. The dataclasses stay the schema (OmegaConf's structured configs would
take over the types, but cannot express the unions (`tuple[int, ...] | None`), free-form
sections (`algorithm.options`, `rollout.vllm_options`) and per-section checks these
configs rely on).

`EnvSection` is the environment part of a training config. It *is*
envs.config.DeepResearchConfig (every DeepResearch-v0 keyword, the same help strings and the
same validation, run on construction), with training defaults where they differ: tasks of
1-2 hops and 3 search results per query (short episodes for small models). `kwargs()` gives
the keywords for `gym.make("DeepResearch-v0", ...)` / `DeepResearchGroupEnv`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from envs.config import DeepResearchConfig
from trainers.config_yaml import load_config_yaml, read_config_file


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
    if hint in (int, float) and isinstance(value, bool):
        # bool is an int subclass in Python: `group_size: true` would pass as 1.
        raise ValueError(f"{where} must be {hint.__name__}, got {value!r}")
    if hint is float and isinstance(value, float) and not math.isfinite(value):
        # .nan / .inf are YAML floats, but no setting (rate, size, time) means them.
        raise ValueError(f"{where} must be a finite number, got {value!r}")
    if _is_mapping_hint(hint) and not isinstance(value, dict):
        raise ValueError(f"{where} must be a mapping ({{key: value, ...}}), got {value!r}")
    if hint in (tuple, list) and not isinstance(value, list | tuple):
        raise ValueError(f"{where} must be a list, got {value!r}")
    if hint is float and isinstance(value, int):
        try:
            return float(value)
        except OverflowError:  # an int of 309+ digits
            raise ValueError(f"{where} must be a finite number, got an integer too large for "
                             "a float") from None
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
        close = sorted({match for key in unknown
                        for match in difflib.get_close_matches(str(key), known, n=3)})
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ValueError(f"unknown key(s) {unknown} in {where}{hint}; known: {sorted(known)}")
    values = {name: _coerce(value, hints[name], f"{where}.{name}") for name, value in data.items()}
    return config_class(**values)


def load_yaml_config(path: str | Path, config_class: type,
                     overrides: Sequence[str] = ()) -> Any:
    """Load a YAML config file into `config_class` (unknown keys refused, with their path),
    with `dotted.key=value` overrides applied on top (module docstring)."""
    data = read_config_file(path)
    return config_with_overrides(config_class, data, overrides, where=str(path))


def keys_given(path: str | Path, overrides: Sequence[str], section: str) -> set[str]:
    """The keys of `section` that the config file or the overrides set explicitly (so a
    default from elsewhere, e.g. a policy's recorded env settings, may fill the others)."""
    data = read_config_file(path) or {}
    given = set((data.get(section) or {}) if isinstance(data, dict) else {})
    for argument in overrides:
        key = argument.partition("=")[0].split(".")
        if key[0] == section:
            given |= {key[1]} if len(key) > 1 else set()
    return given


# --- overrides ------------------------------------------------------------------------------
# A dotted key of identifiers, then "=" (the value may be anything, also empty).
OVERRIDE_PATTERN = re.compile(r"[A-Za-z_][\w-]*(?:\.[A-Za-z_0-9][\w-]*)*=")


def is_override(argument: str) -> bool:
    """Whether a command-line argument is a `dotted.key=value` override."""
    return OVERRIDE_PATTERN.match(argument) is not None


def parse_overrides(arguments: Sequence[str]) -> list[tuple[str, Any]]:
    """[(dotted key, value)] of `dotted.key=value` strings, each value read as the config
    files' YAML values are (trainers.config_yaml). Raises ValueError for an argument of
    another shape or a value that is not valid YAML."""
    parsed = []
    for argument in arguments:
        if not is_override(argument):
            raise ValueError(f"override {argument!r} is not dotted.key=value (e.g. "
                             "learner.lr=3e-4)")
        key, _, text = argument.partition("=")
        parsed.append((key, load_config_yaml(text, f"override {argument!r}")))
    return parsed


def config_keys(config_class: type, prefix: str = "") -> list[str]:
    """Every dotted key of a config dataclass, sections and leaves."""
    keys = []
    hints = typing.get_type_hints(config_class)
    for f in dataclasses.fields(config_class):
        key = prefix + f.name
        keys.append(key)
        if dataclasses.is_dataclass(hints[f.name]):
            keys.extend(config_keys(hints[f.name], key + "."))
    return keys


def _is_mapping_hint(hint: Any) -> bool:
    return hint is dict or typing.get_origin(hint) is dict


def check_override_key(config_class: type, key: str, value: Any) -> None:
    """Refuse a key the config does not have, naming the closest valid keys; refuse a value
    for a section, or a subkey of a plain value. Keys inside a free-form mapping field
    (e.g. algorithm.options) are left to the check of whoever reads the mapping."""
    section: Any = config_class
    parts = key.split(".")
    for index, part in enumerate(parts):
        here = ".".join(parts[: index + 1])
        hints = typing.get_type_hints(section)
        if part not in {f.name for f in dataclasses.fields(section)}:
            known = config_keys(config_class)
            known = [k for k in known if not key.startswith(k + ".")]  # not its own section
            close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
            close += [k for k in known if k.rsplit(".", 1)[-1] == parts[-1] and k not in close]
            hint = f"; did you mean {', '.join(close[:4])}?" if close else \
                f"; {'.'.join(parts[:index]) or 'the config'} has {', '.join(sorted(hints))}"
            raise ValueError(f"unknown key {key}{hint}")
        hint = hints[part]
        last = index == len(parts) - 1
        if dataclasses.is_dataclass(hint):
            if last and not isinstance(value, dict):
                raise ValueError(f"{here} is a section, not a value: set one of its keys "
                                 f"(e.g. {here}.{dataclasses.fields(hint)[0].name}=...)")
            section = hint
        elif not last:
            if _is_mapping_hint(hint):
                return  # a free-form mapping: its keys are checked where it is read
            raise ValueError(f"unknown key {key}: {here} is a value, not a section")


def _merge(base: Any, update: Any) -> Any:
    """`update` over `base`: mappings merge key by key, anything else replaces."""
    if isinstance(base, dict) and isinstance(update, dict):
        merged = dict(base)
        for key, value in update.items():
            merged[key] = _merge(base.get(key), value)
        return merged
    return update


def apply_overrides(config_class: type, data: Any, overrides: Sequence[str]) -> dict:
    """The config mapping `data` (a YAML file's, or {}) with the overrides merged in, each
    key checked against `config_class` first."""
    merged = {} if data is None else data
    if not isinstance(merged, dict):
        return merged  # from_dict says what is wrong with it
    for key, value in parse_overrides(overrides):
        check_override_key(config_class, key, value)
        update: Any = value
        for part in reversed(key.split(".")):
            update = {part: update}
        merged = _merge(merged, update)
    return merged


def config_with_overrides(config_class: type, data: Any, overrides: Sequence[str] = (),
                          where: str = "config") -> Any:
    """`from_dict(config_class, data)` after `apply_overrides`; an error caused by an
    override's value names the override."""
    merged = apply_overrides(config_class, data, overrides)
    try:
        return from_dict(config_class, merged, where=where)
    except ValueError as error:
        message = str(error)
        blamed = [item for item in overrides
                  if f"{where}.{item.partition('=')[0]} " in message + " "]
        if blamed:
            raise ValueError(f"{message} (set by the override {blamed[-1]!r})") from None
        raise


def config_to_yaml(config: Any) -> str:
    """The whole config as YAML, in field order (what `--print-config` prints)."""
    return yaml.safe_dump(config_to_dict(config), sort_keys=False, allow_unicode=True,
                          default_flow_style=False)


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


def check_env_keywords(env: dict[str, Any], where: str = "env") -> None:
    """Refuse what gym.make("DeepResearch-v0", **env) would refuse, without building it:
    a keyword it does not take (naming the closest ones), a value of the wrong type, a
    setting its validation refuses. Raises ValueError (one line)."""
    if not isinstance(env, dict):
        raise ValueError(f"{where} must be a mapping of DeepResearch-v0 arguments, got "
                         f"{env!r}")
    unknown = sorted(map(str, set(env) - set(_ENV_FIELDS)))
    if unknown:
        close = sorted({match for key in unknown
                        for match in difflib.get_close_matches(key, _ENV_FIELDS, n=3)})
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown {where} key(s) {unknown}: DeepResearch-v0 has no such "
                         f"argument{hint} (venus-gym env-help lists them)")
    from_dict(DeepResearchConfig, dict(env), where).validate()


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
