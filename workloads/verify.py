"""`python -m workloads.verify`: check a deployed cluster against the variable file.

Decisions are pure functions over `kubernetes` client model objects (V1Node, V1DaemonSet,
V1Deployment, V1Pod) and the RayJob custom objects as dicts, so they are tested without an API
server; `gather()` is the only code that talks to the cluster (current kubeconfig). Checks:

* every GPU node (label `ray-efa.io/role=gpu`) is Ready with `nvidia.com/gpu` allocatable, and with
  `vpc.amazonaws.com/efa` allocatable when `nccl.transport: efa`; each worker group has its nodes
  (under the Cluster Autoscaler a group with no node is idle: SKIP, as are device plugins with no GPU node);
* the NVIDIA device plugin DaemonSet (name contains `nvidia-device-plugin`, MPS control daemon
  excluded), the EFA device plugin DaemonSet (name contains `efa` and `device-plugin`, only with
  EFA) and the KubeRay operator Deployment (name contains `kuberay-operator`), in any namespace,
  exist with more than zero desired pods, all ready;
* the Ray head and all worker pods (labels `ray.io/node-type`) in `ray.namespace` are ready;
* with `ray.auth: token`, the head container has RAY_AUTH_MODE=token and RAY_AUTH_TOKEN from a Secret
  (what KubeRay injects for `authOptions`); with `ray.auth: disabled`, a warning;
* the latest RayJob's preflight result: the last `PREFLIGHT_RESULT {...}` line in its submitter's
  logs (K8sJobMode: the `ray-job-submitter` container of the submitter Job's pods, labelled
  `ray.io/originated-from-cr-name=<rayjob>`; KubeRay keeps that Job after deleting the cluster, so
  the log outlives it), streamed whole (training's NCCL INFO output follows it, so a tail window
  would miss it);
* the latest RayJob's outcome: PASS when it succeeded (its GPU workers then gone, the head kept
  `job.ttl_hours`) or is under way; FAIL naming the stage that failed (waiting for the cluster,
  plan, settings, preflight, training, submission, deadline) from the RayJob's reason and the last
  `JOB_STAGE` line the driver wrote.

Exit status: 0 when nothing failed (warnings and skips allowed), 1 on any failure, 2 when the
cluster cannot be reached.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from config.cli import add_file_argument, chosen_file
from config.errors import UserError
from config.k8s import EFA_PRESENT_LABEL, GPU_PRESENT_LABEL, ROLE_LABEL, WORKER_GROUP_LABEL
from config.k8s import EFA_RESOURCE as EFA
from config.k8s import GPU_RESOURCE as GPU
from config.k8s import RAY_CLUSTER_LABEL as CLUSTER_LABEL
from config.k8s import RAY_NODE_TYPE_LABEL as NODE_TYPE_LABEL
from workloads.preflight.report import MARKER, table

SUBMITTER_CONTAINER = "ray-job-submitter"
"""The container of the RayJob's submitter pod (charts.ray.submitter_template; K8sJobMode)."""
ORIGIN_LABEL = "ray.io/originated-from-cr-name"
"""KubeRay 1.7.0 labels the submitter pods with the RayJob's name (rayjob_controller.go getSubmitterTemplate)."""
STAGE_MARKER = "JOB_STAGE"
"""The driver prints `JOB_STAGE <stage>` as it enters each stage (workloads.fsdp_finetune.cluster_job)."""
# The NVIDIA chart also ships an MPS control daemon that only schedules on MPS-enabled nodes;
# zero desired pods there is normal.
_NVIDIA_EXCLUDE = ("mps-control",)


@dataclass(frozen=True, kw_only=True)
class Row:
    """One verification line: `status` is PASS, FAIL, WARN or SKIP; a FAIL says how to fix it."""

    section: str
    name: str
    status: str
    detail: str
    fix: str = ""


def _quantity(value) -> float:
    from kubernetes.utils import parse_quantity

    try:
        return float(parse_quantity(value)) if value is not None else 0.0
    except (ValueError, TypeError):
        return 0.0


def _node_ready(node) -> bool:
    conditions = (node.status.conditions or []) if node.status else []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def check_gpu_nodes(nodes: list, config) -> list[Row]:
    """GPU and (for EFA transport) EFA allocatable on every GPU node; each worker group has its node count."""
    efa = config.nccl.transport == "efa"
    groups = {g.name: g for g in config.cluster.worker_groups}
    gpu_nodes = [n for n in nodes if (n.metadata.labels or {}).get(ROLE_LABEL) == "gpu"]
    rows: list[Row] = []
    for node in sorted(gpu_nodes, key=lambda n: n.metadata.name):
        labels = node.metadata.labels or {}
        group = groups.get(labels.get(WORKER_GROUP_LABEL, ""), config.cluster.worker_groups[0])
        itype = config.instance(group)
        alloc = (node.status.allocatable or {}) if node.status else {}
        gpus, efas = int(_quantity(alloc.get(GPU))), int(_quantity(alloc.get(EFA)))
        problems, fixes = [], []
        if not _node_ready(node):
            problems.append("not Ready")
            fixes.append("kubectl describe node; check the node group's health in the EKS console")
        if gpus < itype.gpus:
            problems.append(f"{GPU} allocatable {gpus}, expected {itype.gpus}")
            fixes.append(f"the NVIDIA device plugin must run here: node label {GPU_PRESENT_LABEL}=true and the "
                         "nvidia.com/gpu taint tolerated (node group labels in the stack)")
        if efa and efas < max(1, itype.efa_interfaces):
            problems.append(f"{EFA} allocatable {efas}, expected {itype.efa_interfaces}")
            fixes.append(f"the EFA device plugin must run here: node label {EFA_PRESENT_LABEL}=true; the node "
                         "group's launch template must attach EFA interfaces (InterfaceType: efa)")
        detail = f"{group.name} {itype.name}: gpu {gpus}" + (f", efa {efas}" if efa else "")
        if problems:
            rows.append(Row(section="nodes", name=node.metadata.name, status="FAIL",
                            detail=f"{detail}: {'; '.join(problems)}", fix="; ".join(fixes)))
        else:
            rows.append(Row(section="nodes", name=node.metadata.name, status="PASS", detail=detail))
    for group in config.cluster.worker_groups:
        count = sum(1 for n in gpu_nodes if (n.metadata.labels or {}).get(WORKER_GROUP_LABEL) == group.name
                    and _node_ready(n))
        if count >= group.nodes:
            rows.append(Row(section="nodes", name=f"group {group.name}", status="PASS",
                            detail=f"{count} Ready node(s), want {group.nodes}"))
        elif config.autoscaling.enabled and not any(
                (n.metadata.labels or {}).get(WORKER_GROUP_LABEL) == group.name for n in gpu_nodes):
            # Scaled to zero while idle: the Cluster Autoscaler adds nodes when Ray worker pods are Pending.
            # A group with some but too few nodes still fails.
            rows.append(Row(section="nodes", name=f"group {group.name}", status="SKIP",
                            detail=f"no node (idle; the Cluster Autoscaler brings up to {group.nodes} for Pending "
                                   "Ray workers)"))
        else:
            rows.append(Row(section="nodes", name=f"group {group.name}", status="FAIL",
                            detail=f"{count} Ready node(s) labelled {ROLE_LABEL}=gpu, {WORKER_GROUP_LABEL}="
                                   f"{group.name}; want {group.nodes}",
                            fix="check the node group (capacity: spot/capacity_block may have none; "
                                "gpu_availability_zone may lack the instance type) and its labels"))
    return rows


def _ds_counts(ds) -> tuple[int, int]:
    status = ds.status
    return (status.desired_number_scheduled or 0, status.number_ready or 0) if status else (0, 0)


def _deploy_counts(dep) -> tuple[int, int]:
    desired = dep.spec.replicas if dep.spec and dep.spec.replicas is not None else 1
    return desired, (dep.status.ready_replicas or 0) if dep.status else 0


def check_controllers(daemonsets: list, deployments: list, config, *, gpu_nodes: int = 1) -> list[Row]:
    """Device-plugin DaemonSets and the KubeRay Deployment exist, want > 0 pods, and all are ready.

    With no GPU node at all under the Cluster Autoscaler (idle), a device-plugin DaemonSet with 0 desired
    pods is expected, not a fault."""
    efa = config.nccl.transport == "efa"

    def nvidia(name: str) -> bool:
        return "nvidia-device-plugin" in name and not any(x in name for x in _NVIDIA_EXCLUDE)

    def efa_plugin(name: str) -> bool:
        return "efa" in name and "device-plugin" in name

    wanted = [
        ("NVIDIA device plugin", "DaemonSet", daemonsets, nvidia, _ds_counts, True,
         f"label GPU nodes {GPU_PRESENT_LABEL}=true (the chart's nodeSelector) and tolerate the nvidia.com/gpu "
         "taint; check the Helm release nvidia-device-plugin"),
        ("EFA device plugin", "DaemonSet", daemonsets, efa_plugin, _ds_counts, efa,
         f"label GPU nodes {EFA_PRESENT_LABEL}=true (the chart's nodeSelector), tolerate the nvidia.com/gpu taint; "
         "check the Helm release aws-efa-k8s-device-plugin"),
        ("KubeRay operator", "Deployment", deployments, lambda n: "kuberay-operator" in n, _deploy_counts, True,
         "check the Helm release kuberay-operator (ray.kuberay_version) and that a system node has room"),
    ]
    rows: list[Row] = []
    for label, kind, objects, match, counts, required, fix in wanted:
        found = [o for o in objects if match(o.metadata.name)]
        if not found:
            if required:
                rows.append(Row(section="add-ons", name=label, status="FAIL", detail=f"no {kind} found", fix=fix))
            else:
                rows.append(Row(section="add-ons", name=label, status="SKIP", detail="not needed for socket transport"))
            continue
        for obj in found:
            desired, ready = counts(obj)
            where = f"{kind} {obj.metadata.namespace}/{obj.metadata.name}"
            if desired == 0 and kind == "DaemonSet" and not gpu_nodes and config.autoscaling.enabled:
                rows.append(Row(section="add-ons", name=label, status="SKIP",
                                detail=f"{where}: 0 desired pods, no GPU node while idle (autoscaler)"))
            elif desired == 0:
                rows.append(Row(section="add-ons", name=label, status="FAIL",
                                detail=f"{where}: 0 desired pods (scheduled on no node)", fix=fix))
            elif ready < desired:
                rows.append(Row(section="add-ons", name=label, status="FAIL",
                                detail=f"{where}: {ready}/{desired} ready",
                                fix=f"kubectl -n {obj.metadata.namespace} describe {kind.lower()} {obj.metadata.name}; "
                                    "check the pods' events (image pull, tolerations, resources)"))
            else:
                rows.append(Row(section="add-ons", name=label, status="PASS",
                                detail=f"{where}: {ready}/{desired} ready"))
    return rows


def _pod_ready(pod) -> bool:
    status = pod.status
    if not status or status.phase != "Running":
        return False
    return any(c.type == "Ready" and c.status == "True" for c in (status.conditions or []))


def _terminal(rayjob: dict | None) -> bool:
    status = (rayjob or {}).get("status") or {}
    return status.get("jobDeploymentStatus") in ("Complete", "Failed") or status.get("jobStatus") in (
        "SUCCEEDED", "FAILED", "STOPPED")


def _cluster_pods(pods: list, rayjob: dict | None) -> list:
    """Ray head and worker pods, those of the latest RayJob's cluster where it has any."""
    cluster = ((rayjob or {}).get("status") or {}).get("rayClusterName")
    ray_pods = [p for p in pods if (p.metadata.labels or {}).get(NODE_TYPE_LABEL) in ("head", "worker")]
    if cluster:
        ray_pods = [p for p in ray_pods if (p.metadata.labels or {}).get(CLUSTER_LABEL) == cluster] or ray_pods
    return ray_pods


def check_ray_auth(pods: list, config, rayjob: dict | None = None) -> Row:
    """The head runs with Ray token authentication, its token read from a Secret (what KubeRay injects)."""
    name = "token auth"
    if config.ray.auth == "disabled":
        return Row(section="ray", name=name, status="WARN",
                   detail="ray.auth is disabled: any pod that reaches the head's Service can run code as the Ray pods")
    heads = [p for p in _cluster_pods(pods, rayjob) if p.metadata.labels[NODE_TYPE_LABEL] == "head"]
    if not heads:
        return Row(section="ray", name=name, status="SKIP", detail="no Ray head pod to inspect")
    head = heads[0]
    containers = (head.spec.containers or []) if head.spec else []
    env = {e.name: e for c in containers[:1] for e in (c.env or [])}  # the Ray container is the first
    mode = getattr(env.get("RAY_AUTH_MODE"), "value", None)
    source = getattr(getattr(env.get("RAY_AUTH_TOKEN"), "value_from", None), "secret_key_ref", None)
    if mode == "token" and source is not None:
        return Row(section="ray", name=name, status="PASS",
                   detail=f"{head.metadata.name}: RAY_AUTH_MODE=token, token from Secret {source.name} "
                          f"(key {source.key})")
    return Row(section="ray", name=name, status="FAIL",
               detail=f"{head.metadata.name}: RAY_AUTH_MODE={mode or 'unset'}, RAY_AUTH_TOKEN "
                      f"{'from a Secret' if source is not None else 'not from a Secret'}",
               fix="the operator injects both for spec.authOptions.mode: token; re-apply dist/ (ray.auth: token) "
                   "and check the operator is KubeRay 1.5.1 or later (ray.kuberay_version)")


def check_ray_pods(pods: list, config, rayjob: dict | None = None) -> list[Row]:
    """The Ray head and the expected number of worker pods are ready (the latest RayJob's cluster if known)."""
    ray_pods = _cluster_pods(pods, rayjob)
    heads = [p for p in ray_pods if p.metadata.labels[NODE_TYPE_LABEL] == "head"]
    workers = [p for p in ray_pods if p.metadata.labels[NODE_TYPE_LABEL] == "worker"]
    want = sum(config.pods(g) for g in config.cluster.worker_groups)
    ns = config.ray.namespace
    if not ray_pods and _terminal(rayjob):
        name = rayjob["metadata"]["name"]
        return [Row(section="ray", name="head and workers", status="SKIP",
                    detail=f"no Ray pods: RayJob {name} finished and its cluster was removed")]
    if _terminal(rayjob):
        # deletionRules: the GPU workers go when the job ends, the head stays job.ttl_hours (charts.ray).
        name = rayjob["metadata"]["name"]
        head = next((p for p in heads if _pod_ready(p)), None)
        return [Row(section="ray", name="head", status="PASS" if head else "SKIP",
                    detail=f"{head.metadata.name} ready (kept job.ttl_hours after RayJob {name} ended)" if head
                    else f"RayJob {name} ended; its head is not running"),
                Row(section="ray", name="workers", status="SKIP",
                    detail=f"RayJob {name} ended: its GPU workers were released ({len(workers)} left)")]
    rows = []
    ready_heads = sum(_pod_ready(p) for p in heads)
    if ready_heads >= 1:
        rows.append(Row(section="ray", name="head", status="PASS", detail=f"{heads[0].metadata.name} ready"))
    else:
        rows.append(Row(section="ray", name="head", status="FAIL",
                        detail=f"no ready Ray head pod in namespace {ns} ({len(heads)} found)",
                        fix=f"submit the RayJob (it creates the cluster) or kubectl -n {ns} describe pod -l "
                            f"{NODE_TYPE_LABEL}=head; check ray.head fits a system node"))
    ready_workers = sum(_pod_ready(p) for p in workers)
    if ready_workers >= want:
        rows.append(Row(section="ray", name="workers", status="PASS", detail=f"{ready_workers}/{want} ready"))
    else:
        pending = [p.metadata.name for p in workers if not _pod_ready(p)]
        rows.append(Row(section="ray", name="workers", status="FAIL",
                        detail=f"{ready_workers}/{want} worker pods ready" + (f"; not ready: {', '.join(pending[:4])}"
                                                                                if pending else ""),
                        fix=f"kubectl -n {ns} describe pod <worker>: Pending usually means the node lacks "
                            "nvidia.com/gpu, vpc.amazonaws.com/efa or hugepages-2Mi allocatable (see the nodes rows)"))
    return rows


def latest_rayjob(rayjobs: list[dict]) -> dict | None:
    """The most recently created RayJob (RFC 3339 timestamps sort as text)."""
    return max(rayjobs, key=lambda j: (j.get("metadata") or {}).get("creationTimestamp") or "", default=None)


def parse_preflight_marker(logs: str | Iterable[str]) -> dict | None:
    """The last `PREFLIGHT_RESULT {...}` JSON in a job's logs (text, or lines streamed one at a time), or None."""
    found = None
    for line in logs.splitlines() if isinstance(logs, str) else logs:
        at = line.find(MARKER + " ")
        if at < 0:
            continue
        try:
            found = json.loads(line[at + len(MARKER) + 1:].strip())
        except json.JSONDecodeError:
            continue
    return found


MAX_LINE = 1 << 20
"""Longest log line kept whole when streaming (a marker line is a few hundred bytes)."""


def iter_lines(chunks: Iterable[bytes | str], max_line: int = MAX_LINE) -> Iterator[str]:
    """Lines from a stream of chunks, holding at most one line (cut at `max_line`) in memory."""
    buffer = b""
    dropping = False
    for chunk in chunks:
        buffer += chunk.encode() if isinstance(chunk, str) else chunk
        *whole, buffer = buffer.split(b"\n")
        for raw in whole:
            if dropping:  # the tail of an over-long line already yielded
                dropping = False
                continue
            yield raw.decode("utf-8", "replace")
        if len(buffer) > max_line:
            if not dropping:
                yield buffer[:max_line].decode("utf-8", "replace")
            buffer, dropping = b"", True
    if buffer and not dropping:
        yield buffer.decode("utf-8", "replace")


def last_marker_line(lines: Iterable[str]) -> str | None:
    """The last line carrying a parseable `PREFLIGHT_RESULT` marker, keeping only that line."""
    found = None
    for line in lines:
        if MARKER in line and parse_preflight_marker([line]) is not None:
            found = line
    return found


def last_stage(lines: Iterable[str]) -> str | None:
    """The stage named by the last `JOB_STAGE <stage>` line, or None."""
    stage = None
    for line in lines:
        _, found, rest = line.partition(STAGE_MARKER + " ")
        if found and rest.split():
            stage = rest.split()[0]
    return stage


def _scan(lines: Iterable[str]) -> tuple[str | None, str | None]:
    """(last marker line, last stage) in one pass."""
    marker, stage = None, None
    for line in lines:
        if MARKER in line:
            marker = last_marker_line([line]) or marker
        if STAGE_MARKER in line:
            stage = last_stage([line]) or stage
    return marker, stage


def submitter_logs(core, namespace: str, rayjob_name: str) -> tuple[str | None, str | None]:
    """Stream the whole log of the RayJob's submitter pods: (last marker line, last stage).

    K8sJobMode: the submitter is a batch/v1 Job whose pods KubeRay labels with the RayJob's name;
    `follow.sh` in its `ray-job-submitter` container follows the driver's output. Training floods
    that with NCCL INFO lines from every rank after the preflight, so no tail limit: every line is
    scanned, one at a time. The marker is "" when logs were read but carry none, None when no log
    could be read.
    """
    from kubernetes.client.rest import ApiException

    pods = core.list_namespaced_pod(namespace, label_selector=f"{ORIGIN_LABEL}={rayjob_name}").items
    # Oldest first, so a later pod's (a retry's) result wins.
    pods = sorted(pods, key=lambda p: (str(p.metadata.creation_timestamp or ""), p.metadata.name))
    found, stage, read_any = None, None, False
    for pod in pods:
        try:
            response = core.read_namespaced_pod_log(pod.metadata.name, namespace, container=SUBMITTER_CONTAINER,
                                                    _preload_content=False, _request_timeout=300)
        except ApiException:
            continue  # a head or worker pod (no such container), or a pod already gone
        read_any = True
        try:
            line, pod_stage = _scan(iter_lines(response.stream(64 * 1024)))
        finally:
            response.release_conn()
        found, stage = line or found, pod_stage or stage
    if found is not None:
        return found, stage
    return ("" if read_any else None), stage


def submitter_marker(core, namespace: str, rayjob_name: str) -> str | None:
    """The last marker line of the RayJob's submitter logs (see `submitter_logs`)."""
    return submitter_logs(core, namespace, rayjob_name)[0]


# What each terminal RayJob reason (KubeRay 1.7.0 rayv1.JobFailedReason) means for the job, and the fix.
_REASONS = {
    "PreRunningDeadlineExceeded": (
        "waiting for the cluster",
        "the Ray cluster was not ready within job.start_deadline_minutes: usually no GPU capacity in "
        "gpu_availability_zone or too small an EC2 quota",
        "kubectl -n kube-system logs deploy/cluster-autoscaler | grep -i -E 'capacity|quota'; ask for quota, "
        "another zone or instance type, or a capacity reservation"),
    "DeadlineExceeded": (
        "deadline", "job.timeout_hours passed", "raise job.timeout_hours, or resubmit: the run resumes from its last "
        "checkpoint"),
    "SubmissionFailed": (
        "submission", "the submitter Job failed (it could not reach the head's Jobs API)",
        "kubectl -n ray logs -l ray.io/originated-from-cr-name=<rayjob> -c ray-job-submitter"),
    "JobStatusCheckTimeoutExceeded": (
        "submission", "the operator could not read the job's status for 5 minutes",
        "check the head pod and the NetworkPolicy's rule for the operator on port 8265"),
}
_STAGE_FIX = {
    None: ("plan", "the memory plan refused the job or could not run (job.sh's first step)",
           "python -m workloads.plan on your machine prints the refusal and the fix"),
    "settings": ("settings", "a job setting, the dataset or the storage was refused before any worker started",
                 "the driver's log (below) names the file, field and fix"),
    "storage": ("storage", "the job's storage refused a test object (credentials, bucket policy, endpoint)",
                "the driver's log names the error; python -m workloads.preflight checks the same"),
    "preflight": ("preflight", "the preflight failed (GPU, EFA, NCCL or S3 access)",
                  "python -m workloads.preflight on the cluster for the full table"),
    "train": ("training", "training failed after its retries (job.max_failures)",
              "the driver's log names the error; resubmitting resumes from the last checkpoint"),
    "deadline": ("deadline", "job.timeout_hours was spent across the RayJob's attempts (the driver stopped it "
                 "with status 0, so KubeRay did not retry)",
                 "resubmit to continue from the last checkpoint, or raise job.timeout_hours"),
    "export": ("export", "writing the final model failed", "check the bucket policy and free disk on rank 0's node"),
}


def job_logs_uri(config) -> str:
    """Where the job's driver log and each rank's last lines are kept (workloads.fsdp_finetune.job_logs)."""
    bucket = config.bucket_name("<account>")
    return f"{config.checkpoint_uri(bucket)}/{config.job.run_name}/logs/"


def check_job(rayjob: dict | None, stage: str | None, config) -> Row:
    """The latest RayJob's outcome: succeeded or under way (PASS), or failed, naming the stage that failed."""
    name = "last job"
    if rayjob is None:
        return Row(section="job", name=name, status="SKIP", detail="no RayJob submitted yet")
    job = rayjob["metadata"]["name"]
    status = rayjob.get("status") or {}
    deployment, job_status, reason = status.get("jobDeploymentStatus"), status.get("jobStatus"), status.get("reason")
    where = (f"kubectl -n {config.ray.namespace} logs -l {ORIGIN_LABEL}={job} -c {SUBMITTER_CONTAINER}; "
             f"driver.log and rank-<r>.log in {job_logs_uri(config)}")
    if deployment == "Complete" and job_status == "SUCCEEDED" and stage == "deadline":
        # A spent job.timeout_hours ends the driver with status 0 so that KubeRay does not retry it
        # (workloads/fsdp_finetune/deadline.py): SUCCEEDED for KubeRay, not for the run.
        label, what, fix = _STAGE_FIX["deadline"]
        return Row(section="job", name=name, status="FAIL", detail=f"RayJob {job} stopped at stage '{label}': {what}",
                   fix=f"{fix}; driver log: {where}")
    if deployment == "Complete" and job_status == "SUCCEEDED":
        return Row(section="job", name=name, status="PASS",
                   detail=f"RayJob {job} succeeded; GPU workers released, head kept {config.job.ttl_hours} h; "
                          f"driver log: {where}")
    if deployment != "Failed" and job_status not in ("FAILED", "STOPPED"):
        state = f"{deployment or 'New'}" + (f", stage {stage}" if stage else "")
        return Row(section="job", name=name, status="PASS", detail=f"RayJob {job} under way ({state})")
    if reason in _REASONS:
        label, what, fix = _REASONS[reason]
    else:
        label, what, fix = _STAGE_FIX.get(stage, (stage, f"the driver failed in stage {stage}", "see the driver's log"))
    message = status.get("message") or ""
    return Row(section="job", name=name, status="FAIL",
               detail=f"RayJob {job} failed at stage '{label}': {what}" + (f" ({message[:160]})" if message else ""),
               fix=f"{fix}; driver log: {where}")


def check_preflight(rayjob: dict | None, logs: str | None, config) -> Row:
    """The latest job's preflight verdict, from its marker line."""
    name = "last preflight"
    if not config.ray.preflight:
        return Row(section="job", name=name, status="SKIP", detail="ray.preflight is false in the variable file")
    if rayjob is None:
        return Row(section="job", name=name, status="SKIP", detail="no RayJob submitted yet")
    job = rayjob["metadata"]["name"]
    result = parse_preflight_marker(logs or "")
    if result is None:
        state = ((rayjob.get("status") or {}).get("jobStatus")) or "not started"
        return Row(section="job", name=name, status="WARN",
                   detail=f"RayJob {job} ({state}): no {MARKER} line in its logs (not run yet, or logs gone)")
    busbw = result.get("all_reduce_busbw_gbs")
    figures = f"network {result.get('network')}, all_reduce busbw {busbw} GB/s" if busbw is not None else (
        f"network {result.get('network')}")
    if result.get("ok"):
        return Row(section="job", name=name, status="PASS", detail=f"RayJob {job}: {figures}")
    failures = result.get("failures") or []
    return Row(section="job", name=name, status="FAIL",
               detail=f"RayJob {job}: {figures}; " + " | ".join(failures[:3]),
               fix="run python -m workloads.preflight on the cluster for the full table; see "
                   "docs/troubleshooting.md")


def evaluate(config, *, nodes: list, daemonsets: list, deployments: list, pods: list, rayjobs: list[dict],
             job_logs: str | None, job_stage: str | None = None) -> list[Row]:
    """Every verification row for one snapshot of the cluster.

    `job_logs`: log text holding the marker (`gather` passes just the last marker line, "" when the
    logs had none, None when they could not be read); `job_stage`: the driver's last JOB_STAGE."""
    job = latest_rayjob(rayjobs)
    gpu_nodes = sum(1 for n in nodes if (n.metadata.labels or {}).get(ROLE_LABEL) == "gpu")
    rows = check_gpu_nodes(nodes, config) + check_controllers(daemonsets, deployments, config, gpu_nodes=gpu_nodes)
    return (rows + check_ray_pods(pods, config, job)
            + [check_ray_auth(pods, config, job), check_preflight(job, job_logs, config),
               check_job(job, job_stage, config)])


def failed(rows: list[Row]) -> bool:
    """Whether any row failed."""
    return any(r.status == "FAIL" for r in rows)


def render(rows: list[Row]) -> str:
    """The rows as a table, then each failure's fix."""
    lines = table(("section", "check", "status", "detail"), [(r.section, r.name, r.status, r.detail) for r in rows])
    fails = [r for r in rows if r.status == "FAIL"]
    lines.append("")
    lines.append(f"verify: {'FAIL' if fails else 'PASS'} ({len(fails)} failure(s))")
    for r in fails:
        lines.append(f"  [{r.section}] {r.name}: {r.detail}")
        if r.fix:
            lines.append(f"      fix: {r.fix}")
    return "\n".join(lines)


def gather(config, *, kubeconfig: str | None = None, context: str | None = None, namespace: str | None = None) -> dict:
    """Read the cluster with the official client: nodes, DaemonSets, Deployments, Ray pods, RayJobs, job logs."""
    from kubernetes import client
    from kubernetes import config as kube_config
    from kubernetes.client.rest import ApiException

    kube_config.load_kube_config(config_file=kubeconfig, context=context)
    core, apps, custom = client.CoreV1Api(), client.AppsV1Api(), client.CustomObjectsApi()
    ns = namespace or config.ray.namespace
    try:
        rayjobs = custom.list_namespaced_custom_object("ray.io", "v1", ns, "rayjobs").get("items", [])
    except ApiException as exc:
        if exc.status != 404:
            raise
        rayjobs = []
    job = latest_rayjob(rayjobs)
    # K8sJobMode: the submitter Job's pods follow the driver's output; KubeRay keeps them after the cluster.
    logs, stage = submitter_logs(core, ns, job["metadata"]["name"]) if job else (None, None)
    return {
        "nodes": core.list_node().items,
        "daemonsets": apps.list_daemon_set_for_all_namespaces().items,
        "deployments": apps.list_deployment_for_all_namespaces().items,
        "pods": core.list_namespaced_pod(ns, label_selector=NODE_TYPE_LABEL).items,
        "rayjobs": rayjobs,
        "job_logs": logs,
        "job_stage": stage,
    }


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: 0 all passed, 1 a check failed, 2 cluster unreachable or bad variable file."""
    parser = argparse.ArgumentParser(prog="python -m workloads.verify", description="Verify a deployed cluster.")
    add_file_argument(parser)
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    parser.add_argument("--namespace", help="Ray namespace (default: ray.namespace)")
    args = parser.parse_args(argv)

    from config import load_or_exit

    config = load_or_exit(chosen_file(parser, args))
    if config.target == "ec2":
        raise UserError("verify: target: ec2 has no Kubernetes to read; run python -m workloads.verify_ec2 "
                        "(docs/ec2.md)")
    try:
        snapshot = gather(config, kubeconfig=args.kubeconfig, context=args.context, namespace=args.namespace)
    except Exception as exc:  # noqa: BLE001 - any client/config error means we could not look
        raise UserError(f"verify: cannot read the cluster: {type(exc).__name__}: {exc}\n"
                        f"  fix: aws eks update-kubeconfig --name {config.cluster.name} --region {config.region}, "
                        "or pass --kubeconfig") from None
    rows = evaluate(config, **snapshot)
    print(render(rows))
    return 1 if failed(rows) else 0


if __name__ == "__main__":
    from config.errors import run_cli

    run_cli(main)
