"""The run's figures as Prometheus series, through Ray's metrics API (`ray.util.metrics`).

Each Ray node's metrics agent serves what the processes on it record (port 8080 in the cluster,
`ray start --metrics-export-port`), and Prometheus scrapes it (a PodMonitor; docs/observability.md).
Ray prefixes every name with `ray_`: `fsdp_loss` is queried as `ray_fsdp_loss`. Every series carries
the run name (`run_name`), so one dashboard tells runs apart; step time also carries the rank, for
stragglers. Rank 0 records the run's figures (the same values that go to metrics.jsonl, TensorBoard
and MLflow); every rank records its own step time.

Gauges, not counters: a report is a window average, and a gauge holds the last one until the next.
The series lives as long as the worker process: Ray's agent stops serving it when the process exits.
"""

from __future__ import annotations

import logging

from config.observability import METRIC_PREFIX, PLAN_METRIC, RANK_LABEL, RUN_NAME_LABEL

log = logging.getLogger("fsdp_finetune")

# Report key -> (gauge name without Ray's `ray_` prefix, description with the unit).
RUN_GAUGES = {
    "loss": (f"{METRIC_PREFIX}loss", "Training loss (mean token cross-entropy over the report window)."),
    "eval_loss": (f"{METRIC_PREFIX}eval_loss", "Held-out loss (mean token cross-entropy)."),
    "tokens_per_s": (f"{METRIC_PREFIX}tokens_per_second", "Training throughput of the whole job, tokens/s."),
    "mfu": (f"{METRIC_PREFIX}mfu", "Model FLOPs utilisation per GPU, 0..1 (GPU runs only)."),
    "step_time_s": (f"{METRIC_PREFIX}step_time_seconds", "Mean optimizer step time over the window, seconds."),
    "data_wait_s": (f"{METRIC_PREFIX}data_wait_seconds",
                    "Mean time per optimizer step spent waiting for the data loader, seconds."),
    "checkpoint_s": (f"{METRIC_PREFIX}checkpoint_seconds", "Time to write the last checkpoint locally, seconds."),
}
STEP_TIME_BY_RANK = (f"{METRIC_PREFIX}rank_step_time_seconds",
                     "Mean optimizer step time of this rank over the window, seconds (stragglers).")
PLAN_QUANTITIES = ("tokens_per_s", "mfu")
"""Keys of the plan's prediction exported as `PLAN_METRIC{quantity=...}`."""


class TrainingGauges:
    """This worker's gauges: the run's figures on rank 0, its own step time on every rank."""

    def __init__(self, run_name: str, *, rank: int, plan_prediction: dict | None = None):
        from ray.util.metrics import Gauge

        self.tags = {RUN_NAME_LABEL: run_name}
        self.rank_tags = {**self.tags, RANK_LABEL: str(rank)}
        self.step_time = Gauge(STEP_TIME_BY_RANK[0], description=STEP_TIME_BY_RANK[1],
                               tag_keys=(RUN_NAME_LABEL, RANK_LABEL))
        self.run: dict = {}
        # Held for the whole run: Ray stops exporting a metric once its Gauge object is garbage-collected.
        self.plan = None
        if rank != 0:
            return
        self.run = {key: Gauge(name, description=text, tag_keys=(RUN_NAME_LABEL,))
                    for key, (name, text) in RUN_GAUGES.items()}
        if plan_prediction:
            self.plan = Gauge(PLAN_METRIC, description="The plan's prediction (python -m workloads.plan), by "
                              "quantity.", tag_keys=(RUN_NAME_LABEL, "quantity"))
            for quantity in PLAN_QUANTITIES:
                if plan_prediction.get(quantity) is not None:
                    self.plan.set(float(plan_prediction[quantity]), tags={**self.tags, "quantity": quantity})

    def report(self, metrics: dict) -> None:
        """Set every gauge the report has a number for (MFU is None on CPU: left unset)."""
        if metrics.get("step_time_s") is not None:
            self.step_time.set(float(metrics["step_time_s"]), tags=self.rank_tags)
        for key, gauge in self.run.items():
            if isinstance(metrics.get(key), int | float):
                gauge.set(float(metrics[key]), tags=self.tags)


def training_gauges(run_name: str, *, rank: int, plan_prediction: dict | None = None) -> TrainingGauges | None:
    """The gauges, or None (one warning) where Ray's metrics cannot be recorded: training goes on without."""
    try:
        return TrainingGauges(run_name, rank=rank, plan_prediction=plan_prediction)
    except Exception as exc:  # noqa: BLE001 - metrics must not stop training
        log.warning("Prometheus metrics off for this run: %s: %s", type(exc).__name__, exc)
        return None
