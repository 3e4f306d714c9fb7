"""Loading the variable file: the one function `cdk synth`, `cdk8s synth`, the workload and
`python -m config check` all call, so they accept and refuse exactly the same files."""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml
from pydantic import ValidationError

from config.errors import UserError, report
from config.hints import closest, did_you_mean, fields_at
from config.model import ClusterConfig, Problem
from config.yaml_source import Source, YamlProblem, number_as_written, parse, syntax_problem

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FILE = REPO_ROOT / "config" / "cluster.yaml"
ENV_VAR = "CLUSTER_CONFIG"


class ConfigError(UserError):
    """A variable file that cannot be used; `str()` gives one `FILE: path: message` line per problem."""

    def __init__(self, file: Path | str, problems: list[Problem], source: Source | None = None):
        self.problems = problems
        super().__init__("\n".join(f"{file}: {p.path}: {p.message}{_at(source, p.path)}" for p in problems))
        # Set after: the text above already names the file on every line, UserError would prefix only the first.
        self.file = str(file)
        self.field = problems[0].path if len(problems) == 1 else None


def _at(source: Source | None, dotted: str) -> str:
    """` (line L, column C)` of a dotted field path in the file, where the file has it or a parent of it."""
    if source is None or dotted.startswith("("):
        return ""
    path = tuple(int(p) if p.isdigit() else p for p in re.split(r"\.|\[(\d+)\]", dotted) if p)
    where = source.where(path)
    return f" (line {where.line}, column {where.column})" if where and path else ""


def resolve_path(path: str | os.PathLike | None = None) -> Path:
    """The file to load: the argument, else $CLUSTER_CONFIG, else config/cluster.yaml."""
    chosen = path or os.environ.get(ENV_VAR) or DEFAULT_FILE
    return Path(chosen)


def load_config(path: str | os.PathLike | None = None) -> ClusterConfig:
    """Read, parse and validate a variable file; raise `ConfigError` listing every problem."""
    file = resolve_path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(file, [Problem(path="(file)", message=f"cannot read: {exc.strerror}; "
                                         f"check the path or set {ENV_VAR}")]) from None
    try:
        source = parse(text)
    except yaml.YAMLError as exc:
        line, column, message = syntax_problem(text, exc)
        where = f"line {line}, column {column}" if line else "(yaml)"
        raise ConfigError(file, [Problem(path=where, message=message)]) from None
    except YamlProblem as exc:
        where = f"line {exc.where.line}, column {exc.where.column}"
        raise ConfigError(file, [Problem(path=where, message=exc.message)]) from None
    data = source.data
    if data is None:
        raise ConfigError(file, [Problem(path="(file)", message="the file is empty; start from config/cluster.yaml")])
    if not isinstance(data, dict):
        raise ConfigError(file, [Problem(path="(file)", message=f"top level must be a mapping of sections, "
                                         f"not {type(data).__name__}; start from config/cluster.yaml")])
    try:
        config = ClusterConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(file, _problems(exc.errors(), source), source) from None
    problems = config.cross_field_problems()
    if problems:
        raise ConfigError(file, problems, source)
    return config


def _problems(errors: list[dict], source: Source) -> list[Problem]:
    """One problem per mistake, the mistyped keys first.

    A mistyped required key makes pydantic report two errors: the field it meant is missing (reported first, at the
    section's line), and the typo is an unknown key. Read in that order the first line sends the user to add a field
    that is already in the file, so the two become one line at the typo: the unknown key and the field it meant. A
    mistyped key is listed before the other problems, which it often causes."""
    problems: list[Problem | None] = []
    typos: list[int] = []
    missing_at: dict[tuple, int] = {}
    for error in errors:
        loc = tuple(error["loc"])
        if error["type"] == "missing":
            missing_at[loc] = len(problems)
        elif error["type"] == "extra_forbidden":
            typos.append(len(problems))
        problems.append(_problem(error, source))
    for i in typos:
        error = errors[i]
        loc = tuple(error["loc"])
        meant = closest(str(loc[-1]), fields_at(ClusterConfig, loc[:-1]))
        j = missing_at.get(loc[:-1] + (meant,)) if meant else None
        if j is not None:
            problems[i] = Problem(path=problems[i].path,
                                  message=f"unknown key (did you mean '{meant}'? that required field is missing); "
                                          "see the field reference in docs/reference.md")
            problems[j] = None
    first = [problems[i] for i in typos]
    return first + [p for i, p in enumerate(problems) if p is not None and i not in typos]


def _problem(error: dict, source: Source) -> Problem:
    loc = tuple(error["loc"])
    path = ".".join(str(part) for part in loc) or "(file)"
    kind = error["type"]
    value = error.get("input")
    if kind == "extra_forbidden":
        hint = did_you_mean(str(loc[-1]), fields_at(ClusterConfig, loc[:-1]))
        message = f"unknown key{hint or ' (typo?)'}; see the field reference in docs/reference.md"
    elif kind == "missing":
        message = "required field is missing; add it (see config/cluster.yaml)"
    else:
        message = error["msg"].removeprefix("Value error, ")
        written = number_as_written(source.where(loc) if loc in source.places else None, value)
        if kind == "string_type" and written is not None:
            message = f"YAML reads {written} as the number {value!r}; put it in quotes: \"{written}\""
        elif "input" in error and not isinstance(value, (dict, list)):
            message += f" (got {value!r})"
            if kind == "literal_error" and isinstance(value, str):
                message += did_you_mean(value, re.findall(r"'([^']*)'", error.get("ctx", {}).get("expected", "")))
    return Problem(path=path, message=message)


def load_or_exit(path: str | os.PathLike | None = None) -> ClusterConfig:
    """`load_config` for entry points not (yet) run through `run_cli`: on a bad file print the problems (through
    `report`, the one printer) and exit 2. Under `run_cli`, `load_config`'s `ConfigError` does the same."""
    try:
        return load_config(path)
    except ConfigError as exc:
        raise SystemExit(report(exc)) from None
