"""What stopping a run deletes: one decision, shared by `python -m ops.stop` (a person, with the kubernetes
client) and the watchdog (`workloads.watchdog`, in a pod, stdlib only). Standard library only: it ships in the code
ConfigMap and runs in the Ray image without the project's dependencies.

KubeRay v1.7.0 facts it rests on (ray-operator/controllers/ray/rayjob_controller.go at tag v1.7.0):
- Deleting a RayJob whose Ray job has not ended makes the operator stop that job through the dashboard before it
  lets the RayJob go: `Reconcile`, the `DeletionTimestamp` branch (L112-138: `IsJobTerminal` false ->
  `rayDashboardClient.StopJob`, then the `RayJobStopJobFinalizer` is removed). The RayCluster and the submitter Job
  are owned by the RayJob, so the garbage collector removes them with it: every GPU pod goes.
- Suspending it instead is refused beside deletion rules: `ValidateRayJobSpec` (controllers/ray/utils/validation.go
  L547: suspend needs shutdownAfterJobFinishes) and `validateDeletionConfiguration` (L772: shutdownAfterJobFinishes
  and deletionRules are mutually exclusive).
- A RayJob that has ended Complete or Failed is no longer managed, only its deletion rules act (`Reconcile`, case
  JobDeploymentStatusComplete/Failed, L420-440 -> `handleDeletionRules`). A rule's condition admits jobStatus
  SUCCEEDED or FAILED, or jobDeploymentStatus Failed (apis/ray/v1/rayjob_types.go `DeletionCondition` enums, L151
  and L157), so a RayJob Complete with jobStatus STOPPED (a raw `ray job stop`) matches none: its RayCluster stays
  until deleted. Deleting only the RayCluster then keeps the RayJob as the run's record; the operator does not
  recreate a cluster for an ended RayJob (it calls `getOrCreateRayClusterInstance` only in Initializing and
  Running, L203 and L269).
"""

from __future__ import annotations

from dataclasses import dataclass

ENDED = ("Complete", "Failed")
"""JobDeploymentStatus values after which the operator no longer manages the RayJob's cluster."""
RULE_JOB_STATUSES = ("SUCCEEDED", "FAILED")
"""The jobStatus values a deletion rule may name (rayjob_types.go `DeletionCondition.JobStatus` enum)."""


@dataclass(frozen=True)
class Delete:
    """One delete call: `resource` (rayjobs, rayclusters, jobs, pods) named `name`; `force`: grace period 0."""

    resource: str
    name: str
    force: bool = False

    def __str__(self) -> str:
        return f"delete {self.resource}/{self.name}{' (grace 0)' if self.force else ''}"


def status_of(rayjob: dict) -> dict:
    return rayjob.get("status") or {}


def ended(rayjob: dict) -> bool:
    """Whether the operator has finished with this RayJob (Complete or Failed for good)."""
    return status_of(rayjob).get("jobDeploymentStatus") in ENDED


def no_rule_frees(rayjob: dict) -> bool:
    """An ended RayJob whose cluster no deletion rule of charts/ray.py `deletion_rules` removes: Complete with a
    jobStatus other than SUCCEEDED and FAILED (STOPPED after a raw `ray job stop`)."""
    status = status_of(rayjob)
    return status.get("jobDeploymentStatus") == "Complete" and status.get("jobStatus") not in RULE_JOB_STATUSES


def stop_plan(rayjob: dict) -> tuple[list[Delete], str]:
    """What to delete to stop the run of `rayjob` and free its GPU nodes, and why, in one line.

    A run still going: the RayJob itself (background propagation; the finalizer stops the Ray job first), then its
    RayCluster and its submitter Job (the garbage collector would take them anyway; deleting them at once saves its
    delay). A run that has ended: only its RayCluster, the RayJob stays as the record.
    """
    name = rayjob["metadata"]["name"]
    status = status_of(rayjob)
    deployment, cluster = status.get("jobDeploymentStatus"), status.get("rayClusterName")
    if ended(rayjob):
        plan = [Delete("rayclusters", cluster)] if cluster else []
        return plan, (f"RayJob {name} had ended {deployment} ({status.get('jobStatus')}); keep it as the record and "
                      f"delete its RayCluster {cluster}")
    plan = [Delete("rayjobs", name)]
    if cluster:
        plan.append(Delete("rayclusters", cluster))
    plan.append(Delete("jobs", name))  # KubeRay names the submitter Job after the RayJob (common/association.go L164)
    return plan, (f"RayJob {name} was {deployment} ({status.get('jobStatus')}); delete it (the operator's finalizer "
                  "stops the Ray job first), then its RayCluster and submitter Job")
