"""`python -m charts.stop [FILE]`: stop the fine-tune's RayJob and free its GPU nodes, in one command.

A raw `ray job stop` ends the Ray job STOPPED; KubeRay 1.7.0 then marks the RayJob Complete (rayjob_controller.go
`Reconcile`, case JobDeploymentStatusRunning: `IsJobTerminal` covers STOPPED), and no deletion rule can match it:
a rule's `jobStatus` admits only SUCCEEDED and FAILED, its `jobDeploymentStatus` only Failed (apis/ray/v1/
rayjob_types.go `DeletionCondition`, `+kubebuilder:validation:Enum`). The GPU workers would stay up.

Suspending it (`spec.suspend: true`) is no way out: KubeRay 1.7.0 refuses `suspend` unless
`shutdownAfterJobFinishes` is true (controllers/ray/utils/validation.go `ValidateRayJobSpec`), which it forbids beside
`deletionStrategy.deletionRules` (same file, "mutually exclusive"), so the RayJob would only turn ValidationFailed
with its pods still up (the cluster tier saw exactly that).

So this command deletes the RayJob of a run that is still going: the operator's finalizer stops the Ray job through
the dashboard first (rayjob_controller.go `Reconcile`, deletion branch, `RayJobStopJobFinalizer` -> `StopJob`), and
the garbage collector then removes the RayCluster and the submitter Job the RayJob owns: every GPU pod goes. The
run's checkpoints stay in S3; applying the RayJob again resumes from the last one. A RayJob that already ended
(Complete after a raw `ray job stop`, whose workers no deletion rule removes) is kept as the record, and only its
RayCluster is deleted.

It waits until no pod of the cluster is left and says how long that took; exit 0 then, 1 on a timeout, 2 on a bad
variable file or no such RayJob.
"""

from __future__ import annotations

import argparse
import sys
import time

from config.cli import add_file_argument, chosen_file
from config.loader import load_or_exit, resolve_path

ENDED = ("Complete", "Failed")
"""JobDeploymentStatus values after which the operator no longer manages the RayJob's cluster (rayjob_controller.go,
case JobDeploymentStatusComplete, JobDeploymentStatusFailed: only the deletion rules act)."""


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
    status = rayjob.get("status") or {}
    deployment, cluster = status.get("jobDeploymentStatus"), status.get("rayClusterName")
    try:
        if deployment in ENDED:
            if cluster:
                custom.delete_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", cluster)
            log(f"stop: RayJob {namespace}/{name} had ended {deployment} ({status.get('jobStatus')}); kept it and "
                f"deleted its RayCluster {cluster}")
        else:
            custom.delete_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs", name,
                                                   propagation_policy="Background")
            log(f"stop: RayJob {namespace}/{name} was {deployment} ({status.get('jobStatus')}); deleting it (the "
                "operator's finalizer stops the Ray job first)")
            _wait_gone(lambda: custom.get_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs", name),
                       min(timeout_s, 60), interval_s)
            # The garbage collector would take the cluster and the submitter Job the RayJob owned, on its own
            # schedule; deleting them now frees the GPU nodes without waiting for it.
            if cluster:
                custom.delete_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", cluster,
                                                       propagation_policy="Background")
                log(f"stop: deleted RayCluster {cluster}")
            if batch is not None:
                batch.delete_namespaced_job(name, namespace, propagation_policy="Background")
    except ApiException as exc:
        if exc.status != 404:
            raise
    if not cluster:
        log(f"stop: RayJob {namespace}/{name} has no cluster ({deployment})")
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
    parser = argparse.ArgumentParser(prog="python -m charts.stop", description=__doc__.split("\n\n")[0])
    add_file_argument(parser)
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for the pods to go (300)")
    args = parser.parse_args(argv)
    config = load_or_exit(resolve_path(chosen_file(parser, args)))
    from kubernetes import client
    from kubernetes import config as kconfig

    from charts.ray import job_name

    api = kconfig.new_client_from_config(config_file=args.kubeconfig)
    try:
        stop(client.CustomObjectsApi(api), client.CoreV1Api(api), config.ray.namespace, job_name(config),
             batch=client.BatchV1Api(api), timeout_s=args.timeout)
    except LookupError as exc:
        print(f"stop: {exc}", file=sys.stderr)
        return 2
    except TimeoutError as exc:
        print(f"stop: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
