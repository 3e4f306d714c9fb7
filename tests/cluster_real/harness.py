"""The real-node tier's harness: control plane + KubeRay, one real kubelet node, the S3 server, a timeline.

- `Lab`: `../shared/k8s/lab up` (etcd, kube-apiserver, kube-controller-manager, kube-scheduler v1.34.9, the
  KubeRay v1.7.0 operator, kwok) with the operator's `--use-kubernetes-proxy` (the host has no cluster DNS: the
  operator reaches the head's dashboard through the API server's service proxy, kuberay v1.7.0 ray-operator/main.go
  `useKubernetesProxy`); `lab down` stops the PIDs it recorded. The kwok tier's harness (tests/k8s_lab.py, the
  other half of issue 32) starts the same script with the operator's flags rendered from the Helm values; this
  module keeps to the script's own interface so the two merge without a shared import.
- `Node`: `../shared/k8s-node/node up` (containerd with CRI, kubelet, kube-proxy, CNI bridge 10.244.0.1/24, dnsmasq
  cluster DNS), the stand-in image imported with `ctr`, the node labelled as the product's node selectors ask
  (derived from charts, not rewritten) and advertising the logical GPUs as `nvidia.com/gpu`; `node down` stops
  its PIDs, kills the pod containers, removes the bridge, routes and iptables rules.
- `S3`: moto's server on the node's bridge address (10.244.0.1), the only address both the host and the pods
  reach without leaving the machine.
- `Timeline`: a thread that polls the RayJob, its pods and the submitter's log once a second and records each
  change with its time since the start.

Every process is stopped by its PID, also when a step fails (`RealCluster.__exit__`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

# `available` is re-exported: the test skips on it, bench/cluster_real.py asks harness.cluster_real directly.
from harness.cluster_real import LAB_SCRIPT, NODE_SCRIPT, REPO, available  # noqa: F401
from harness.waiting import wait_for

CACHE = REPO / ".cache" / "cluster-real"
NODE_IP = "10.244.0.1"
NAMESPACE = "ray"


def _run(args: list[str], *, env: dict | None = None, timeout: float = 300, check: bool = True) -> str:
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} exited {result.returncode}:\n{result.stdout[-3000:]}\n"
                           f"{result.stderr[-3000:]}")
    return result.stdout


@dataclass
class Lab:
    dir: Path
    kubeconfig: Path = Path()

    def up(self) -> float:
        t0 = time.monotonic()
        env = {**os.environ, "LAB_KUBERAY_ARGS": "--use-kubernetes-proxy", "LAB_READY_TIMEOUT": "120"}
        env.pop("KUBECONFIG", None)
        self.dir.mkdir(parents=True, exist_ok=True)
        out = _run([str(LAB_SCRIPT), "up", str(self.dir)], env=env, timeout=400)
        self.kubeconfig = Path(out.strip().split("=", 1)[1])
        return time.monotonic() - t0

    def down(self) -> None:
        _run([str(LAB_SCRIPT), "down", str(self.dir)], timeout=120, check=False)


@dataclass
class Node:
    dir: Path
    kubeconfig: Path

    @property
    def kubectl(self) -> list[str]:
        return [str(self.dir / "bin" / "kubectl"), "--kubeconfig", str(self.kubeconfig)]

    def up(self, *, gpus: int, labels: dict[str, str], image_archive: Path, image: str) -> dict[str, float]:
        times = {}
        t0 = time.monotonic()
        env = {**os.environ, "SERVICE_CIDR": "10.96.0.0/16", "NODE_EXTRES": f"nvidia.com/gpu={gpus}",
               "NODE_IP": NODE_IP}
        try:
            _run([str(NODE_SCRIPT), "up", str(self.dir), str(self.kubeconfig)], env=env, timeout=400)
        except RuntimeError as exc:
            # `node up` starts the kubelet once `ctr version` answers, which can be before containerd's CRI plugin
            # has initialised on a loaded machine; the kubelet then exits at once ("validate CRI v1 runtime API
            # ...: server is not initialized", seen here) and `node up` times out on its healthz. Once more after
            # `node down`, which stops whatever the first try started.
            kubelet_log = self.dir / "logs" / "kubelet.log"
            if "server is not initialized" not in (kubelet_log.read_text(errors="replace") if kubelet_log.exists()
                                                   else ""):
                raise
            print(f"node up: the kubelet started before containerd's CRI; once more ({exc})".splitlines()[0])
            self.down()
            _run([str(NODE_SCRIPT), "up", str(self.dir), str(self.kubeconfig)], env=env, timeout=400)
        times["node up"] = time.monotonic() - t0
        t1 = time.monotonic()
        ctr = ["ctr", "-a", str(self.dir / "containerd" / "containerd.sock"), "-n", "k8s.io"]
        if image not in _run(ctr + ["images", "ls", "-q"]).split():
            _run(ctr + ["images", "import", str(image_archive)], timeout=300)
        times["image import"] = time.monotonic() - t1
        _run(self.kubectl + ["label", "node", "realnode", "--overwrite"] + [f"{k}={v}" for k, v in labels.items()])
        return times

    def down(self) -> None:
        _run([str(NODE_SCRIPT), "down", str(self.dir)], timeout=180, check=False)


class S3:
    """moto's server in this process, on the node's bridge address (pods reach it; nothing else does)."""

    BUCKET_KEYS = {"AWS_ACCESS_KEY_ID": "cluster-real", "AWS_SECRET_ACCESS_KEY": "cluster-real"}

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        with socket.socket() as probe:
            probe.bind((NODE_IP, 0))
            self.port = probe.getsockname()[1]
        self._server = ThreadedMotoServer(ip_address=NODE_IP, port=self.port, verbose=False)
        self._server.start()
        self.endpoint_url = f"http://{NODE_IP}:{self.port}"

    def client(self):
        import boto3

        return boto3.session.Session(region_name="us-east-2", aws_access_key_id="cluster-real",
                                     aws_secret_access_key="cluster-real").client("s3", endpoint_url=self.endpoint_url)

    def pod_env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL_S3": self.endpoint_url, **self.BUCKET_KEYS}

    def keys(self, bucket: str, prefix: str) -> list[str]:
        paginator = self.client().get_paginator("list_objects_v2")
        return [o["Key"] for page in paginator.paginate(Bucket=bucket, Prefix=prefix) for o in page.get("Contents", [])]

    def delete_prefix(self, bucket: str, prefix: str) -> None:
        client = self.client()
        for key in self.keys(bucket, prefix):
            client.delete_object(Bucket=bucket, Key=key)

    def stop(self) -> None:
        self._server.stop()


@dataclass
class Timeline:
    """What happened when: RayJob status, pods, submitter log lines, and the test's own marks."""

    kubectl: list[str]
    rayjob: str
    t0: float = field(default_factory=time.monotonic)
    events: list[tuple[float, str]] = field(default_factory=list)
    _state: dict = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def mark(self, text: str) -> float:
        t = time.monotonic() - self.t0
        self.events.append((t, text))
        return t

    def start(self) -> Timeline:
        self._thread = threading.Thread(target=self._poll, daemon=True, name="timeline")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)

    def first(self, needle: str) -> float | None:
        return next((t for t, text in self.events if needle in text), None)

    def render(self, title: str) -> str:
        return "\n".join([f"timeline: {title}"] + [f"  +{t:7.1f}s  {text}" for t, text in self.events])

    def _poll(self) -> None:
        while not self._stop.wait(1.0):
            with contextlib.suppress(Exception):
                self.observe()

    def observe(self) -> None:
        job = json.loads(_run(self.kubectl + ["get", "rayjob", "-n", NAMESPACE, self.rayjob, "-o", "json"],
                              timeout=30, check=False) or "{}")
        status = job.get("status", {})
        summary = (f"RayJob {status.get('jobDeploymentStatus', '-')}/{status.get('jobStatus', '-')}"
                   + (f" reason={status['reason']}" if status.get("reason") else "")
                   + (f" failed={status['failed']}" if status.get("failed") else "")
                   + (" statusCheckFailing" if status.get("jobStatusCheckFailureStartTime") else ""))
        self._change("rayjob", summary)
        pods = json.loads(_run(self.kubectl + ["get", "pods", "-n", NAMESPACE, "-o", "json"], timeout=30,
                               check=False) or "{}")
        for pod in pods.get("items", []):
            name = pod["metadata"]["name"]
            ready = all(c.get("ready") for c in pod.get("status", {}).get("containerStatuses", []) or [{}])
            restarts = sum(c.get("restartCount", 0) for c in pod.get("status", {}).get("containerStatuses", []) or [])
            deleting = " deleting" if pod["metadata"].get("deletionTimestamp") else ""
            self._change(f"pod/{name}", f"pod {name} {pod['status'].get('phase')}"
                         f"{' ready' if ready and pod['status'].get('phase') == 'Running' else ''}"
                         f"{f' restarts={restarts}' if restarts else ''}{deleting}")
            if name.startswith(self.rayjob) and "submitter" not in name and "head" not in name and \
                    "worker" not in name and pod["status"].get("phase") in ("Running", "Succeeded", "Failed"):
                log = _run(self.kubectl + ["logs", "-n", NAMESPACE, name], timeout=30, check=False)
                for line in log.splitlines():
                    if line.startswith("follow.sh:") and ("follow", line) not in self._state:
                        self._state[("follow", line)] = True
                        self.mark(f"submitter: {line}")
        gone = [k for k in self._state if isinstance(k, str) and k.startswith("pod/")
                and k[4:] not in {p["metadata"]["name"] for p in pods.get("items", [])}]
        for key in gone:
            del self._state[key]
            self.mark(f"pod {key[4:]} gone")

    def _change(self, key: str, value: str) -> None:
        if self._state.get(key) != value:
            self._state[key] = value
            self.mark(value)


def wait(condition, timeout_s: float, what: str, detail=str):
    return wait_for(condition, timeout_s, what, interval_s=1.0, detail=detail)
