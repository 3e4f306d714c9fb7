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


# ---- syntax errors in words ------------------------------------------------------------------------------------
# PyYAML's scanner and parser name the token they did not expect ("expected <block end>, but found '<block mapping
# start>'"); a newcomer needs the line and what to change. The messages matched below are PyYAML 6.0.3's
# (yaml/scanner.py and yaml/parser.py); an unmatched one keeps PyYAML's own words.

def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _code(line: str) -> str:
    """The line as written, without its comment."""
    return line.split(" #", 1)[0].rstrip()


def _content_lines(lines: list[str], before: int) -> list[int]:
    """0-based indexes of the non-blank, non-comment lines before `before`, nearest first."""
    return [i for i in range(min(before, len(lines)) - 1, -1, -1)
            if lines[i].strip() and not lines[i].lstrip().startswith("#")]


def syntax_problem(text: str, exc: yaml.YAMLError) -> tuple[int | None, int | None, str]:
    """(1-based line, column, message with the likely fix) for a YAML syntax error in `text`."""
    mark = getattr(exc, "problem_mark", None)
    reason = getattr(exc, "problem", None) or str(exc)
    if mark is None:
        return None, None, f"malformed YAML: {reason}; fix the syntax"
    lines = text.splitlines()
    row, column = mark.line, mark.column
    shown = lines[row] if row < len(lines) else ""
    quote = f": `{_code(shown)}`" if shown.strip() else ""
    if "'\\t'" in reason or "\t" in shown[: len(shown) - len(shown.lstrip())]:
        return row + 1, column + 1, (f"a tab in the indentation{quote}. YAML indents with spaces only: replace the "
                                     "tab with spaces (this file uses 2 per level)")
    if "could not find expected ':'" in reason:
        for i in _content_lines(lines, row + 1):
            body = lines[i].split(" #", 1)[0]
            if ":" not in body and not body.lstrip().startswith("- "):
                return i + 1, _indent(lines[i]) + 1, (f"a missing colon: `{_code(lines[i])}`. Write `key: value` "
                                                      "(a colon and a space after the key)")
    if "expected <block end>" in reason or "did not find expected key" in reason or \
            "mapping values are not allowed" in reason:
        earlier = _content_lines(lines, row)
        if earlier and "mapping values are not allowed" not in reason:
            # PyYAML stops on the line after a mis-indented key when that key went deeper than its section: of the
            # two, blame the one off the file's 2-space grid.
            bad = earlier[0] if _indent(lines[earlier[0]]) % 2 and not _indent(shown) % 2 else row
            others = _content_lines(lines, bad)[:8]
            siblings = sorted({_indent(lines[i]) for i in others})
            return bad + 1, _indent(lines[bad]) + 1, (
                f"wrong indentation: `{_code(lines[bad])}` is indented {_indent(lines[bad])} spaces. Indent a key "
                f"like the other keys of its section (the lines above use {', '.join(map(str, siblings))} spaces; 2 "
                "more for each level)")
        return row + 1, column + 1, (f"a value with a colon in it, or a key indented under a value{quote}. Quote a "
                                     "value that contains ': ' (\"a: b\"), or indent the key like its siblings")
    return row + 1, column + 1, f"malformed YAML: {reason}{quote}; fix the syntax"
