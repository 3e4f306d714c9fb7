"""Seconds from a driver SIGKILL to training again after a resubmission, on local Ray clusters (2 CPU workers).

    python bench/driver_kill_times.py [--out DIR] [--cases local,s3,upload]

Each case runs `harness/driver_run.py` (its own local Ray cluster, its tiny 12-step `JOB`, a checkpoint every 4
steps) in a new process group, SIGKILLs the whole group at a known point, then starts it again under the
same run name (a new process and a new Ray cluster, as a RayJob retry has):

* `local`: local storage; the kill once checkpoint 4 is registered (rank 0 waits after reporting it).
* `s3`: the same through S3 (moto's server with auth, credentials from a Pod-Identity-style endpoint).
* `upload`: through S3 behind `harness.loopback.StallingProxy`, the kill while checkpoint 8's upload is held;
  the rerun resumes from checkpoint 4.

Measured per case: the kill to the first metrics row past the resume step (`<run>/metrics.jsonl`, read
from the local folder or from S3, where rank 0 copies it after each report: a bound from above), and the
kill to the rerun driver's exit. Loopback only; bounded (`driver_run.RUN_TIMEOUT_S` per driver). Prints
one JSON line. Figures depend on the machine's load: on the shared 2-core machine they are upper bounds.
Not part of `make test`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BUCKET = "bench-driver-kill"
WAIT_S = 600.0


def _rows(text: str | None) -> list[dict]:
    rows = []
    for line in (text or "").splitlines():
        with contextlib.suppress(ValueError):
            rows.append(json.loads(line))
    return rows


def _case(root: Path, name: str, assets: Path, *, env: dict | None, storage: str | None, read, proxy=None) -> dict:
    """Kill at the gate (or at a held upload), rerun; seconds from the kill to training again and to the end."""
    from harness import driver_run

    gate = "checkpoint_step_0000008" if proxy else "checkpoint_step_0000004"
    resume = 4
    job = ["--assets", str(assets)] + (["--storage", storage] if storage else [])
    marker = root / f"{name}.gate"
    if proxy:
        proxy.arm(gate)
    proc = driver_run.start(root, name, *job, "--gate", gate, "--gate-marker", str(marker), env=env)
    wanted = f"checkpoint_step_{resume:07d}"
    try:
        driver_run.wait_for(lambda: (proxy.held if proxy else marker.exists())
                            and driver_run.latest_registered(read(driver_run.SNAPSHOT, run=True)) == wanted,
                            WAIT_S, f"{name}: the kill point", proc, root, name)
    finally:
        driver_run.kill_group(proc)
    killed = time.time()
    if proxy:
        proxy.disarm()
    rerun = driver_run.start(root, name, *job, env=env)
    driver_run.wait_for(lambda: any(r.get("resumed_from_step") == resume for r in _rows(read("metrics.jsonl"))), WAIT_S,
                        f"{name}: a row past step {resume}", rerun, root, name)
    training = time.time()
    status = driver_run.wait_exit(rerun, root, name)
    rows = _rows(read("metrics.jsonl"))
    return {"kill_to_training_s": round(training - killed, 1), "kill_to_rerun_end_s": round(time.time() - killed, 1),
            "rerun_status": status, "resumed_from": sorted({r["resumed_from_step"] for r in rows
                                                            if r.get("step", 0) > resume})}


def main() -> int:
    from harness.loopback import MotoServer, PodIdentityEndpoint, StallingProxy, s3_policy
    from workloads.fsdp_finetune.local_assets import prepare_local_assets

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--cases", default="local,s3,upload")
    args = parser.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="driver-kill-times-"))
    root.mkdir(parents=True, exist_ok=True)
    cases = args.cases.split(",")
    assets = prepare_local_assets(root / "assets").model_dir.parent
    figures: dict[str, dict] = {}

    if "local" in cases:
        def read_local(name: str, run: bool = False) -> str | None:
            path = root / "local" / ("local" if run else "") / name
            return path.read_text() if path.exists() else None

        figures["local"] = _case(root, "local", assets, env=None, storage=None, read=read_local)

    if {"s3", "upload"} & set(cases):
        with MotoServer() as moto:
            moto.create_bucket(BUCKET)
            role = moto.create_role("bench-pod", s3_policy(BUCKET))
            s3 = moto.client("s3")
            with PodIdentityEndpoint(lambda: moto.assume_role(role), moto.account_id) as endpoint, \
                    StallingProxy(moto.endpoint_url) as proxy:
                for case in [c for c in ("s3", "upload") if c in cases]:
                    def read_s3(name: str, run: bool = False, case: str = case) -> str | None:
                        try:
                            body = s3.get_object(Bucket=BUCKET, Key=f"checkpoints/{case}/{name}")["Body"].read()
                        except s3.exceptions.NoSuchKey:
                            return None
                        return body.decode()

                    env = {**endpoint.exclusive_env(proxy.endpoint_url),  # whole requests only reach moto
                           "RAY_USAGE_STATS_ENABLED": "0"}
                    try:
                        figures[case] = _case(root, case, assets, env=env, storage=f"s3://{BUCKET}/checkpoints",
                                              read=read_s3, proxy=proxy if case == "upload" else None)
                    finally:
                        if os.environ.get("PROXY_EVENTS"):
                            Path(os.environ["PROXY_EVENTS"]).write_text("\n".join(map(str, proxy.events)))
    figures["load_average_1m"] = os.getloadavg()[0]
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
