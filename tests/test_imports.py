"""No import circles among the project's modules, and imports run one way: `config` knows nothing of
`workloads`, `stacks` or `charts` (found by reading the sources; one test runs `python -m config check`).

Every `import` counts, also one inside a function or under `TYPE_CHECKING`: a lazy import hides a
circle from Python but not from the reader, and makes the next top-level import a crash.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

PACKAGES = ("bench", "charts", "config", "stacks", "tests", "tools", "workloads")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (`from a import b` is `a.b` when that is a module, else `a`)."""
    mods = modules()
    graph = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names if alias.name in mods}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    targets.add(target if target in mods else base)
        graph[name] = (targets & mods.keys()) - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_the_known_edges():
    graph = import_graph()
    assert "stacks.nag" in graph["stacks.assembly"]
    assert "workloads.local_ray" in graph["workloads.preflight.runner"]
    assert "workloads.preflight" in graph["workloads.fsdp_finetune.cluster_job"]  # a lazy import, inside a function


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles():
    assert cycles(import_graph()) == []


# ---- one way: config knows nothing of the floors above it ------------------------------------------------

UPPER = ("workloads", "stacks", "charts")
_UPPER_PATH = re.compile(rf"^({'|'.join(UPPER)})([./]\w|$)")


def upward_imports(graph: dict[str, set[str]], package: str = "config") -> list[tuple[str, str]]:
    """(module, target) for each import from `package` into a floor above it."""
    return sorted((name, target) for name, targets in graph.items()
                  if name == package or name.startswith(f"{package}.")
                  for target in targets if target.split(".")[0] in UPPER)


def upward_references(source: str) -> list[str]:
    """String constants (docstrings aside) that name an upper package's file or module: a path part such as
    `"stacks"`, `"stacks/versions.py"` or a dotted name for `importlib` (how a file is read without an import)."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return sorted(node.value for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                  and _UPPER_PATH.match(node.value))


def test_upward_imports_are_found():
    graph = {"config.a": {"config.b", "workloads.fsdp_finetune.data"}, "config": {"stacks.versions"},
             "configure": {"charts.ray"}, "stacks.versions": {"config.versions"}}
    assert upward_imports(graph) == [("config", "stacks.versions"), ("config.a", "workloads.fsdp_finetune.data")]


def test_upward_file_reads_are_found():
    source = ('"""Reads stacks/versions.py."""\n'
              'VERSIONS = Path(__file__).parent.parent / "stacks" / "versions.py"\n'
              'OTHER = REPO / "charts/ray.py"\n'
              'mod = importlib.import_module("workloads.fsdp_finetune.data")\n'
              'note = "add it to stacks/versions.py"\n')
    assert upward_references(source) == ["charts/ray.py", "stacks", "workloads.fsdp_finetune.data"]


def test_config_imports_nothing_from_workloads_stacks_or_charts():
    graph = import_graph()
    assert "config.mesh" in graph["config.__main__"]  # the graph sees config's own edges
    assert upward_imports(graph) == []


def test_config_reads_no_file_of_workloads_stacks_or_charts():
    found = {path.name: refs for path in sorted((REPO / "config").rglob("*.py"))
             if (refs := upward_references(path.read_text()))}
    assert found == {}


def test_config_check_loads_no_module_of_the_floors_above():
    code = ("import sys; from config.__main__ import main; main(['check']); "
            f"print(sorted({{m for m in sys.modules if m.split('.')[0] in {UPPER!r}}}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "sharding hybrid" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "[]"


# ---- one way inside workloads: the driver floor of fsdp_finetune sits on top (its package docstring) --------

DRIVER_FLOOR = tuple(f"workloads.fsdp_finetune.{name}" for name in
                     ("run_plan", "settings", "trainer", "local_demo", "cluster_job", "launch", "__main__"))
DRIVER_ORDER = DRIVER_FLOOR[:-1]  # each may import the ones before it, never one after


def test_nothing_below_the_driver_floor_imports_it():
    graph = import_graph()
    below = [name for name in graph if name.startswith("workloads.")
             and name not in DRIVER_FLOOR and name != "workloads.preflight.__main__"]
    assert [(name, target) for name in below for target in graph[name] if target in DRIVER_FLOOR] == []


def test_the_driver_floor_imports_one_way():
    graph = import_graph()
    assert [(name, target) for i, name in enumerate(DRIVER_ORDER)
            for target in graph[name] if target in DRIVER_ORDER[i + 1:]] == []
