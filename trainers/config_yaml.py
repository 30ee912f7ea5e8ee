"""The one YAML reader of config files (`--config F`), `dotted.key=value` override values and
`--env KEY=VALUE` options, so a value means the same wherever it is written.

    read_config_file("run.yaml")              # the file's data, or a one-line error
    load_config_yaml("[1, 2]", "override x")  # one value, typed the same way

It is PyYAML's safe loader with three changes, the typing of OmegaConf's dotlist loader
(which the overrides used before they came here):

* numbers as YAML 1.2 reads them: `lr: 5e-5` is a float (YAML 1.1 reads a string);
* no timestamps: `date: 2025-01-01` is the string '2025-01-01' (the config fields holding
  dates are strings; a datetime.date was refused in the file while the override passed);
* aliases are bounded: a document whose aliases would expand past MAX_EXPANDED_NODES nodes,
  or refer to themselves, is refused before it is built (a 440-byte file of nested aliases
  expands to billions of nodes when the config is checked and printed). A document without
  aliases is never refused for its size: the file bounds it.

Tags stay the safe loader's: `!!python/...` is refused. Every failure (invalid YAML, a tab
indent, a bad tag, a directory, an unreadable file) is a ValueError of one line naming
where, with the line and column.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

# OmegaConf's default bound on alias expansion (its max_yaml_expanded_nodes): the bound the
# override values had, now that of the files too.
MAX_EXPANDED_NODES = 10_000


class ConfigLoader(yaml.SafeLoader):
    """yaml.SafeLoader with YAML 1.2 floats, no timestamps and bounded alias expansion."""

    def construct_document(self, node: yaml.Node) -> Any:
        expanded, unique = _node_counts(node)
        if expanded > MAX_EXPANDED_NODES and expanded > unique:
            raise yaml.constructor.ConstructorError(
                None, None, f"its aliases expand {unique} nodes to more than "
                f"{MAX_EXPANDED_NODES:,} (a config holds plain values: write them out)",
                node.start_mark)
        return super().construct_document(node)


# The float pattern of YAML 1.2 (OmegaConf's too): exponents without a dot are numbers.
ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?[0-9]+(?:_[0-9]+)*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                    |[-+]?[0-9]+(?:_[0-9]+)*(?:[eE][-+]?[0-9]+)
                    |\.[0-9]+(?:_[0-9]+)*(?:[eE][-+][0-9]+)?
                    |[-+]?[0-9]+(?:_[0-9]+)*(?::[0-5]?[0-9])+\.[0-9_]*
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))
ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in ConfigLoader.yaml_implicit_resolvers.items()}


def _node_counts(root: yaml.Node) -> tuple[int, int]:
    """(nodes once aliases are expanded, capped just past the bound; distinct nodes).
    Counted on the composed graph, where an alias is the node it names, so the work is
    that of the distinct nodes. Refuses an alias to a node that contains it."""
    expanded: dict[int, int] = {}
    open_nodes: set[int] = set()

    def count(node: yaml.Node) -> int:
        key = id(node)
        if key in expanded:
            return expanded[key]
        if key in open_nodes:
            raise yaml.constructor.ConstructorError(
                None, None, "an alias refers to a node that contains it", node.start_mark)
        open_nodes.add(key)
        total = 1
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        for child in children:
            total = min(total + count(child), MAX_EXPANDED_NODES + 1)
        open_nodes.discard(key)
        expanded[key] = total
        return total

    return count(root), len(expanded)


def _one_line(error: yaml.YAMLError, where: str) -> str:
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    problem = problem.replace("tag:yaml.org,2002:", "!!")
    if "'\\t'" in problem:
        problem += " (a tab: indent with spaces)"
    mark = getattr(error, "problem_mark", None)
    at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return f"{where} is not valid config YAML{at}: {problem}"


def load_config_yaml(text: str, where: str) -> Any:
    """The data of YAML `text`, read as config files are; `where` names it in errors.

    Raises:
        ValueError: invalid YAML, an unsafe tag, aliases expanding too far (one line).
    """
    try:
        return yaml.load(text, Loader=ConfigLoader)  # a SafeLoader: no Python objects
    except yaml.YAMLError as error:
        raise ValueError(_one_line(error, where)) from None
    except RecursionError:
        raise ValueError(f"{where} is not valid config YAML: nested too deeply") from None
    except ValueError as error:  # a constructor's, e.g. an integer of over 4,300 digits
        raise ValueError(f"{where} is not valid config YAML: {error}") from None


def read_config_file(path: str | Path) -> Any:
    """The data of the YAML config file `path` (load_config_yaml).

    Raises:
        FileNotFoundError: there is no such file.
        ValueError: a directory, unreadable, not UTF-8, or not valid config YAML.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"config file {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"config file {str(path)!r} is a directory, not a YAML "
                         "file") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"config file {str(path)!r} is not UTF-8 text (byte "
                         f"{error.start})") from None
    except OSError as error:  # too long a name, no permission, ...
        raise ValueError(f"config file {str(path)[:200]!r} cannot be read: "
                         f"{error.strerror or error}") from None
    return load_config_yaml(text, f"config file {str(path)!r}")


def parse_env_options(items: list[str] | None) -> dict[str, Any]:
    """{key: value} of `--env KEY=VALUE` options, each value read as a config value (a list
    becomes a tuple, as the env's keywords take them)."""
    options: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--env takes KEY=VALUE, got {item!r}")
        parsed = load_config_yaml(value, f"--env {item!r}")
        options[key.strip()] = tuple(parsed) if isinstance(parsed, list) else parsed
    return options
