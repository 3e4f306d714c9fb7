"""AWS CDK stacks: network, EKS cluster with EFA GPU node groups, checkpoint storage.

Only CDK constructs and stacks live here (`app.py` is the CDK app); commands and analyses built on them are in
`ops/`. May import `config` and `tools` (pinned chart versions); never `charts`, `workloads` or anything above.

The stack classes load lazily (PEP 562): importing aws_cdk starts jsii's Node process, which
`python -m ops.check --help` does not need.
"""

from __future__ import annotations

import importlib

__all__ = ["ProjectStacks", "build", "stack_names"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module("stacks.assembly"), name)
    raise AttributeError(f"module 'stacks' has no attribute {name!r}")
