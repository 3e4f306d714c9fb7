"""cdk8s charts: the Ray namespace, service account, code ConfigMap, RayCluster and RayJob,
all derived from the variable file (`python -m charts` is the cdk8s app; see cdk8s.yaml).

Only cdk8s charts, the constructs and builders they are made of, and what they put into manifests (dashboards,
annotations, the code bundle, the KubeRay CRDs they validate against) live here; commands that use them are in
`ops/`. May import `config`, `tools` (pins) and `workloads` (what the pods run); never `stacks` or anything above.

The chart classes load lazily (PEP 562): importing cdk8s starts jsii's Node process (about 2 s), which
`python -m ops.scan` and the tests that read one chart module do not need.
"""

from __future__ import annotations

import importlib

from charts.errors import ChartError

_FROM_CHARTS = ("BASE_CHART", "CLUSTER_CHART", "DASHBOARDS_CHART", "JOB_CHART", "Inputs", "RayBaseChart",
                "RayClusterChart", "RayJobChart", "build_app", "inputs", "manifests")

__all__ = ["ChartError", *_FROM_CHARTS]


def __getattr__(name: str):
    if name in _FROM_CHARTS:
        return getattr(importlib.import_module("charts.charts"), name)
    raise AttributeError(f"module 'charts' has no attribute {name!r}")
