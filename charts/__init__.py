"""cdk8s charts: the Ray namespace, service account, code ConfigMap, RayCluster and RayJob,
all derived from the variable file (`python -m charts` is the cdk8s app; see cdk8s.yaml)."""

from charts.charts import (
    BASE_CHART,
    CLUSTER_CHART,
    JOB_CHART,
    Inputs,
    RayBaseChart,
    RayClusterChart,
    RayJobChart,
    build_app,
    inputs,
    manifests,
)
from charts.errors import ChartError

__all__ = [
    "BASE_CHART",
    "CLUSTER_CHART",
    "JOB_CHART",
    "ChartError",
    "Inputs",
    "RayBaseChart",
    "RayClusterChart",
    "RayJobChart",
    "build_app",
    "inputs",
    "manifests",
]
