"""No import circles among the project's modules, and imports run one way between the top-level folders (the
floors in `MAY_IMPORT`, drawn in docs/architecture.md): `config` knows nothing of the others (found by reading the
sources; one test runs `python -m config check`), and no folder imports one above it.

Every `import` counts, also one inside a function or under `TYPE_CHECKING`: a lazy import hides a
circle from Python but not from the reader, and makes the next top-level import a crash.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

# The floors, bottom up: each top-level folder and the folders it may import. `harness` (shared by the benches and
# the tests) is imported by `bench` and `tests` only; `bench` and `tests` never import each other.
_BELOW_OPS = {"config", "tools", "workloads", "charts", "stacks"}
MAY_IMPORT = {
    "config": set(),
    "tools": {"config"},
    "workloads": {"config"},
    "charts": {"config", "tools", "workloads"},
    "stacks": {"config", "tools"},
    "ops": _BELOW_OPS,
    "harness": _BELOW_OPS | {"ops"},
    "bench": _BELOW_OPS | {"ops", "harness"},
    "tests": _BELOW_OPS | {"ops", "harness"},
}
PACKAGES = tuple(sorted(name for name in MAY_IMPORT if (REPO / name / "__init__.py").exists()))


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


@functools.cache  # one parse of every source per session (the tests only read it): 8 s of `make check` otherwise
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


# ---- tests and bench share harness/, never each other ----------------------------------------------------

def crossings(graph: dict[str, set[str]], package: str, forbidden: set[str]) -> list[tuple[str, str]]:
    """(module, target) for each import from `package` into one of the `forbidden` packages."""
    return sorted((name, target) for name, targets in graph.items() if name.split(".")[0] == package
                  for target in targets if target.split(".")[0] in forbidden)


def test_crossings_are_found():
    graph = {"bench.a": {"tests.loopback", "harness.loopback"}, "tests.b": {"harness.dcgm"}, "harness.c": set()}
    assert crossings(graph, "bench", {"tests"}) == [("bench.a", "tests.loopback")]
    assert crossings(graph, "tests", {"bench"}) == []


def test_bench_and_tests_import_only_harness_of_each_other():
    graph = import_graph()
    # The graph sees both sides' edges into harness, lazy imports included.
    assert "harness.loopback" in graph["bench.failure_times"] and "harness.mesh_steps" in graph["tests.test_topology"]
    assert crossings(graph, "bench", {"tests"}) == []
    assert crossings(graph, "tests", {"bench"}) == []
    assert crossings(graph, "harness", {"tests", "bench"}) == []


# ---- one way: config knows nothing of the floors above it ------------------------------------------------

UPPER = ("workloads", "stacks", "charts", "ops")
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


# ---- one way between all top-level folders -----------------------------------------------------------------------

def floor_violations(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, target) for each import across top-level folders that `MAY_IMPORT` does not allow."""
    return sorted((name, target) for name, targets in graph.items() for target in targets
                  if (src := name.split(".")[0]) != (dst := target.split(".")[0])
                  and dst not in MAY_IMPORT.get(src, set()))


def test_floor_violations_are_found():
    graph = {"charts.ray": {"config.k8s", "stacks.versions"}, "tools.pins": {"ops.check"},
             "stacks.cluster": {"tools.pins"}, "harness.x": {"tests.helpers"}, "tests.a": {"bench.newcomer"},
             "bench.new": {"tests.loopback"}, "unknown.mod": {"config"}}
    assert floor_violations(graph) == [("bench.new", "tests.loopback"), ("charts.ray", "stacks.versions"),
                                       ("harness.x", "tests.helpers"), ("tests.a", "bench.newcomer"),
                                       ("tools.pins", "ops.check"), ("unknown.mod", "config")]


def test_the_floors_form_no_circle():
    graph = {name: set(allowed) for name, allowed in MAY_IMPORT.items()}
    assert cycles(graph) == []
    assert all(name not in allowed for name, allowed in MAY_IMPORT.items())


def test_every_top_level_package_has_a_floor():
    found = {path.parent.name for path in REPO.glob("*/__init__.py")}
    assert found - MAY_IMPORT.keys() == set(), "add the new folder to MAY_IMPORT and docs/architecture.md"
    assert {"bench", "charts", "config", "ops", "stacks", "tests", "tools", "workloads"} <= set(PACKAGES)


def test_every_top_level_package_says_what_it_may_import():
    for package in PACKAGES:
        doc = ast.get_docstring(ast.parse((REPO / package / "__init__.py").read_text()))
        assert doc, f"{package}/__init__.py: no docstring"


def test_imports_run_one_way_between_all_top_level_folders():
    graph = import_graph()
    assert "ops.replacements" in graph["ops.check"] and "tools.crds" in graph["charts.validation"]
    assert floor_violations(graph) == []


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
