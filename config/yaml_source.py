"""Reading the variable file's YAML so that nothing is lost silently and every error can point at a line.

PyYAML's `safe_load` keeps the last of two equal keys without a word and turns `.inf`/`.nan` into floats;
`1.30` becomes the number 1.3 before any model sees it. This module composes the node tree first
(`yaml.SafeLoader.get_single_node`), refuses duplicate keys and non-finite numbers there, and keeps each
value's line, column and source text, then constructs the same data `safe_load` would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import yaml

Path = tuple[str | int, ...]

_FLOAT_TAG = "tag:yaml.org,2002:float"
_INT_TAG = "tag:yaml.org,2002:int"


@dataclass(frozen=True)
class Where:
    """A value's place in the file: 1-based line and column, and its text as written (plain scalars only)."""

    line: int
    column: int
    text: str | None = None


@dataclass
class Source:
    """Parsed YAML plus where each value came from, by path (`("cluster", "worker_groups", 0, "nodes")`)."""

    data: Any
    places: dict[Path, Where] = field(default_factory=dict)

    def where(self, path: Path) -> Where | None:
        """The place of `path`, else of its nearest parent that has one (a missing key points at its section)."""
        for end in range(len(path), -1, -1):
            found = self.places.get(tuple(path[:end]))
            if found:
                return found
        return None


class YamlProblem(Exception):
    """Something in the YAML itself that the file must not contain."""

    def __init__(self, where: Where, message: str):
        self.where = where
        self.message = message
        super().__init__(f"line {where.line}, column {where.column}: {message}")


def parse(text: str) -> Source:
    """Parse one YAML document; raise `yaml.YAMLError` for bad syntax and `YamlProblem` for duplicate keys
    or non-finite numbers."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return Source(data=None)
        places: dict[Path, Where] = {(): _where(node)}
        _walk(node, (), places)
        return Source(data=loader.construct_document(node), places=places)
    finally:
        loader.dispose()


def _where(node: yaml.Node, *, key: yaml.Node | None = None) -> Where:
    mark = (key or node).start_mark
    text = node.value if isinstance(node, yaml.ScalarNode) and node.style is None else None
    return Where(line=mark.line + 1, column=mark.column + 1, text=text)


def _walk(node: yaml.Node, path: Path, places: dict[Path, Where]) -> None:
    if isinstance(node, yaml.MappingNode):
        first: dict[Any, Where] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.value)
            here = _where(value_node, key=key_node)
            if key in first:
                raise YamlProblem(here, f"duplicate key '{key}' (first at line {first[key].line}); YAML would keep "
                                        "only the last one: remove one of them")
            first[key] = here
            places[(*path, key)] = Where(here.line, here.column, _where(value_node).text)
            _walk(value_node, (*path, key), places)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            places[(*path, index)] = _where(item)
            _walk(item, (*path, index), places)
    elif isinstance(node, yaml.ScalarNode) and node.tag == _FLOAT_TAG and node.style is None:
        number = yaml.SafeLoader.construct_yaml_float(yaml.SafeLoader(""), node)
        if not math.isfinite(number):
            raise YamlProblem(_where(node), f"'{node.value}' is not a finite number; write a number")


def number_as_written(where: Where | None, value: Any) -> str | None:
    """The source text of a plain scalar that YAML read as a number, when it differs from str(value)
    (`1.30` read as 1.3), for the hint to quote it."""
    if where is None or where.text is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return where.text
