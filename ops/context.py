"""The CDK context `cdk synth` gives `app.py` from cdk.json, for the apps built in-process.

The CLI reads cdk.json's `context` (the feature flags, among others) and hands it to the app; an `App` built
in Python (the tests, `python -m ops.check`) sees none of it unless given it. Without it the same stacks
synthesize differently from what `cdk deploy` sends (other resources, other ARNs), so every in-process `App`
comes from `new_app`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import aws_cdk as cdk

CDK_JSON = Path(__file__).resolve().parent.parent / "cdk.json"
"""The project's cdk.json (the repository root)."""


def cdk_json_context(cdk_json: Path = CDK_JSON) -> dict[str, Any]:
    """The `context` of a cdk.json."""
    return json.loads(Path(cdk_json).read_text()).get("context", {})


def new_app(*, cdk_json: Path = CDK_JSON, context: dict[str, Any] | None = None, **kwargs) -> cdk.App:
    """A CDK `App` with cdk.json's context, then `context` on top (as `cdk synth -c key=value` overrides
    cdk.json); `kwargs` go to `App` (e.g. `outdir`)."""
    import aws_cdk as cdk

    return cdk.App(context={**cdk_json_context(cdk_json), **(context or {})}, **kwargs)
