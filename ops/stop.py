"""`python -m ops.stop [FILE]`: stop the fine-tune's RayJob and free its GPU nodes, in one command.

What it deletes is `workloads.stopping.stop_plan`, the same decision the watchdog (`workloads.watchdog`) carries
out; that module cites the KubeRay v1.7.0 lines. In short: a raw `ray job stop` leaves the RayJob Complete/STOPPED,
which no deletion rule can match (the CRD's enums), and a suspend is refused beside deletion rules
(`ValidateRayJobSpec`; the cluster tier saw the RayJob turn ValidationFailed with its pods still up). So this command
deletes the RayJob of a run that is still going: the operator's finalizer stops the Ray job through the dashboard
first, then the RayCluster and the submitter Job go (deleted here at once rather than on the garbage collector's
schedule): every GPU pod goes. The run's checkpoints stay in S3; applying the RayJob again resumes from the last one.
A RayJob that already ended is kept as the record, and only its RayCluster is deleted.

It waits until no pod of the cluster is left and says how long that took; exit 0 then, 1 on a timeout, 2 on a bad
variable file or no such RayJob.
"""

from __future__ import annotations

import argparse
import time

from config.cli import add_file_argument, chosen_file
from config.errors import FAILED, UserError, run_cli
from config.loader import load_config, resolve_path
from workloads import stopping

ENDED = stopping.ENDED


def _wait_gone(read, timeout_s: float, interval_s: float) -> None:
    from kubernetes.client.exceptions import ApiException

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            read()
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        time.sleep(interval_s)


def _delete(custom, batch, namespace: str, action: stopping.Delete) -> None:
    if action.resource in ("rayjobs", "rayclusters"):
        custom.delete_namespaced_custom_object("ray.io", "v1", namespace, action.resource, action.name,
                                               propagation_policy="Background")
    elif action.resource == "jobs" and batch is not None:
        batch.delete_namespaced_job(action.name, namespace, propagation_policy="Background")


def stop(custom, core, namespace: str, name: str, *, batch=None, timeout_s: float = 300, interval_s: float = 1.0,
         log=print) -> float:
    """Delete RayJob `name` (or only its RayCluster when it has ended); seconds until its pods are gone."""
    from kubernetes.client.exceptions import ApiException

    started = time.monotonic()
    try:
        rayjob = custom.get_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs", name)
    except ApiException as exc:
        if exc.status == 404:
            raise LookupError(f"no RayJob {namespace}/{name}") from None
        raise
    status = stopping.status_of(rayjob)
    cluster = status.get("rayClusterName")
    plan, why = stopping.stop_plan(rayjob)
    log(f"stop: {why}")
    for action in plan:
        try:
            _delete(custom, batch, namespace, action)
        except ApiException as exc:
            if exc.status != 404:
                raise
        log(f"stop: {action}")
        if action.resource == "rayjobs":
            # Its finalizer stops the Ray job through the dashboard before the RayJob goes.
            _wait_gone(lambda: custom.get_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs", name),
                       min(timeout_s, 60), interval_s)
    if not cluster:
        log(f"stop: RayJob {namespace}/{name} has no cluster ({status.get('jobDeploymentStatus')})")
        return time.monotonic() - started
    deadline = started + timeout_s
    while True:
        pods = core.list_namespaced_pod(namespace, label_selector=f"ray.io/cluster={cluster}").items
        if not pods:
            took = time.monotonic() - started
            log(f"stop: every pod of {cluster} is gone after {took:.0f} s; the autoscaler removes the idle GPU "
                "nodes after autoscaling.scale_down_minutes")
            return took
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(pods)} pods of {cluster} still there after {timeout_s:.0f} s: "
                               f"{sorted(p.metadata.name for p in pods)}")
        time.sleep(interval_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.stop", description=__doc__.split("\n\n")[0])
    add_file_argument(parser)
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for the pods to go (300)")
    args = parser.parse_args(argv)
    config = load_config(resolve_path(chosen_file(parser, args)))
    from kubernetes import client
    from kubernetes import config as kconfig

    from charts.ray import job_name

    api = kconfig.new_client_from_config(config_file=args.kubeconfig)
    try:
        stop(client.CustomObjectsApi(api), client.CoreV1Api(api), config.ray.namespace, job_name(config),
             batch=client.BatchV1Api(api), timeout_s=args.timeout)
    except LookupError as exc:
        raise UserError(f"stop: {exc}") from None
    except TimeoutError as exc:
        raise UserError(f"stop: {exc}", exit_code=FAILED) from None
    return 0


if __name__ == "__main__":
    run_cli(main)
