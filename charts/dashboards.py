"""Grafana dashboards as code: the run overview, and Ray's own dashboards for the installed Ray version.

`python -m charts.dashboards` rewrites the JSON files under charts/dashboards/ (the test suite fails
when they differ from what this module and the installed Ray generate). `charts.monitoring` puts each
file in a ConfigMap that Grafana's dashboard sidecar loads (kube-prometheus-stack).

The overview's panels, their PromQL, and which metric each needs are in `OVERVIEW_PANELS`; the local
scrape test evaluates every query against a real Prometheus scraping a real Ray Train run. `$run_name`
is the dashboard's run selector; `$__rate_interval` is Grafana's rate window.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from config.errors import run_cli
from config.observability import EFA_METRIC, PLAN_METRIC, RANK_LABEL, RUN_NAME_LABEL
from workloads.fsdp_finetune.prometheus import RUN_GAUGES, STEP_TIME_BY_RANK

DASHBOARD_DIR = Path(__file__).resolve().parent / "dashboards"
OVERVIEW_FILE = DASHBOARD_DIR / "overview.json"
RAY_DASHBOARDS = {"ray-default.json": "generate_default_grafana_dashboard",
                  "ray-train.json": "generate_train_grafana_dashboard"}
"""Ray's dashboards, by file: the generator in ray.dashboard.modules.metrics.grafana_dashboard_factory (what
Ray writes into its session dir, metrics/grafana/dashboards, for its version)."""
OVERVIEW_UID = "fsdp-run-overview"
RUN = f'{RUN_NAME_LABEL}=~"$run_name"'


def ray_metric(name: str) -> str:
    """The Prometheus name of a `ray.util.metrics` metric: Ray's exporter prefixes `ray_`."""
    return f"ray_{name}"


@dataclass(frozen=True, kw_only=True)
class Target:
    """One query of a panel: PromQL and its legend."""

    expr: str
    legend: str
    needs: str
    """The metric the query needs (named in the test for the GPU and EFA panels, which have no local data)."""
    source: str = "ray"
    """Where the series come from: ray (the training job, via Ray's metrics agent), gpu (dcgm-exporter on a GPU
    node; MFU too, which is null without a GPU peak) or efa (node exporter's EFA sidecar on an EFA node)."""


@dataclass(frozen=True, kw_only=True)
class Panel:
    title: str
    unit: str
    targets: list[Target] = field(default_factory=list)
    description: str = ""


def _g(key: str) -> str:
    return ray_metric(RUN_GAUGES[key][0])


_PLAN = ray_metric(PLAN_METRIC)

OVERVIEW_PANELS = [
    Panel(title="Tokens/s: measured and the plan's prediction", unit="short",
          description="Whole-job training throughput (rank 0's window average) against `python -m workloads.plan`.",
          targets=[Target(expr=f"{_g('tokens_per_s')}{{{RUN}}}", legend="measured", needs=_g("tokens_per_s")),
                   Target(expr=f'{_PLAN}{{{RUN},quantity="tokens_per_s"}}', legend="plan", needs=_PLAN)]),
    Panel(title="MFU: measured and the plan's prediction", unit="percentunit",
          description="Model FLOPs utilisation per GPU (PaLM accounting, workloads/fsdp_finetune/metrics.py).",
          targets=[Target(expr=f"{_g('mfu')}{{{RUN}}}", legend="measured", needs=_g("mfu"), source="gpu"),
                   Target(expr=f'{_PLAN}{{{RUN},quantity="mfu"}}', legend="plan", needs=_PLAN)]),
    Panel(title="GPU utilisation per GPU", unit="percent",
          description="dcgm-exporter (DCGM_FI_DEV_GPU_UTIL), per node and GPU.",
          targets=[Target(expr="max by (Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL)", legend="{{Hostname}} GPU {{gpu}}",
                          needs="DCGM_FI_DEV_GPU_UTIL", source="gpu")]),
    Panel(title="GPU memory used per GPU", unit="decmbytes",
          description="dcgm-exporter (DCGM_FI_DEV_FB_USED, MiB), per node and GPU.",
          targets=[Target(expr="max by (Hostname, gpu) (DCGM_FI_DEV_FB_USED)", legend="{{Hostname}} GPU {{gpu}}",
                          needs="DCGM_FI_DEV_FB_USED", source="gpu")]),
    Panel(title="EFA bytes per node", unit="Bps",
          description="Bytes/s through the node's EFA devices (their hw_counters tx_bytes / rx_bytes), written by "
                      "node exporter's EFA sidecar; docs/observability.md says why not node exporter's infiniband "
                      "collector.",
          targets=[Target(expr=f'sum by (instance) (rate({EFA_METRIC}{{counter="tx_bytes"}}[$__rate_interval]))',
                          legend="{{instance}} sent", needs=EFA_METRIC, source="efa"),
                   Target(expr=f'sum by (instance) (rate({EFA_METRIC}{{counter="rx_bytes"}}[$__rate_interval]))',
                          legend="{{instance}} received", needs=EFA_METRIC, source="efa")]),
    Panel(title="Step time per rank", unit="s",
          description="Each rank's mean optimizer step time over the report window: a straggler stands out.",
          targets=[Target(expr=f"{ray_metric(STEP_TIME_BY_RANK[0])}{{{RUN}}}", legend=f"rank {{{{{RANK_LABEL}}}}}",
                          needs=ray_metric(STEP_TIME_BY_RANK[0]))]),
    Panel(title="Loss and held-out loss", unit="short",
          targets=[Target(expr=f"{_g('loss')}{{{RUN}}}", legend="training loss", needs=_g("loss")),
                   Target(expr=f"{_g('eval_loss')}{{{RUN}}}", legend="held-out loss", needs=_g("eval_loss"))]),
    Panel(title="Data-loader wait and checkpoint time", unit="s",
          targets=[Target(expr=f"{_g('data_wait_s')}{{{RUN}}}", legend="data wait per step",
                          needs=_g("data_wait_s")),
                   Target(expr=f"{_g('checkpoint_s')}{{{RUN}}}", legend="last checkpoint write",
                          needs=_g("checkpoint_s"))]),
]


def overview_dashboard() -> dict:
    """The run overview as Grafana dashboard JSON (schema of Grafana 10+; the stack runs Grafana 13)."""
    panels = []
    for i, panel in enumerate(OVERVIEW_PANELS):
        panels.append({
            "id": i + 1,
            "type": "timeseries",
            "title": panel.title,
            "description": panel.description,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "none"}},
            "targets": [{"datasource": {"type": "prometheus", "uid": "${datasource}"}, "expr": t.expr,
                         "legendFormat": t.legend, "refId": chr(ord("A") + j)}
                        for j, t in enumerate(panel.targets)],
        })
    return {
        "uid": OVERVIEW_UID,
        "title": "Fine-tuning run overview",
        "tags": ["ray", "fsdp"],
        "timezone": "browser",
        "schemaVersion": 39,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Data source"},
            {"name": "run_name", "label": "Run", "type": "query",
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": {"query": f"label_values({_g('loss')}, {RUN_NAME_LABEL})", "refId": "run_name"},
             "definition": f"label_values({_g('loss')}, {RUN_NAME_LABEL})", "refresh": 2, "multi": False,
             "includeAll": False},
        ]},
        "panels": panels,
    }


def ray_dashboard(generator: str) -> dict:
    """One of Ray's dashboards as the installed Ray generates it (uid and filters at their defaults)."""
    from ray.dashboard.modules.metrics import grafana_dashboard_factory

    content, _uid = getattr(grafana_dashboard_factory, generator)()
    return json.loads(content)


def dashboards() -> dict[str, dict]:
    """Every dashboard file's content, by file name."""
    return {OVERVIEW_FILE.name: overview_dashboard(),
            **{name: ray_dashboard(generator) for name, generator in RAY_DASHBOARDS.items()}}


def render(dashboard: dict) -> str:
    return json.dumps(dashboard, indent=1, sort_keys=True) + "\n"


def plot_overview(query_range, *, run_name: str, start: float, end: float, path: Path) -> Path:
    """The overview's panels drawn with matplotlib from Prometheus data (no Grafana offline): `query_range(expr,
    start=, end=)` returns Prometheus' range-query result; panels with no data say which metric they need."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = (len(OVERVIEW_PANELS) + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(13, 3.2 * rows), dpi=90)
    for ax, panel in zip(axes.flat, OVERVIEW_PANELS, strict=False):
        drawn = False
        for target in panel.targets:
            expr = target.expr.replace("$run_name", run_name).replace("$__rate_interval", "1m")
            for series in query_range(expr, start=start, end=end):
                times = [float(t) - start for t, _ in series["values"]]
                labels = series["metric"]
                legend = re.sub(r"\{\{(\w+)\}\}", lambda m, labels=labels: labels.get(m.group(1), ""), target.legend)
                ax.step(times, [float(v) for _, v in series["values"]], where="post", label=legend)
                drawn = True
        if not drawn:
            missing = ", ".join(sorted({t.needs for t in panel.targets}))
            ax.text(0.5, 0.5, f"no data locally (needs {missing})", ha="center", va="center",
                    transform=ax.transAxes, fontsize=8, color="gray")
        else:
            ax.legend(fontsize=7, loc="best")
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel("seconds since the run started", fontsize=7)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Fine-tuning run overview: {run_name} (local run, Prometheus 2.42 range queries)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def main(argv: list[str] | None = None) -> int:
    """Rewrite every dashboard file under charts/dashboards/."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m charts.dashboards",
                                     description="Rewrite the Grafana dashboards under charts/dashboards/ (the run "
                                                 "overview, and Ray's own for the installed Ray version).")
    parser.parse_args(argv)
    DASHBOARD_DIR.mkdir(exist_ok=True)
    for name, dashboard in dashboards().items():
        (DASHBOARD_DIR / name).write_text(render(dashboard))
        print(f"wrote {DASHBOARD_DIR / name}")
    return 0


if __name__ == "__main__":
    run_cli(main)
