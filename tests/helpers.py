"""Shared test helpers: variable-file variants written to disk, so tests go through the real loader; the CDK
`App` built in-process with the context `cdk synth` gives it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from config import DEFAULT_FILE, ClusterConfig, load_config
from ops.context import CDK_JSON

if TYPE_CHECKING:
    import aws_cdk as cdk

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "config" / "examples"


def merge(base: dict, overrides: dict) -> dict:
    """Deep-merge `overrides` into a copy of `base`; a list or scalar replaces what was there."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def default_data() -> dict[str, Any]:
    """The default variable file as plain data."""
    return yaml.safe_load(DEFAULT_FILE.read_text())


def write_variant(directory: Path, overrides: dict | None = None, *, base: Path = DEFAULT_FILE,
                  name: str = "cluster.yaml", group: dict | None = None) -> Path:
    """Write `base` with `overrides` (and `group` merged into worker group 0) to `directory/name`."""
    data = merge(yaml.safe_load(base.read_text()), overrides or {})
    if group:
        data["cluster"]["worker_groups"][0] = merge(data["cluster"]["worker_groups"][0], group)
    path = Path(directory) / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def load_variant(directory: Path, overrides: dict | None = None, **kwargs) -> ClusterConfig:
    """`write_variant`, then load it through the real loader."""
    return load_config(write_variant(directory, overrides, **kwargs))


def cdk_app(*, cdk_json: Path = CDK_JSON, context: dict[str, Any] | None = None, **kwargs) -> cdk.App:
    """A CDK `App` that sees what `cdk synth` would give `app.py`: cdk.json's context, then `context` on top (as
    `-c key=value` overrides cdk.json), through the project's own `ops.context.new_app`. Every in-process
    synthesis in the tests goes through here, so a flag changed in cdk.json changes what they test."""
    from ops.context import new_app

    return new_app(cdk_json=cdk_json, context=context, **kwargs)
