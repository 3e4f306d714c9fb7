"""Loading the variable file: the one function `cdk synth`, `cdk8s synth`, the workload and
`python -m config check` all call, so they accept and refuse exactly the same files."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml
from pydantic import ValidationError

from config.model import ClusterConfig, Problem

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FILE = REPO_ROOT / "config" / "cluster.yaml"
ENV_VAR = "CLUSTER_CONFIG"


class ConfigError(Exception):
    """A variable file that cannot be used; `str()` gives one `FILE: path: message` line per problem."""

    def __init__(self, file: Path | str, problems: list[Problem]):
        self.file = str(file)
        self.problems = problems
        super().__init__("\n".join(f"{self.file}: {p.path}: {p.message}" for p in problems))


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
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(yaml)"
        reason = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(file, [Problem(path=where, message=f"malformed YAML: {reason}; fix the syntax")]) from None
    if data is None:
        raise ConfigError(file, [Problem(path="(file)", message="the file is empty; start from config/cluster.yaml")])
    if not isinstance(data, dict):
        raise ConfigError(file, [Problem(path="(file)", message=f"top level must be a mapping of sections, "
                                         f"not {type(data).__name__}; start from config/cluster.yaml")])
    try:
        config = ClusterConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(file, [_problem(e) for e in exc.errors()]) from None
    problems = config.cross_field_problems()
    if problems:
        raise ConfigError(file, problems)
    return config


def _problem(error: dict) -> Problem:
    path = ".".join(str(part) for part in error["loc"]) or "(file)"
    kind = error["type"]
    if kind == "extra_forbidden":
        message = "unknown key (typo?); see the field reference in README.md"
    elif kind == "missing":
        message = "required field is missing; add it (see config/cluster.yaml)"
    else:
        message = error["msg"].removeprefix("Value error, ")
        if "input" in error and not isinstance(error["input"], (dict, list)):
            message += f" (got {error['input']!r})"
    return Problem(path=path, message=message)


def load_or_exit(path: str | os.PathLike | None = None) -> ClusterConfig:
    """`load_config` for command-line entry points: on a bad file print the problems and exit 2."""
    try:
        return load_config(path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(2) from None
