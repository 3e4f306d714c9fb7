"""The run's figures as Prometheus series, through Ray's metrics API (`ray.util.metrics`).

Each Ray node's metrics agent serves what the processes on it record (port 8080 in the cluster,
`ray start --metrics-export-port`), and Prometheus scrapes it (a PodMonitor; docs/observability.md).
Ray prefixes every name with `ray_`: `fsdp_loss` is queried as `ray_fsdp_loss`. Every series carries
the run name (`run_name`), so one dashboard tells runs apart; step time also carries the rank, for
stragglers. Rank 0 records the run's figures (the same values that go to metrics.jsonl, TensorBoard
and MLflow); every rank records its own step time.

Gauges, not counters: a report is a window average, and a gauge holds the last one until the next.
Ray 2.58 forgets a gauge value that is not set again within two export intervals (its metrics agent
evicts it: ray/_private/telemetry/open_telemetry_metric_recorder.py, `_resolve_gauge_ttl_seconds`;
measured: a value set once is gone after about 2 s at a 1 s interval), and reports come a minute apart
on the cluster; so a background thread sets every last value again each `REFRESH_S` until `close()`.
The series ends with the run (or the worker process).

The final report comes just before training ends, and the values reach Prometheus only through the agent's next
export and Prometheus' next scrape after it: a short run (or a fast export of the model) could end, and the
series with it, before any scrape saw them. So `close(scrape_interval_s=...)` keeps them set until one export
interval plus one scrape interval (plus a refresh) after the last report: the agent then holds them for a whole
scrape interval, and a scrape sees them. Bounded: about 26 s on the cluster (15 s scrapes, Ray's 10 s exports),
counted from the last report, so the model's export already covers part of it.
"""

from __future__ import annotations

import logging
import threading
import time

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
REFRESH_S = 1.0
"""Seconds between re-settings of the last values: under Ray's shortest export interval (1 s, so under the 2 s a
value survives unrefreshed)."""
DEFAULT_EXPORT_INTERVAL_MS = 10_000
"""Ray's default `metrics_report_interval_ms` (src/ray/common/ray_config_def.h, Ray 2.58), where its config cannot
be read."""


def export_interval_s() -> float:
    """Seconds between this process's exports to its node's metrics agent (`RAY_metrics_report_interval_ms`), as
    Ray's config in this process says (ray/includes/ray_config.pxd `metrics_report_interval_ms`, Ray 2.58)."""
    try:
        from ray._raylet import Config

        return Config.metrics_report_interval_ms() / 1000
    except Exception:  # noqa: BLE001 - a private API: fall back to Ray's default
        return DEFAULT_EXPORT_INTERVAL_MS / 1000


def hold_seconds(scrape_interval_s: float | None, export_s: float) -> float:
    """How long after the last report its values must stay set for a scrape to see them: the agent has them within
    one export, then holds them for a whole scrape interval (0 when nothing scrapes them)."""
    return 0.0 if not scrape_interval_s else export_s + scrape_interval_s + REFRESH_S


class TrainingGauges:
    """This worker's gauges: the run's figures on rank 0, its own step time on every rank."""

    def __init__(self, run_name: str, *, rank: int, plan_prediction: dict | None = None):
        from ray.util.metrics import Gauge

        self._values: dict[tuple[str, tuple], tuple] = {}  # (metric, tags) -> (gauge, value, tags dict)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.tags = {RUN_NAME_LABEL: run_name}
        self.rank_tags = {**self.tags, RANK_LABEL: str(rank)}
        self.step_time = Gauge(STEP_TIME_BY_RANK[0], description=STEP_TIME_BY_RANK[1],
                               tag_keys=(RUN_NAME_LABEL, RANK_LABEL))
        self.run: dict = {}
        # The plan's prediction, set once; the refresher keeps it alive for the whole run.
        self.plan = None
        self._last_set = time.monotonic()
        self._thread = threading.Thread(target=self._refresh, name="prometheus-gauges", daemon=True)
        if rank == 0:
            self._rank0_gauges(plan_prediction)
        self._thread.start()

    def _rank0_gauges(self, plan_prediction: dict | None) -> None:
        from ray.util.metrics import Gauge

        self.run = {key: Gauge(name, description=text, tag_keys=(RUN_NAME_LABEL,))
                    for key, (name, text) in RUN_GAUGES.items()}
        if plan_prediction:
            self.plan = Gauge(PLAN_METRIC, description="The plan's prediction (python -m workloads.plan), by "
                              "quantity.", tag_keys=(RUN_NAME_LABEL, "quantity"))
            for quantity in PLAN_QUANTITIES:
                if plan_prediction.get(quantity) is not None:
                    self._set(self.plan, float(plan_prediction[quantity]), {**self.tags, "quantity": quantity})

    def _set(self, gauge, value: float, tags: dict) -> None:
        with self._lock:
            self._values[(gauge.info["name"], tuple(sorted(tags.items())))] = (gauge, value, tags)
            self._last_set = time.monotonic()
        gauge.set(value, tags=tags)

    def _refresh(self) -> None:
        while not self._stop.wait(REFRESH_S):
            with self._lock:
                values = list(self._values.values())
            for gauge, value, tags in values:
                gauge.set(value, tags=tags)

    def report(self, metrics: dict) -> None:
        """Set every gauge the report has a number for (MFU is None on CPU: left unset)."""
        if metrics.get("step_time_s") is not None:
            self._set(self.step_time, float(metrics["step_time_s"]), self.rank_tags)
        for key, gauge in self.run.items():
            if isinstance(metrics.get(key), int | float):
                self._set(gauge, float(metrics[key]), self.tags)

    def close(self, *, scrape_interval_s: float | None = None) -> None:
        """Stop re-setting the values: the series end (within Ray's two export intervals). With the scrape interval
        of the run's metrics, first keep the last values set until a scrape has surely seen them (`hold_seconds`
        after the last report); without one, at once."""
        left = self._last_set + hold_seconds(scrape_interval_s, export_interval_s()) - time.monotonic()
        if left > 0:
            log.debug("keeping the last metrics up %.1f s more, for Prometheus' next scrape", left)
            self._stop.wait(left)  # bounded; nothing sets _stop before this point
        self._stop.set()
        self._thread.join(timeout=5 * REFRESH_S)


def training_gauges(run_name: str, *, rank: int, plan_prediction: dict | None = None) -> TrainingGauges | None:
    """The gauges, or None (one warning) where Ray's metrics cannot be recorded: training goes on without."""
    try:
        return TrainingGauges(run_name, rank=rank, plan_prediction=plan_prediction)
    except Exception as exc:  # noqa: BLE001 - metrics must not stop training
        log.warning("Prometheus metrics off for this run: %s: %s", type(exc).__name__, exc)
        return None
