"""Variable files generated from the model and pushed to the edges of their types, and the verdict on each.

Used by tests/test_validation_property.py (a few fixed-seed examples) and bench/validation_fuzz.py (random
ones, counted). A strategy starts from the default file and mutates one to three fields, chosen by walking
`ClusterConfig`, to values at or just past each field's own bounds, lengths and enums, to the wrong type, or
to blanks. `verdict` runs `python -m config check` in-process; `deploys` builds an accepted file the way a
deploy would: the CDK app in process with cdk.json's context, cfn-lint over every template, and the cdk8s
charts through `charts.__main__.synthesize` (which validates every object against the CRDs and Kubernetes
schemas before writing).
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import traceback
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import yaml
from hypothesis import strategies as st
from pydantic import BaseModel

from config import DEFAULT_FILE, ClusterConfig

# Warnings cfn-lint may give on this project's templates, each for the reason in tests/test_stacks_compliance.py.
ACCEPTED_WARNINGS = {"W3005", "W3010"}


@dataclass(frozen=True)
class Leaf:
    """One scalar (or list-of-scalar) field: dotted path, annotation, and its pydantic FieldInfo."""

    path: tuple
    annotation: object
    field: object


def leaves(model: type[BaseModel] = ClusterConfig, prefix: tuple = ()) -> list[Leaf]:
    out = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        inner = typing.get_args(annotation)[0] if typing.get_origin(annotation) is list else annotation
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            # A list of sections: mutate its first element (the default file has one worker group).
            out += leaves(inner, prefix + ((name, 0) if inner is not annotation else (name,)))
        else:
            out.append(Leaf(prefix + (name,), annotation, field))
    return out


def _bounds(field) -> dict:
    found = {}
    for meta in field.metadata:
        for attr in ("ge", "gt", "le", "lt", "min_length", "max_length", "pattern"):
            if getattr(meta, attr, None) is not None:
                found[attr] = getattr(meta, attr)
    return found


def _kinds(annotation) -> list:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [k for a in typing.get_args(annotation) for k in _kinds(a)]
    return [annotation]


WRONG_TYPES = st.sampled_from([None, True, [], {}, "text", -1, 0, 2**31, 2**63, 1e308, -1e-308, "", " "])


def edge_values(leaf: Leaf) -> st.SearchStrategy:
    """Values at and just past the field's own limits, plus values of the wrong type."""
    bounds = _bounds(leaf.field)
    choices: list = []
    for kind in _kinds(leaf.annotation):
        origin = typing.get_origin(kind)
        if kind is bool:
            choices += [True, False, "yes", 1]
        elif origin is typing.Literal:
            values = list(typing.get_args(kind))
            choices += values + [str(values[0]).upper(), f"{values[0]}x"]
        elif kind is int or kind is float:
            step = 1 if kind is int else 1e-9
            for attr, sign in (("ge", 0), ("gt", 1), ("le", 0), ("lt", -1)):
                if attr in bounds:
                    edge = bounds[attr] + sign * step
                    choices += [edge, edge - step, edge + step]
            choices += [0, -1, 1, 2**31 - 1, 2**31]
            if kind is float:
                choices += [1e-12, 0.5, 1e300]
        elif kind is str:
            lo, hi = bounds.get("min_length", 0), bounds.get("max_length", 300)
            choices += ["", " ", "a", "a" * max(lo, 1), "a" * hi, "a" * (hi + 1), "A-b_c.d", "x y", "é", "-a",
                        "a-", "10.0.0.0/16", "s3://b/k", "1.34", "1.9"]
        elif origin is list:
            inner = typing.get_args(kind)[0]
            choices += [[], ["a"], ["10.0.0.0/8"], ["0.0.0.0/0"] * 41, ["not a cidr"], ["x==1"], ["torch==2"],
                        [1], [inner.__name__ if isinstance(inner, type) else "a"]]
        elif kind is type(None):
            choices.append(None)
    return st.one_of(st.sampled_from(choices), WRONG_TYPES) if choices else WRONG_TYPES


LEAVES = leaves()


@st.composite
def variable_files(draw, max_mutations: int = 3) -> tuple[dict, list[str]]:
    """(data, mutated dotted paths): the default file with 1..max_mutations fields set to edge values."""
    data = yaml.safe_load(DEFAULT_FILE.read_text())
    mutated = []
    for _ in range(draw(st.integers(1, max_mutations))):
        leaf = draw(st.sampled_from(LEAVES))
        value = draw(edge_values(leaf))
        node = data
        for key in leaf.path[:-1]:
            if isinstance(key, int):
                node = node[key]
            else:
                node = node.setdefault(key, {})
        node[leaf.path[-1]] = value
        mutated.append(".".join(map(str, leaf.path)))
    return data, mutated


@dataclass
class Verdict:
    code: int | None
    out: str
    err: str
    traceback: str | None


def verdict(path: Path) -> Verdict:
    """`python -m config check PATH` in process: exit code, stdout, stderr, and any traceback it raised."""
    from config.__main__ import main as config_main

    out, err = io.StringIO(), io.StringIO()
    trace = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = config_main(["check", str(path)])
        except SystemExit as exc:
            code = exc.code
        except Exception:  # noqa: BLE001 - the property is that there is none
            code, trace = None, traceback.format_exc()
    return Verdict(code, out.getvalue(), err.getvalue(), trace)


def refusal_problems(path: Path, result: Verdict) -> list[str]:
    """What is wrong with how a refusal was reported (exit 2, every line naming the file and a field)."""
    problems = []
    if result.traceback or "Traceback" in result.err:
        problems.append(f"traceback: {result.traceback or result.err}")
    if result.code != 2:
        problems.append(f"exit {result.code}, not 2")
    lines = [line for line in result.err.splitlines() if not line.startswith("note: ")]
    if not lines:
        problems.append("no problem line")
    for line in lines:
        parts = line.split(": ", 2)
        if len(parts) < 3 or parts[0] != str(path) or not parts[1] or parts[1].startswith("("):
            problems.append(f"line names no file and field: {line}")
    return problems


def write(data: dict, directory: Path, name: str = "cluster.yaml") -> Path:
    path = Path(directory) / name
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return path


def deploys(path: Path, workdir: Path) -> list[str]:
    """Build an accepted file as a deploy would; the problems found (empty: it synthesizes and lints clean)."""
    from cfnlint.api import ManualArgs, lint_file

    from charts.__main__ import synthesize
    from config import load_config
    from stacks import build

    config = load_config(path)
    problems = []
    outdir = Path(tempfile.mkdtemp(prefix="cdk-", dir=workdir))
    try:
        from ops.context import CDK_JSON, new_app

        # What tests.helpers.cdk_app gives the tests: cdk.json's context, as `cdk synth` reads it.
        app = new_app(cdk_json=CDK_JSON, outdir=str(outdir))
        build(app, config)
        app.synth()
    except Exception as exc:  # noqa: BLE001 - jsii raises a generic error
        return [f"cdk synth: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"]
    for template in sorted(outdir.glob("*.template.json")):
        for match in lint_file(template, config=ManualArgs(regions=[config.region])):
            rule = match.rule.id
            if rule.startswith("E") or (rule.startswith("W") and rule not in ACCEPTED_WARNINGS):
                problems.append(f"cfn-lint {template.name}: {rule} {match.message}")
    try:
        synthesize(config, path, Path(tempfile.mkdtemp(prefix="dist-", dir=workdir)) / "dist")
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - ChartError, a schema error, or an exit from a check
        problems.append(f"cdk8s synth: {exc}")
    return problems


