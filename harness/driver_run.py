"""A driver process for the driver-kill tests: its own local Ray cluster, one fit() of a tiny job.

    python -m harness.driver_run OUTPUT_DIR RUN_NAME [--assets DIR] [--storage s3://BUCKET/PREFIX]
                               [--gate CHECKPOINT --gate-marker FILE]

The tests run it in a new process group and SIGKILL the whole group mid-run (driver, its local Ray cluster,
the workers), as a lost head or a killed `ray job` entrypoint would end it, then run it again under the same
run name. `--storage` puts checkpoints, metrics, logs and the exported model in S3 (credentials and endpoint
from the environment the test hands it) instead of under OUTPUT_DIR.

The kill lands at a known point, not by timing: with `--gate`, rank 0 stops right after reporting CHECKPOINT
to Ray (`gated_train_func`), writes FILE and waits there until it is killed. Its upload and Ray's
registration of that checkpoint go on in Ray's own threads; rank 1 waits for rank 0 at the next step's
collective. So no step after CHECKPOINT is trained, and the test kills once it has seen what it waits for
(the checkpoint registered, or its upload held by `harness.loopback.StallingProxy`). The gate lives here, in
the test's driver, and wraps the product's `train_func`: nothing in `workloads/` reads it.

The functions below the entry point start, wait for and kill such a driver from a test.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

# The tiny job of every failure-path test and of their one unbroken reference (conftest `reference_run`):
# 12 steps, enough for the loss to fall visibly (test_train_ray.py); checkpoints at 4, 8 and 12 (two kept), so a
# failure after 4 or 8 resumes with steps still to train. The held-out loss at every checkpoint (0, 4, 8, 12)
# and nowhere else: a rank-0-only redraw of the loss plot between two collectives would make the other rank
# wait in the second, which a short collective timeout (test_hang.py) must not see. report_every 2.
JOB = dict(seq_len=64, micro_batch_size=4, global_batch_size=16, max_steps=12, warmup_steps=2,
           checkpoint_every=4, report_every=2, eval_every=4, learning_rate=3e-3)
# The hang tests' (tests/test_hang.py) and bench/hang_time.py's step at which the last rank stops: after checkpoint 4,
# before checkpoint 8, so the restart must resume from 4.
HANG_AT = 6
GATE_TIMEOUT_S = 600.0  # a gate the test never kills releases (and fails the run) after this
RUN_TIMEOUT_S = 600.0  # one driver from start to its exit, on a loaded two-core machine
REPO = Path(__file__).resolve().parent.parent
SNAPSHOT = "checkpoint_manager_snapshot.json"  # ray/train/v2/_internal/constants.py, Ray 2.58.0


def gated_train_func(config: dict) -> None:
    """The product's `train_func`, with rank 0 stopped after it reports `config["test_gate"]["after"]`.

    Ray Train runs this on every worker; `ray.train.report` is looked up on the module at each call
    (`workloads/fsdp_finetune/train.py` calls `ray.train.report(...)`), so wrapping it here is seen there.
    The report itself is Ray's: with `CheckpointUploadMode.ASYNC` it returns once the upload is queued on
    the worker's upload thread (ray/train/v2/_internal/execution/context.py, Ray 2.58.0 `report`,
    `_upload_checkpoint_and_report`), which then uploads and hands the result to the controller on its own.
    """
    import threading

    import ray.train

    from workloads.fsdp_finetune import train

    gate = config.get("test_gate")
    if gate and ray.train.get_context().get_world_rank() == 0:
        report = ray.train.report

        def report_then_stop(metrics, *args, **kwargs):
            report(metrics, *args, **kwargs)
            if kwargs.get("checkpoint_dir_name") == gate["after"]:
                Path(gate["marker"]).write_text(f"rank 0 reported {gate['after']}\n")
                if not threading.Event().wait(GATE_TIMEOUT_S):
                    raise RuntimeError(f"test gate after {gate['after']}: not killed in {GATE_TIMEOUT_S:.0f} s")

        ray.train.report = report_then_stop
    # In a Ray worker `train.train_func` is the product's own: the substitution below happens in the driver.
    train.train_func(config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.driver_run")
    parser.add_argument("out")
    parser.add_argument("name")
    parser.add_argument("--assets", default=None, help="the local job's model and data (default: OUTPUT_DIR/assets)")
    parser.add_argument("--storage", default=None, help="s3://bucket/prefix (default: OUTPUT_DIR)")
    parser.add_argument("--gate", default=None, help="checkpoint folder name after which rank 0 stops")
    parser.add_argument("--gate-marker", default=None, help="file rank 0 writes when it reaches the gate")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    from workloads.fsdp_finetune import train
    from workloads.fsdp_finetune.run_plan import local_plan
    from workloads.fsdp_finetune.trainer import run_training
    from workloads.local_ray import start_local_ray

    root = Path(args.out)
    plan, _ = local_plan(root / args.name, assets_dir=args.assets or root / "assets", run_name=args.name, **JOB)
    if args.storage:
        storage = args.storage.rstrip("/")
        plan.storage_path = storage
        plan.run_dir = f"{storage}/{args.name}"
        plan.export_uri = f"{storage}/{args.name}/model"
        plan.metrics_path = None  # rank 0 logs; the metrics live in S3 only
    extra = {}
    if args.gate:
        # build_trainer takes `train_func` from this module when it builds the trainer; Ray pickles the
        # wrapper by reference (harness.driver_run.gated_train_func) and its workers import it from the repo,
        # which Ray puts on their path (the driver's working directory: ray/_private/worker.py, 2.58.0).
        from harness.driver_run import gated_train_func as gated

        train.train_func = gated
        extra["test_gate"] = {"after": args.gate, "marker": str(Path(args.gate_marker).resolve())}
    start_local_ray()
    result = run_training(plan, **extra)
    return 0 if result.error is None else 1


# ---- for the tests --------------------------------------------------------------------------------------------

def start(out: Path, name: str, *args: str, env: dict | None = None) -> subprocess.Popen:
    """`python -m harness.driver_run out name *args` in a new process group, its output in out/<name>-driver.log."""
    env = {**(os.environ if env is None else env), "RAY_USAGE_STATS_ENABLED": "0"}
    with (out / f"{name}-driver.log").open("ab") as log:
        return subprocess.Popen([sys.executable, "-m", "harness.driver_run", str(out), name, *args], cwd=REPO,
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def log_tail(out: Path, name: str) -> str:
    return (out / f"{name}-driver.log").read_text(errors="replace")[-4000:]


def _processes() -> dict[int, tuple[int, int, str]]:
    """Every process: pid -> (parent pid, process group, state), from /proc."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            found[int(stat.parent.name)] = (int(fields[1]), int(fields[2]), fields[0])
        except (OSError, IndexError, ValueError):
            continue
    return found


def _tree(pid: int) -> set[int]:
    """`pid`'s process group and all its descendants. Ray's workers are not in the driver's group: the raylet
    starts each in a group of its own (their pgid is their pid), so a kill of the group alone leaves them to
    notice their raylet's death in their own time."""
    procs = _processes()
    members = {p for p, (_, pgid, _) in procs.items() if pgid == pid} | {pid}
    grew = True
    while grew:
        children = {p for p, (ppid, _, _) in procs.items() if ppid in members} - members
        members |= children
        grew = bool(children)
    return members


def kill_group(proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """SIGKILL the driver's process group and every process below it (its Ray cluster's workers included),
    all at once, and wait until none of them runs (zombies aside: they hold nothing). Bounded."""
    members = _tree(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in members:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=timeout_s)

    def gone() -> bool:
        procs = _processes()
        return not any(p in procs and procs[p][2] != "Z" for p in members)

    wait_for(gone, timeout_s, f"driver {proc.pid}'s processes to end")


def wait_exit(proc: subprocess.Popen, out: Path, name: str, timeout_s: float = RUN_TIMEOUT_S) -> int:
    """The driver's exit status; the group is killed and the log tail raised if it runs past `timeout_s`."""
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise AssertionError(f"{name} did not finish in {timeout_s:.0f} s: {log_tail(out, name)}") from None


def wait_for(condition, timeout_s: float, what: str, proc: subprocess.Popen | None = None,
             out: Path | None = None, name: str = "", interval_s: float = 0.1) -> None:
    """`harness.waiting.wait_for` that fails at once when `proc` (the driver) has ended, with the driver's log tail."""
    from harness.waiting import wait_for as wait

    def ready():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the driver ended (status {proc.returncode}) while waiting for {what}: "
                                 f"{log_tail(out, name) if out else ''}")
        return condition()

    wait(ready, timeout_s, what, interval_s=interval_s, detail=lambda: f": {log_tail(out, name)}" if out else "")


def weights(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(model_dir) / "model.safetensors"))


def same_weights(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


if __name__ == "__main__":
    sys.exit(main())
