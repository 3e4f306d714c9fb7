"""The demo's progress: its ETA is the rest of the steps at the pace of the steps seen (not diluted by the
start-up), and a rerun keeps the previous runs' logs (workloads/fsdp_finetune local_demo.py `StepEta`, console.py
`keep_previous`)."""

from __future__ import annotations

from workloads.fsdp_finetune.console import KEPT_LOGS, RunLog
from workloads.fsdp_finetune.local_demo import StepEta


def test_eta_is_the_remaining_steps_at_the_observed_pace_despite_a_slow_start():
    eta = StepEta(total=50)
    # 30 s to start Ray, the workers and the model; then a step every 2 s.
    for step in range(1, 6):
        eta.seen(step, 30.0 + 2.0 * (step - 1))
    assert eta.seconds_left(38.0) == 45 * 2.0  # tqdm's n/elapsed would say 38 / 5 * 45 = 342 s
    assert eta.text(38.0) == "training ETA 1:30 (then export and evaluation)"
    assert eta.seconds_left(40.0) == 88.0  # time since the last report counts as progress


def test_no_eta_before_two_steps():
    eta = StepEta(total=10)
    assert eta.seconds_left(0.0) is None
    eta.seen(1, 20.0)
    assert eta.seconds_left(21.0) is None and "after the next report" in eta.text(21.0)


def test_the_eta_never_goes_negative():
    eta = StepEta(total=3)
    eta.seen(1, 0.0)
    eta.seen(2, 1.0)
    assert eta.seconds_left(100.0) == 0.0


def test_a_rerun_keeps_the_previous_logs(tmp_path):
    path = tmp_path / "ray.log"
    first = RunLog(path)
    first.write(["first run"])
    assert first.previous is None
    second = RunLog(path)
    assert second.previous == tmp_path / "ray.log.1" and "first run" in second.previous.read_text()
    assert "first run" not in path.read_text()
    for n in range(KEPT_LOGS + 2):
        RunLog(path).write([f"run {n}"])
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == ["ray.log", *[f"ray.log.{n}" for n in range(1, KEPT_LOGS + 1)]]


def test_a_quiet_step_prints_a_line_at_the_start_and_then_regularly(capsys):
    import time

    from workloads.fsdp_finetune.local_demo import Heartbeat

    with Heartbeat("evaluating the model on 50 held-out questions", every_s=0.3):
        time.sleep(1.0)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "evaluating the model on 50 held-out questions ..."
    assert len([line for line in out if line.startswith("  still evaluating: ")]) >= 2
