"""Rank 0's run record: TensorBoard events read back by TensorBoard itself (local and fsspec memory://),
metrics.jsonl and the loss plot beside them, a resume that does not double-log, and MLflow on a local store."""

from __future__ import annotations

import json
import uuid

import pytest

from workloads.fsdp_finetune.tracking import TENSORBOARD_TAGS, RunTracker

JOB = {"run_name": "track-test", "learning_rate": 3e-3, "max_steps": 6, "mlflow_tracking_uri": None}


def _report(step: int) -> dict:
    row = {"step": step, "loss": 3.0 / step, "lr": 1e-3 * step, "grad_norm": 0.5 + step, "tokens_per_s": 1000.0 * step,
           "tokens_per_s_per_gpu": 500.0 * step, "mfu": 0.01 * step, "step_time_s": 0.2, "peak_memory_gib": 1.5,
           "epoch": 0, "resumed_from_step": 0, "data_wait_s": 0.01 * step}
    if step % 2 == 0:
        row.update(eval_loss=2.5 / step, eval_perplexity=2.0 ** step, eval_tokens=40, checkpoint_s=0.3)
    return row


def _run(run_dir: str, steps, *, resume_step: int = 0, job: dict = JOB) -> None:
    tracker = RunTracker(run_dir, job=job, resume_step=resume_step)
    for step in steps:
        tracker.log(_report(step), plot=step % 2 == 0)
    tracker.close()


def _scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series TensorBoard shows for `logdir`, through TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    mux = EventMultiplexer().AddRunsFromDirectory(logdir)
    mux.Reload()
    runs = mux.Runs()
    assert len(runs) == 1, runs  # the events sit in the run folder itself (one TensorBoard run)
    acc = mux.GetAccumulator(next(iter(runs)))
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _assert_series(series: dict, steps) -> None:
    rows = [_report(s) for s in steps]
    for key, tag in TENSORBOARD_TAGS.items():
        expected = [(r["step"], r[key]) for r in rows if key in r]
        got = series[tag]
        assert [s for s, _ in got] == [s for s, _ in expected], tag
        assert [v for _, v in got] == pytest.approx([v for _, v in expected], rel=1e-6), tag


@pytest.mark.slow
def test_local_folder_has_events_metrics_and_plot(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _run(str(tmp_path), range(1, 7))
    _assert_series(_scalars(str(tmp_path)), range(1, 7))
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert {"train/loss", "eval/loss", "train/lr", "train/grad_norm", "speed/tokens_per_s", "speed/mfu"} <= set(
        acc.Tags()["scalars"])
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert [r["step"] for r in rows if "eval_loss" in r] == [2, 4, 6]
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_memory_filesystem_folder_reads_back_through_fsspec(tmp_path):
    import fsspec

    run_dir = f"memory://runs/{uuid.uuid4().hex}/track-test"
    _run(run_dir, range(1, 7))
    fs = fsspec.filesystem("memory")
    names = {p.rsplit("/", 1)[-1] for p in fs.ls(run_dir.removeprefix("memory:/"), detail=False)}
    assert {"metrics.jsonl", "loss.png"} <= names
    assert any(n.startswith("events.out.tfevents.") for n in names)
    # TensorBoard reads the folder where it is, through its fsspec-backed file layer.
    _assert_series(_scalars(run_dir), range(1, 7))


@pytest.mark.slow
def test_resume_drops_the_replayed_stretch_everywhere(tmp_path):
    """A run killed after step 5 resumes from its step-3 checkpoint: steps 4-5 are trained and logged again."""
    _run(str(tmp_path), range(1, 6))
    _run(str(tmp_path), range(4, 7), resume_step=3)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7))
    # Two event files; TensorBoard's purge at step 4 hides the first file's steps 4-5.
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    _assert_series(_scalars(str(tmp_path)), range(1, 7))


@pytest.mark.slow
def test_writers_within_one_second_get_their_own_files_in_order(tmp_path, monkeypatch):
    """tensorboardX keys the event file name on whole seconds: a resume in the same second (same process,
    as here) must still write its own file, and sort after the first so its purge applies to it."""
    import types

    import tensorboardX.event_file_writer as writer

    monkeypatch.setattr(writer, "time", types.SimpleNamespace(time=lambda: 1_700_000_000.25))
    _run(str(tmp_path), range(1, 6))
    _run(str(tmp_path), range(4, 7), resume_step=3)
    files = sorted(tmp_path.glob("events.out.tfevents.1700000000.*"))
    assert len(files) == 2
    assert files[0].stat().st_size > 0 and files[1].stat().st_size > 0
    _assert_series(_scalars(str(tmp_path)), range(1, 7))


@pytest.mark.slow
def test_remote_resume_keeps_the_rows_before_the_checkpoint():
    run_dir = f"memory://runs/{uuid.uuid4().hex}/track-test"
    _run(run_dir, range(1, 6))
    _run(run_dir, range(4, 7), resume_step=3)
    import fsspec

    text = fsspec.filesystem("memory").cat(f"{run_dir.removeprefix('memory:/')}/metrics.jsonl").decode()
    assert [json.loads(line)["step"] for line in text.splitlines()] == list(range(1, 7))


@pytest.mark.slow
def test_mlflow_gets_the_metrics_and_the_settings(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    # MLflow 3 refuses its file store unless asked (it prefers a database; sqlite needs the full
    # package, the job's client is mlflow-skinny); a real server takes the same client calls.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    job = {**JOB, "mlflow_tracking_uri": uri}
    _run(str(tmp_path / "run"), range(1, 4), job=job)
    _run(str(tmp_path / "run"), range(3, 5), job=job, resume_step=2)  # a resume continues the same MLflow run

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("fsdp-finetune")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_name == "track-test" and run.info.status == "FINISHED"
    assert run.data.params["learning_rate"] == "0.003" and run.data.params["max_steps"] == "6"
    history = client.get_metric_history(run.info.run_id, "loss")
    assert sorted({m.step for m in history}) == [1, 2, 3, 4]
    assert {m.step: m.value for m in client.get_metric_history(run.info.run_id, "eval_loss")} == pytest.approx(
        {2: 1.25, 4: 0.625})


@pytest.mark.slow
def test_unreachable_mlflow_costs_only_mlflow(tmp_path, monkeypatch, caplog):
    import socket

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    # A port bound but not listening, held for the whole run: connections are refused, and no other
    # process can take the port meanwhile (as it could once a probe socket is closed).
    with socket.socket() as sock, caplog.at_level("WARNING", logger="fsdp_finetune"):
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        _run(str(tmp_path), range(1, 3), job={**JOB, "mlflow_tracking_uri": f"http://127.0.0.1:{port}"})
    warnings = [r.getMessage() for r in caplog.records if "MLflow" in r.getMessage()]
    assert len(warnings) == 1 and "off for this run" in warnings[0]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2


def test_a_tracking_uri_that_is_not_one_is_refused_at_load(tmp_path, capsys):
    from config import load_or_exit
    from tests.helpers import write_variant

    path = write_variant(tmp_path, {"job": {"mlflow_tracking_uri": "mlflow.example.com"}})
    with pytest.raises(SystemExit) as exc:
        load_or_exit(path)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "job.mlflow_tracking_uri" in err and "http(s)://" in err and str(path) in err
