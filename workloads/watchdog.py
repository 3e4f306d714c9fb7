"""`python -m workloads.watchdog`: bound the failures KubeRay 1.7.0 leaves holding GPU nodes for hours.

It runs as one small pod beside the RayJob (dist/ray-watchdog.k8s.yaml, `charts.watchdog`), from the code ConfigMap,
in the Ray image, with the standard library only. Every `--period` seconds it lists the RayJob, the RayClusters, the
pods and the submitter Job of its namespace and the nodes, applies the pure rules below to them, and carries out
what they decide, one log line per decision (which rule, what, why). The rules (KubeRay v1.7.0 source,
ray-operator/controllers/ray/, at tag v1.7.0):

- `submitter_rule`: the submitter pod has not been Running for `--submitter-start` seconds -> delete the RayJob.
  In K8sJobMode the RayJob turns Running as soon as the submitter Job is created (rayjob_controller.go L230-236),
  and in Running only activeDeadlineSeconds (`checkActiveDeadlineAndUpdateStatusIfNeeded`, L254, L1234) and the
  submitter's own end (`checkSubmitterAndUpdateStatusIfNeeded`, K8sJobMode L1138-1170: a failed Job, never a Pending
  pod) end it: an unschedulable submitter held the GPU workers for `job.timeout_hours` (the cluster tier measured
  the RayJob still Running with its workers up).
- `head_rule`: the head container restarted `--head-restarts` times, or the head pod has not been Ready for
  `--head-ready` seconds -> delete the RayJob. The RayJob waits in Initializing for a Ready RayCluster (L208-217)
  until preRunningDeadlineSeconds (L188, L1249) fails it, and that failure is retried on a new cluster
  (`checkBackoffLimitAndUpdateStatusIfNeeded`, L518): (job.retries + 1) x job.start_deadline_minutes with GPU nodes up.
- `stopped_rule`: the RayJob ended Complete with a jobStatus no deletion rule names (STOPPED, a raw `ray job stop`)
  and its RayCluster is still there -> delete the RayCluster, keep the RayJob (`workloads.stopping`).
- `node_lost_rule`: a Ray pod Terminating for `--node-lost` seconds on a node that is gone or not Ready -> delete it
  with grace 0. The kubelet that would confirm the deletion is gone; KubeRay counts such a pod as one of the group's
  replicas (raycluster_controller.go L1155-1167: every listed pod but WorkersToDelete is in `runningPods`), so no
  replacement is created until something removes it (the pod GC does so only once the Node object is deleted).

Deleting the RayJob is the one way to stop a running RayJob here: its finalizer stops the Ray job and the RayCluster
and the submitter Job go with it; a suspend is refused beside deletion rules (`workloads.stopping` cites the lines).
The run's checkpoints stay in S3: applying dist/ray-job.k8s.yaml again resumes from the last one.

Exit: it runs until killed; 2 on bad arguments. `--once` makes one pass (what the tests and a person use).
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from workloads.stopping import Delete, ended, no_rule_frees, status_of, stop_plan

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
SUBMITTER_JOB_LABEL = "batch.kubernetes.io/job-name"
"""The label the Job controller puts on its pods (kubernetes batch/v1); KubeRay names the Job after the RayJob."""
RAY_CLUSTER_LABEL = "ray.io/cluster"
RAY_NODE_TYPE_LABEL = "ray.io/node-type"


@dataclass(frozen=True)
class Settings:
    """The watchdog's limits, in seconds (the chart renders them from the variable file's `job` and
    `autoscaling` fields; the watchdog itself reads no variable file)."""

    namespace: str
    rayjob: str
    period_s: float = 30
    submitter_start_s: float = 180
    head_restart_limit: int = 3
    head_ready_s: float = 600
    node_lost_s: float = 60


@dataclass(frozen=True)
class Snapshot:
    """What one pass saw: the RayJob (None when there is none), the RayClusters, the submitter Job (or None), the
    namespace's pods and the cluster's nodes, as the API server's JSON."""

    rayjob: dict | None
    rayclusters: list[dict]
    submitter_job: dict | None
    pods: list[dict]
    nodes: list[dict]


@dataclass(frozen=True)
class Decision:
    rule: str
    actions: list[Delete]
    why: str

    def line(self) -> str:
        return f"watchdog: rule={self.rule} {'; '.join(map(str, self.actions))}: {self.why}"


# ---------------------------------------------------------------- reading the API's objects

def parse_time(value: str | None) -> float | None:
    """An RFC 3339 timestamp of the API server (`2026-12-05T09:05:00Z`) as seconds since the epoch."""
    if not value:
        return None
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def _name(obj: dict) -> str:
    return obj["metadata"]["name"]


def _labels(obj: dict) -> dict:
    return obj["metadata"].get("labels") or {}


def _condition(obj: dict, kind: str) -> dict | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def _deleting(obj: dict) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


def _phase(pod: dict) -> str:
    return (pod.get("status") or {}).get("phase") or "Pending"


def _restarts(pod: dict) -> int:
    return max((c.get("restartCount") or 0 for c in (pod.get("status") or {}).get("containerStatuses") or []),
               default=0)


def _running_job(rayjob: dict | None) -> bool:
    """A RayJob the operator still drives (not ended, not being deleted)."""
    return rayjob is not None and not _deleting(rayjob) and not ended(rayjob)


# ---------------------------------------------------------------- the rules: pure functions of a snapshot and now

def submitter_rule(snap: Snapshot, now: float, s: Settings) -> list[Decision]:
    """The submitter Job exists (RayJob Running) but no pod of it runs or ran for `submitter_start_s`: since the
    newest pod's creation (a retried pod gets its own time), or since the Job's when it has made no pod."""
    job = snap.rayjob
    if not _running_job(job) or status_of(job).get("jobDeploymentStatus") != "Running" or snap.submitter_job is None:
        return []
    pods = [p for p in snap.pods if _labels(p).get(SUBMITTER_JOB_LABEL) == s.rayjob]
    if any(_phase(p) in ("Running", "Succeeded") for p in pods):
        return []
    newest = max(pods, key=lambda p: parse_time(p["metadata"].get("creationTimestamp")) or 0, default=None)
    if newest is not None and _phase(newest) == "Failed":
        return []  # the Job's own backoffLimit and KubeRay's SubmissionFailed handle a pod that ran and failed
    since = parse_time((newest or snap.submitter_job)["metadata"].get("creationTimestamp"))
    if since is None or now - since < s.submitter_start_s:
        return []
    what = (f"pod {_name(newest)} {_phase(newest)}" if newest is not None else "no pod created")
    plan, how = stop_plan(job)
    return [Decision("submitter-start", plan, f"submitter Job {s.rayjob}: {what} for {now - since:.0f} s "
                     f"(limit {s.submitter_start_s:.0f} s, job.submitter_start_minutes); {how}")]


def head_rule(snap: Snapshot, now: float, s: Settings) -> list[Decision]:
    """The head of the RayJob's cluster restarted `head_restart_limit` times, or has not been Ready for
    `head_ready_s` (since its Ready condition last changed, or since the pod was created)."""
    job = snap.rayjob
    if not _running_job(job):
        return []
    cluster = status_of(job).get("rayClusterName")
    heads = [p for p in snap.pods if cluster and _labels(p).get(RAY_CLUSTER_LABEL) == cluster
             and _labels(p).get(RAY_NODE_TYPE_LABEL) == "head" and not _deleting(p)]
    for head in heads:
        restarts = _restarts(head)
        ready = _condition(head, "Ready") or {}
        why = None
        if restarts >= s.head_restart_limit:
            why = (f"head pod {_name(head)} restarted {restarts} times (limit {s.head_restart_limit}, "
                   "job.head_restart_limit)")
        elif ready.get("status") != "True":
            since = parse_time(ready.get("lastTransitionTime")) or parse_time(head["metadata"].get("creationTimestamp"))
            if since is not None and now - since >= s.head_ready_s:
                why = (f"head pod {_name(head)} not Ready for {now - since:.0f} s (limit {s.head_ready_s:.0f} s, "
                       "job.head_ready_minutes)")
        if why:
            plan, how = stop_plan(job)
            return [Decision("head", plan, f"{why}; {how}")]
    return []


def stopped_rule(snap: Snapshot, now: float, s: Settings) -> list[Decision]:
    """An ended RayJob that no deletion rule frees (Complete/STOPPED) whose RayCluster is still there."""
    job = snap.rayjob
    if job is None or _deleting(job) or not no_rule_frees(job):
        return []
    cluster = status_of(job).get("rayClusterName")
    present = [c for c in snap.rayclusters if _name(c) == cluster and not _deleting(c)]
    if not present:
        return []
    plan, how = stop_plan(job)
    return [Decision("stopped", plan, f"jobStatus {status_of(job).get('jobStatus')}: no deletion rule matches it "
                     f"(rules name SUCCEEDED, FAILED); {how}")]


def _node_lost(node: dict | None) -> bool:
    if node is None:
        return True
    ready = _condition(node, "Ready") or {}
    return ready.get("status") != "True"


def node_lost_rule(snap: Snapshot, now: float, s: Settings) -> list[Decision]:
    """Ray pods Terminating for `node_lost_s` (past their own grace period) on a node gone or not Ready."""
    nodes = {_name(n): n for n in snap.nodes}
    decisions = []
    for pod in snap.pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        if RAY_CLUSTER_LABEL not in _labels(pod) or not _deleting(pod) or not node_name:
            continue
        if not _node_lost(nodes.get(node_name)):
            continue
        since = parse_time(pod["metadata"]["deletionTimestamp"])  # already the end of the pod's grace period
        if since is None or now - since < s.node_lost_s:
            continue
        state = "gone" if node_name not in nodes else "not Ready"
        decisions.append(Decision("node-lost", [Delete("pods", _name(pod), force=True)],
                                  f"pod {_name(pod)} Terminating for {now - since:.0f} s past its grace on node "
                                  f"{node_name} ({state}; limit {s.node_lost_s:.0f} s, "
                                  "autoscaling.node_lost_seconds): no kubelet will confirm it, and KubeRay counts it "
                                  "until it is gone"))
    return decisions


RULES: tuple[Callable[[Snapshot, float, Settings], list[Decision]], ...] = (
    submitter_rule, head_rule, stopped_rule, node_lost_rule)


def decide(snap: Snapshot, now: float, s: Settings) -> list[Decision]:
    """Every rule's decisions for one snapshot (a RayJob is deleted once, whichever rule asks first)."""
    decisions, seen = [], set()
    for rule in RULES:
        for decision in rule(snap, now, s):
            if not set(decision.actions) & seen:
                decisions.append(decision)
                seen |= set(decision.actions)
    return decisions


# ---------------------------------------------------------------- the thin adapter: the API server over urllib

class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status


@dataclass
class Api:
    """The Kubernetes REST API with a bearer token: in a pod, its service account's token and CA."""

    server: str
    token_file: str
    ca_file: str | None
    timeout_s: float = 20

    @classmethod
    def in_cluster(cls) -> Api:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise SystemExit("watchdog: KUBERNETES_SERVICE_HOST is not set: run it in a pod, or pass --server, "
                             "--token-file and --ca-file")
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", f"{SERVICE_ACCOUNT_DIR}/token", f"{SERVICE_ACCOUNT_DIR}/ca.crt")

    def _call(self, method: str, path: str, body: dict | None = None, query: dict | None = None) -> dict | None:
        url = f"{self.server}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        with open(self.token_file) as handle:  # re-read each call: the kubelet rotates projected tokens
            token = handle.read().strip()
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method, headers={
            "Authorization": f"Bearer {token}", "Accept": "application/json",
            **({"Content-Type": "application/json"} if data else {})})
        context = ssl.create_default_context(cafile=self.ca_file) if url.startswith("https") else None
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=context) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise ApiError(exc.code, exc.read().decode(errors="replace")[:500]) from None

    def get(self, path: str, **query) -> dict | None:
        return self._call("GET", path, query=query or None)

    def delete(self, path: str, body: dict) -> None:
        self._call("DELETE", path, body)


def paths(namespace: str) -> dict[str, str]:
    return {"rayjobs": f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs",
            "rayclusters": f"/apis/ray.io/v1/namespaces/{namespace}/rayclusters",
            "jobs": f"/apis/batch/v1/namespaces/{namespace}/jobs",
            "pods": f"/api/v1/namespaces/{namespace}/pods"}


def observe(api: Api, s: Settings) -> Snapshot:
    where = paths(s.namespace)
    items = lambda listing: (listing or {}).get("items") or []  # noqa: E731
    try:
        nodes = items(api.get("/api/v1/nodes"))
    except ApiError as exc:  # without the ClusterRole the node rule sees every node as gone: better see none
        if exc.status != 403:
            raise
        nodes = None
    pods = items(api.get(where["pods"]))
    if nodes is None:
        pods = [p for p in pods if not _deleting(p)]
        nodes = []
    return Snapshot(rayjob=api.get(f"{where['rayjobs']}/{s.rayjob}"), rayclusters=items(api.get(where["rayclusters"])),
                    submitter_job=api.get(f"{where['jobs']}/{s.rayjob}"), pods=pods, nodes=nodes)


def carry_out(api: Api, s: Settings, decision: Decision, log: Callable[[str], None]) -> None:
    where = paths(s.namespace)
    for action in decision.actions:
        body = {"propagationPolicy": "Background", **({"gracePeriodSeconds": 0} if action.force else {})}
        try:
            api.delete(f"{where[action.resource]}/{action.name}", body)
        except ApiError as exc:
            log(f"watchdog: rule={decision.rule} {action} failed: {exc}")


def run_once(api: Api, s: Settings, *, now: float | None = None, log: Callable[[str], None] = print) -> list[Decision]:
    decisions = decide(observe(api, s), time.time() if now is None else now, s)
    for decision in decisions:
        log(decision.line())
        carry_out(api, s, decision, log)
    return decisions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workloads.watchdog", description=__doc__.split("\n\n")[0])
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--rayjob", required=True, help="the RayJob's name")
    parser.add_argument("--period", type=float, default=30, help="seconds between passes (job.watchdog_period_seconds)")
    parser.add_argument("--submitter-start", type=float, default=180, help="seconds (job.submitter_start_minutes)")
    parser.add_argument("--head-restarts", type=int, default=3, help="restarts (job.head_restart_limit)")
    parser.add_argument("--head-ready", type=float, default=600, help="seconds (job.head_ready_minutes)")
    parser.add_argument("--node-lost", type=float, default=60, help="seconds (autoscaling.node_lost_seconds)")
    parser.add_argument("--server", help="API server URL (default: the pod's KUBERNETES_SERVICE_HOST)")
    parser.add_argument("--token-file", help="bearer token file (default: the pod's service account token)")
    parser.add_argument("--ca-file", help="CA bundle of the API server (default: the pod's service account CA)")
    parser.add_argument("--once", action="store_true", help="one pass, then exit")
    args = parser.parse_args(argv)
    for name in ("period", "submitter_start", "head_ready", "node_lost"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0 seconds")
    s = Settings(namespace=args.namespace, rayjob=args.rayjob, period_s=args.period,
                 submitter_start_s=args.submitter_start, head_restart_limit=args.head_restarts,
                 head_ready_s=args.head_ready, node_lost_s=args.node_lost)
    if args.server:
        if not args.token_file:
            parser.error("--server needs --token-file")
        api = Api(args.server, args.token_file, args.ca_file)
    else:
        api = Api.in_cluster()
    print(f"watchdog: watching RayJob {s.namespace}/{s.rayjob} every {s.period_s:g} s ({s})", flush=True)
    while True:
        try:
            run_once(api, s, log=lambda line: print(line, flush=True))
        except Exception as exc:  # noqa: BLE001 - an API server away, an object of an unexpected shape: one line,
            # and the next pass; the watchdog must outlive anything one pass meets
            print(f"watchdog: pass failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        if args.once:
            return 0
        time.sleep(s.period_s)


if __name__ == "__main__":
    raise SystemExit(main())
