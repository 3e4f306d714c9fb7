"""No function in `workloads/` runs longer than `LIMIT` lines of logic: a long one is split into named helpers.

Lines of logic: the body's lines that hold code, not counting blank lines, comment-only lines and the docstring.
A nested function counts within the one that holds it, and on its own.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

from tests.helpers import REPO

LIMIT = 60


def code_lines(source: str) -> set[int]:
    """The line numbers that hold a token other than a comment or a line break (continuation lines included)."""
    lines = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER, tokenize.ENCODING}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip:
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines


def logic_length(node: ast.FunctionDef | ast.AsyncFunctionDef, code: set[int]) -> int:
    """Lines of logic in `node`'s body (its docstring left out)."""
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    if not body:
        return 0
    first, last = body[0].lineno, max(n.end_lineno or n.lineno for n in body)
    first = min([first, *(d.lineno for n in body for d in getattr(n, "decorator_list", []))])
    return len([line for line in code if first <= line <= last])


def long_functions(root: Path, limit: int = LIMIT) -> list[str]:
    """`path:line name (N lines)` for each function under `root` with more than `limit` lines of logic."""
    found = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        code = code_lines(source)
        for node in ast.walk(ast.parse(source, str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = logic_length(node, code)
                if length > limit:
                    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
                    found.append(f"{where}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_the_count_leaves_out_docstrings_comments_and_blank_lines():
    source = 'def f():\n    """Doc.\n\n    more."""\n    # why\n\n    a = (1,\n         2)\n    return a\n'
    node = ast.parse(source).body[0]
    assert logic_length(node, code_lines(source)) == 3


def test_a_long_function_is_found(tmp_path):
    (tmp_path / "m.py").write_text("def f():\n" + "".join(f"    x{i} = {i}\n" for i in range(LIMIT + 1)))
    found = long_functions(tmp_path)
    assert len(found) == 1 and found[0].endswith(f"f ({LIMIT + 1} lines)")


def test_no_long_functions_in_workloads():
    assert long_functions(REPO / "workloads") == []
