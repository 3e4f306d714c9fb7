"""Rank 0's record of a run, in the run's own folder: metrics.jsonl, TensorBoard events, loss plot, MLflow.

The folder is a local path (`--local`: the output directory) or a URI of the job's storage
(`s3://<bucket>/<prefix>/checkpoints/<run_name>`, beside Ray's checkpoints; any URI
`checkpoint.filesystem` reaches, fsspec's `memory://` included). Files are written in a local
staging folder and copied to a remote folder after each report (a few KB: object stores cannot
append, so the event file and metrics.jsonl are re-uploaded whole). View with
`tensorboard --logdir <folder>`.

A resumed run keeps the metrics rows up to the checkpoint's step and drops the rest (they are
trained again); its new TensorBoard event file starts with a purge at that step, so TensorBoard
hides the replayed stretch of the earlier file too. With `job.mlflow_tracking_uri` the same
metrics, and the job's settings as parameters, go to MLflow through its client (run name:
`job.run_name`; a resume continues that run).

A missing package or an unreachable MLflow server costs that one sink, with one warning, never
the training run: metrics.jsonl (standard library only) is always written.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import shutil
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from workloads.fsdp_finetune.metrics import METRICS_FILE, MetricsLog, plot_loss

log = logging.getLogger("fsdp_finetune")

LOSS_PLOT = "loss.png"
MLFLOW_EXPERIMENT = "fsdp-finetune"
# Metrics key -> TensorBoard tag: grouped, so TensorBoard draws train, eval and speed in sections.
TENSORBOARD_TAGS = {
    "loss": "train/loss",
    "eval_loss": "eval/loss",
    "eval_perplexity": "eval/perplexity",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "tokens_per_s": "speed/tokens_per_s",
    "tokens_per_s_per_gpu": "speed/tokens_per_s_per_gpu",
    "mfu": "speed/mfu",
    "step_time_s": "speed/step_time_s",
    "data_wait_s": "speed/data_wait_s",
    "checkpoint_s": "checkpoint/seconds",
    "peak_memory_gib": "memory/peak_gib",
}
# tensorboardX names an event file `events.out.tfevents.<whole seconds>.<hostname><filename_suffix>`
# (tensorboardX 2.6.5, event_file_writer.py: EventsWriter.__init__), and TensorBoard reads a folder's
# files in name order (tensorboard 2.21.0, directory_watcher.py: DirectoryWatcher._GetNextPath sorts
# them). Two writers opened within one second in one process (a resume in the same process, the
# tests) would share a name, the second truncating the first. The pid and this process's writer
# count make every name unique; zero-padded, a later writer of the same second sorts after, so its
# purge at the resume step applies to the earlier file.
_WRITERS = itertools.count()


def is_remote(location: str) -> bool:
    """Whether `location` is a URI (s3://, memory://, ...) rather than a local path."""
    return "://" in location and not location.startswith("file://")


def _scalars(metrics: dict) -> dict[str, float]:
    """The numeric, finite figures of a report (MFU is None on CPU)."""
    return {key: float(value) for key, value in metrics.items()
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)}


class RunTracker:
    """Writes every report to metrics.jsonl, TensorBoard and (optionally) MLflow; rank 0 only."""

    def __init__(self, run_dir: str, *, job: dict, resume_step: int = 0, settings: dict | None = None):
        self.run_dir = run_dir
        self.remote = is_remote(run_dir)
        local = run_dir.removeprefix("file://")
        self.local_dir = Path(tempfile.mkdtemp(prefix="tracking-")) if self.remote else Path(local)
        self.local_dir.mkdir(parents=True, exist_ok=True)
        if self.remote and resume_step:
            self._fetch(METRICS_FILE)  # the rows before the checkpoint are kept
        self.metrics = MetricsLog(self.local_dir / METRICS_FILE, resume_step=resume_step)
        # Copies to remote storage run on one background thread: a synchronous upload on rank 0 at
        # every report would stall every rank at the next collective. A report that finds the last
        # copy still running skips its own (the next copy takes the whole folder); `close` copies last.
        self._uploader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tracking-copy") if self.remote else None
        self._upload: Future | None = None
        self.title = f"{job['run_name']}: loss"
        self._plot_warned = False
        self._tensorboard = self._open_tensorboard(resume_step)
        self._mlflow = None
        if job.get("mlflow_tracking_uri"):
            self._mlflow = self._open_mlflow(job["mlflow_tracking_uri"], job["run_name"],
                                             {**job, **(settings or {})})

    # ---- sinks ---------------------------------------------------------------------------

    def _open_tensorboard(self, resume_step: int):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            log.warning("tensorboardX is not installed: no TensorBoard events for this run (metrics.jsonl "
                        "has the same figures); it comes with ray[train], or add it to ray.extra_pip_packages")
            return None
        # purge_step: TensorBoard drops the earlier files' events from this step on (the replayed stretch).
        return SummaryWriter(logdir=str(self.local_dir), purge_step=resume_step + 1 if resume_step else None,
                             flush_secs=30, filename_suffix=f".{os.getpid()}.{next(_WRITERS):06d}")

    def _open_mlflow(self, uri: str, run_name: str, settings: dict):
        try:
            from mlflow.entities import Param
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=uri)
            experiment = client.get_experiment_by_name(MLFLOW_EXPERIMENT)
            experiment_id = experiment.experiment_id if experiment else client.create_experiment(MLFLOW_EXPERIMENT)
            found = client.search_runs([experiment_id], filter_string=f"tags.`mlflow.runName` = '{run_name}'",
                                       max_results=1)
            if found:
                run_id = found[0].info.run_id
                client.update_run(run_id, status="RUNNING")
            else:
                run_id = client.create_run(experiment_id, run_name=run_name).info.run_id
                # MLflow caps a parameter value at 6000 characters.
                params = [Param(key, str(value)[:6000]) for key, value in sorted(settings.items())]
                client.log_batch(run_id, params=params)
            log.info("MLflow: experiment %s, run %s (%s) at %s", MLFLOW_EXPERIMENT, run_name, run_id, uri)
            return client, run_id
        except Exception as exc:  # noqa: BLE001 - tracking must not stop training
            log.warning("MLflow tracking off for this run: %s: %s", type(exc).__name__, exc)
            return None

    def _log_mlflow(self, figures: dict[str, float], step: int) -> None:
        if self._mlflow is None:
            return
        from mlflow.entities import Metric

        client, run_id = self._mlflow
        now = int(time.time() * 1000)
        try:
            client.log_batch(run_id, metrics=[Metric(k, v, now, step) for k, v in figures.items() if k != "step"])
        except Exception as exc:  # noqa: BLE001 - one warning, then the sink is dropped
            log.warning("MLflow tracking off for the rest of this run: %s: %s", type(exc).__name__, exc)
            self._mlflow = None

    # ---- the run ---------------------------------------------------------------------------

    def log(self, metrics: dict, *, plot: bool = False) -> None:
        """Record one report everywhere; `plot` also redraws the loss plot (cheap, but not every report)."""
        self.metrics.write(metrics)
        step = int(metrics["step"])
        figures = _scalars(metrics)
        if self._tensorboard is not None:
            for key, tag in TENSORBOARD_TAGS.items():
                if key in figures:
                    self._tensorboard.add_scalar(tag, figures[key], global_step=step)
            self._tensorboard.flush()
        self._log_mlflow(figures, step)
        if plot:
            self._plot()
        if self._uploader is not None and (self._upload is None or self._upload.done()):
            self._upload = self._uploader.submit(self._publish)

    def close(self) -> None:
        """Final plot, final copy, MLflow run marked finished."""
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        self._plot()
        if self._uploader is not None:
            self._uploader.shutdown(wait=True)  # the copy in flight, then the final one below
            self._uploader = None
        self._publish()
        if self._mlflow is not None:
            client, run_id = self._mlflow
            try:
                client.set_terminated(run_id, status="FINISHED")
            except Exception as exc:  # noqa: BLE001
                log.warning("MLflow: could not mark the run finished: %s", exc)
            self._mlflow = None
        if self.remote:
            shutil.rmtree(self.local_dir, ignore_errors=True)

    def _plot(self) -> None:
        try:
            plot_loss(self.local_dir / METRICS_FILE, self.local_dir / LOSS_PLOT, title=self.title)
        except ImportError:
            if not self._plot_warned:
                log.warning("matplotlib is not installed: no %s for this run", LOSS_PLOT)
                self._plot_warned = True

    def _publish(self) -> None:
        """Copy the staging folder to the remote run folder (nothing to do for a local one)."""
        if not self.remote:
            return
        from workloads.fsdp_finetune.checkpoint import copy_tree

        try:
            copy_tree(str(self.local_dir), self.run_dir)
        except Exception as exc:  # noqa: BLE001 - retried at the next report
            log.warning("could not copy metrics to %s (retried at the next report): %s", self.run_dir, exc)

    def _fetch(self, name: str) -> None:
        import pyarrow.fs as pafs

        from workloads.fsdp_finetune.checkpoint import filesystem

        fs, path = filesystem(self.run_dir)
        source = f"{path.rstrip('/')}/{name}"
        if fs.get_file_info(source).type == pafs.FileType.File:
            with fs.open_input_stream(source) as src:
                (self.local_dir / name).write_bytes(src.read())
