"""The cluster test tier's harness: a real control plane with the real KubeRay operator, shaped by the project.

`../shared/k8s/lab` (README beside it) starts etcd 3.6, kube-apiserver, kube-controller-manager and
kube-scheduler v1.34.9, kwok v0.8.0 and the KubeRay operator v1.7.0 on loopback. This module is the one place the
tests (tests/cluster/, `make cluster-test`, and the real-node tier) start, shape and stop it:

- `operator_settings(values)`: the operator's flags and environment from the project's Helm values for the
  KubeRay add-on, rendered from the pinned chart by the real helm (tests/helm.py), so the lab's operator runs
  with the feature gates and timers the EKS add-on gets; `flag_drift` names every flag that differs beyond
  `ALLOWED_FLAG_DIFFERENCES`.
- `node_shapes(templates)`: the Kubernetes nodes the synthesized `AWS::EKS::Nodegroup`s would register
  (instance type, labels, taints, capacity from config/instances.yaml, huge pages from the launch template).
- `Lab`: `start()` / `stop()` (`lab up` / `lab down`, binaries unpacked once into `.cache/k8s-lab/bin`),
  `create_node`, the Kubernetes API clients, `apply` (server-side apply, optionally dry-run), waits.

Nothing here runs against a cluster the tier did not start, except `K8S_TIER_KUBECONFIG` (see `HOW_TO_GET`).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from config.loader import REPO_ROOT
from harness.waiting import wait_for

LAB_ENV = "K8S_LAB"
"""Path of the `lab` script, where it is not at ../shared/k8s/lab beside the repository."""
REQUIRED_ENV = "CLUSTER_TIER_REQUIRED"
"""Set by `make cluster-test`: a missing lab fails the tier instead of skipping it."""
CACHE = REPO_ROOT / ".cache" / "k8s-lab"
KUBERAY_CHART = "kuberay-operator-1.7.0"
KUBE_VERSION = "1.34.9"

HOW_TO_GET = (
    "the cluster tier needs the k8s lab: etcd 3.6.5, kube-apiserver/kube-controller-manager/kube-scheduler v1.34.9, "
    "kwok v0.8.0 and kuberay-operator v1.7.0 with its `lab` driver script. CI has it at ../shared/k8s beside the "
    "repository. Elsewhere: download the upstream release binaries at those versions (github.com/etcd-io/etcd "
    "releases v3.6.5; dl.k8s.io/release/v1.34.9/bin/linux/amd64/<name>; github.com/kubernetes-sigs/kwok releases "
    "v0.8.0; the kuberay-operator binary built from github.com/ray-project/kuberay tag v1.7.0, ray-operator/), "
    "lay them out as ../shared/k8s/README.md describes (bin/*.xz with SHA256SUMS, crds/, config/kwok-stages.yaml) "
    f"and set {LAB_ENV}=/path/to/lab")

# Flags the lab's operator may run with that the EKS add-on's Deployment does not, or the other way round, and why.
# Anything else that differs is drift, and test_operator_matches_the_addon fails on it.
ALLOWED_FLAG_DIFFERENCES = {
    "--enable-leader-election": "one operator process, no second replica to elect against",
    "--metrics-addr": "off in the lab (0); the add-on serves metrics on :8080 for the liveness probe",
    "--enable-metrics": "the metrics server is off in the lab (--metrics-addr 0)",
    "--health-probe-bind-address": "a free loopback port in the lab; the add-on's default :8082",
    "--use-kubernetes-proxy": "the lab has no cluster DNS: the operator reaches the Ray dashboard through the "
                              "API server's service proxy (kuberay v1.7.0 ray-operator/main.go useKubernetesProxy)",
    "--kubeconfig": "the operator runs outside the cluster with the lab's client certificate",
    "--log-stdout-encoder": "the lab reads 'Starting workers' from the console log to know the controllers synced",
    "--log-file-encoder": "no log file is written (no --log-file-path) either way",
}


def lab_script() -> Path | None:
    """The `lab` driver: $K8S_LAB, else ../shared/k8s/lab beside the repository; None when neither exists."""
    named = os.environ.get(LAB_ENV)
    candidates = [Path(named)] if named else []
    candidates.append(REPO_ROOT.parent / "shared" / "k8s" / "lab")
    return next((c for c in candidates if c.is_file()), None)


def chart_folder() -> Path:
    from tests.vendored import chart_dir

    return chart_dir(KUBERAY_CHART)


# ---------------------------------------------------------------- the operator as the add-on runs it

def kuberay_values(templates: list[dict]) -> dict:
    """The values the cluster stack gives the KubeRay chart: the `Custom::AWSCDK-EKS-HelmChart` resource's
    `Values` in a synthesized template (what the kubectl Lambda passes to `helm upgrade --install`)."""
    for template in templates:
        for resource in template.get("Resources", {}).values():
            props = resource.get("Properties", {})
            if resource.get("Type") == "Custom::AWSCDK-EKS-HelmChart" and props.get("Chart") == "kuberay-operator":
                return json.loads(props.get("Values") or "{}")
    raise AssertionError("no kuberay-operator Custom::AWSCDK-EKS-HelmChart in the synthesized templates")


def render_operator(values: dict) -> dict:
    """The operator container of the chart's Deployment, rendered by the kubectl layer's helm with `values`."""
    from stacks.versions import kuberay_operator
    from tests.helm import template

    pin = kuberay_operator("1.7.0")
    objects = template(chart_folder(), release=pin.release, namespace=pin.namespace, values=values,
                       kube_version=KUBE_VERSION)
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def parse_flags(args: list[str]) -> dict[str, str]:
    """`--name=value` and `--name value` arguments as {name: value} (a bare `--name` maps to "")."""
    out, i = {}, 0
    while i < len(args):
        name, equals, value = args[i].partition("=")
        if not equals and i + 1 < len(args) and not args[i + 1].startswith("-"):
            value, i = args[i + 1], i + 1
        out[name] = value
        i += 1
    return out


def operator_settings(values: dict, extra_env: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """(flags, environment) for the lab's operator from the chart rendered with `values` plus `extra_env` (a test's
    shorter operator timers go through the chart's `env` value, as an operator of the cluster would set them)."""
    values = dict(values)
    if extra_env:
        values["env"] = list(values.get("env") or []) + [{"name": k, "value": v} for k, v in extra_env.items()]
    container = render_operator(values)
    args = [f"{name}={value}" for name, value in parse_flags(container.get("args", [])).items()
            if name not in ALLOWED_FLAG_DIFFERENCES]
    env = {}
    for item in container.get("env") or []:
        if "value" not in item:
            raise AssertionError(f"operator env {item['name']} comes from {sorted(item)}: the lab cannot resolve it")
        env[item["name"]] = str(item["value"])
    return args, env


def flag_drift(rendered_args: list[str], running_args: list[str]) -> list[str]:
    """Flags that differ between the rendered Deployment and the running operator, beyond the allowed ones."""
    rendered, running = parse_flags(rendered_args), parse_flags(running_args)
    drift = []
    for name in sorted(set(rendered) | set(running)):
        if name in ALLOWED_FLAG_DIFFERENCES:
            continue
        if rendered.get(name) != running.get(name):
            drift.append(f"{name}: add-on {rendered.get(name)!r}, lab {running.get(name)!r}")
    return drift


# ---------------------------------------------------------------- nodes from the synthesized node groups

@dataclass(frozen=True, kw_only=True)
class NodeShape:
    """One node group's node as Kubernetes would see it."""

    group: str
    """The EKS node group's logical id."""
    instance_type: str
    count: int
    """Nodes the group runs when a job has scaled it up: its MaxSize (GPU groups scale 0..max)."""
    labels: dict[str, str]
    taints: list[dict]
    capacity: dict[str, str]
    allocatable: dict[str, str]

    @property
    def gpus(self) -> int:
        return int(self.capacity.get("nvidia.com/gpu", "0"))


_TAINT_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
_HUGEPAGES_RE = re.compile(r"vm\.nr_hugepages\s*=\s*(\d+)")


def _user_data(template: dict, launch_template_ref: dict | None) -> str:
    if not launch_template_ref:
        return ""
    logical = launch_template_ref.get("Id", {}).get("Ref")
    data = template["Resources"].get(logical, {}).get("Properties", {}).get("LaunchTemplateData", {})
    encoded = data.get("UserData", {})
    text = encoded.get("Fn::Base64", "") if isinstance(encoded, dict) else base64.b64decode(encoded).decode()
    return text if isinstance(text, str) else json.dumps(text)


def _instance_type(template: dict, props: dict) -> str:
    if props.get("InstanceTypes"):
        return props["InstanceTypes"][0]
    logical = props.get("LaunchTemplate", {}).get("Id", {}).get("Ref")
    return template["Resources"][logical]["Properties"]["LaunchTemplateData"]["InstanceType"]


def node_shapes(templates: list[dict]) -> list[NodeShape]:
    """Every `AWS::EKS::Nodegroup` of the synthesized templates as a node shape: instance type (the node group's or
    its launch template's), labels and taints as EKS registers them, capacity from config/instances.yaml, the
    allocatable the EKS bootstrap leaves (config.resources), and 2 MiB huge pages where the launch template's user
    data sets vm.nr_hugepages (the kubelet reports them and takes them out of allocatable memory)."""
    from config.catalog import load_catalog
    from config.resources import _allocatable

    catalog = load_catalog()
    shapes = []
    for template in templates:
        for logical, resource in template.get("Resources", {}).items():
            if resource.get("Type") != "AWS::EKS::Nodegroup":
                continue
            props = resource["Properties"]
            itype = _instance_type(template, props)
            facts = catalog.get(itype)
            if facts is None:
                raise AssertionError(f"{logical}: instance type {itype} is not in config/instances.yaml")
            cpu_m, mem_mib = _allocatable(facts)
            match = _HUGEPAGES_RE.search(_user_data(template, props.get("LaunchTemplate")))
            huge_mib = int(match.group(1)) * 2 if match else 0
            max_pods = "110" if facts.vcpus < 30 else "250"
            capacity = {"cpu": str(facts.vcpus), "memory": f"{facts.memory_gib}Gi", "pods": max_pods,
                        "ephemeral-storage": "500Gi"}
            allocatable = {"cpu": f"{cpu_m}m", "memory": f"{mem_mib - huge_mib}Mi", "pods": max_pods,
                           "ephemeral-storage": "500Gi"}
            for table in (capacity, allocatable):
                if facts.gpus:
                    table["nvidia.com/gpu"] = str(facts.gpus)
                if facts.efa_interfaces and props.get("Labels", {}).get("vpc.amazonaws.com/efa.present") == "true":
                    table["vpc.amazonaws.com/efa"] = str(facts.efa_interfaces)
                if huge_mib:
                    table["hugepages-2Mi"] = f"{huge_mib}Mi"
            taints = [{"key": t["Key"], **({"value": t["Value"]} if t.get("Value") else {}),
                       "effect": _TAINT_EFFECTS[t["Effect"]]} for t in props.get("Taints", [])]
            shapes.append(NodeShape(group=logical, instance_type=itype, count=props["ScalingConfig"]["MaxSize"],
                                    labels=dict(props.get("Labels", {})), taints=taints, capacity=capacity,
                                    allocatable=allocatable))
    return shapes


# ---------------------------------------------------------------- the lab

@dataclass
class Lab:
    """A started lab: its folder, kubeconfig and clients."""

    dir: Path
    kubeconfig: Path
    operator_args: list[str] = field(default_factory=list)
    operator_env: dict[str, str] = field(default_factory=dict)
    addon_values: dict = field(default_factory=dict)
    """The Helm values the operator's flags and environment were rendered from."""
    _clients: dict = field(default_factory=dict)

    # -- clients
    @property
    def api_client(self):
        if "api" not in self._clients:
            from kubernetes import config as kconfig

            self._clients["api"] = kconfig.new_client_from_config(config_file=str(self.kubeconfig))
        return self._clients["api"]

    @property
    def core(self):
        from kubernetes import client

        return client.CoreV1Api(self.api_client)

    @property
    def batch(self):
        from kubernetes import client

        return client.BatchV1Api(self.api_client)

    @property
    def custom(self):
        from kubernetes import client

        return client.CustomObjectsApi(self.api_client)

    @property
    def dynamic(self):
        if "dynamic" not in self._clients:
            from kubernetes.dynamic import DynamicClient

            self._clients["dynamic"] = DynamicClient(self.api_client)
        return self._clients["dynamic"]

    # -- objects
    def apply(self, objects: list[dict], *, dry_run: bool = False, manager: str = "cluster-tier") -> list[dict]:
        """Server-side apply of every object in order (`kubectl apply --server-side`), `dry_run`: the API server's
        dry run (admission, schema, defaulting), nothing stored."""
        out = []
        for obj in objects:
            resource = self.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
            kwargs = {"dry_run": "All"} if dry_run else {}
            result = self.dynamic.server_side_apply(resource, body=obj, field_manager=manager,
                                                    force_conflicts=True, **kwargs)
            out.append(result.to_dict())
        return out

    def delete(self, objects: list[dict]) -> None:
        from kubernetes.dynamic.exceptions import NotFoundError

        for obj in reversed(objects):
            resource = self.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
            with contextlib.suppress(NotFoundError):
                self.dynamic.delete(resource, name=obj["metadata"]["name"],
                                    namespace=obj["metadata"].get("namespace"),
                                    body={"propagationPolicy": "Background"})

    def ensure_namespace(self, name: str) -> None:
        self.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}])
        # The ServiceAccount admission plugin refuses pods until the namespace's `default` account exists.
        wait_for(lambda: self.core.list_namespaced_service_account(name, field_selector="metadata.name=default")
                 .items, 30, f"the default ServiceAccount of namespace {name}")

    # -- nodes
    def create_node(self, name: str, shape: NodeShape, *, zone: str) -> None:
        """A kwok-managed Node of `shape` (as `lab node` makes them, plus huge pages, which `lab node` cannot
        set), Ready and without the node.kubernetes.io/not-ready taint when this returns."""
        region = zone[:-1]
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  "node.kubernetes.io/instance-type": shape.instance_type, "topology.kubernetes.io/zone": zone,
                  "topology.kubernetes.io/region": region, "eks.amazonaws.com/nodegroup": shape.group,
                  "eks.amazonaws.com/capacityType": "ON_DEMAND", **shape.labels}
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": labels,
                             "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"}},
                "spec": {"taints": shape.taints, "providerID": f"aws:///{zone}/i-{abs(hash(name)) % 16**17:017x}"},
                "status": {"capacity": shape.capacity, "allocatable": shape.allocatable}}
        self.core.create_node(node)

        def ready():
            n = self.core.read_node(name)
            conditions = {c.type: c.status for c in (n.status.conditions or [])}
            pending_taints = [t for t in (n.spec.taints or []) if t.key.startswith("node.kubernetes.io/")]
            return conditions.get("Ready") == "True" and not pending_taints

        wait_for(ready, 30, f"node {name} Ready without node.kubernetes.io taints", interval_s=0.2)

    # -- processes
    def pid_of(self, component: str) -> int:
        """The PID of the lab's `component` (its last line in the lab's pids file: a restart appends one)."""
        last = None
        for line in (self.dir / "pids").read_text().splitlines():
            pid, name = line.split()
            if name == component:
                last = int(pid)
        if last is None:
            raise RuntimeError(f"{self.dir / 'pids'}: no {component} process")
        return last

    def operator_pid(self) -> int:
        return self.pid_of("kuberay-operator")

    def _restart(self, component: str, while_stopped=None) -> tuple[float, int]:
        """Stop `component` by its PID, call `while_stopped`, start it again with the same command line and
        environment (the new PID joins the pids file, so `lab down` stops it); (when the stop began, the log's
        length before the restart)."""
        pid = self.pid_of(component)
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        environ = dict(item.split("=", 1) for item in
                       Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if "=" in item)
        started = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 15, f"the lab's {component} to exit")
        if while_stopped is not None:
            while_stopped()
        log = self.dir / "logs" / f"{component}.log"
        offset = log.stat().st_size
        with open(log, "ab") as out:
            proc = subprocess.Popen([c.decode() for c in cmdline], cwd=self.dir, env=environ, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        with open(self.dir / "pids", "a") as pids:
            pids.write(f"{proc.pid} {component}\n")
        return started, offset

    def restart_operator(self) -> float:
        """Stop the operator by its PID and start it again with the same command line and environment (as a pod
        restart would); seconds until it has synced its controllers again."""
        started, offset = self._restart("kuberay-operator")
        log = self.dir / "logs" / "kuberay-operator.log"

        def synced():
            text = log.read_bytes()[offset:].decode(errors="replace")
            return all(f"controllers.{c}\tStarting workers" in text for c in ("RayCluster", "RayJob"))

        wait_for(synced, 60, "the restarted operator to sync", interval_s=0.2)
        return time.monotonic() - started

    def restart_kwok(self, while_stopped) -> None:
        """Restart the lab's kwok around `while_stopped` (which changes nodes while no kwok watches them): a node
        that lost its kwok.x-k8s.io/node annotation meanwhile is left alone from then on, as a dead kubelet leaves
        its node. A running kwok cannot be told so: kwok v0.8.0's informer drops an update whose new object fails
        its selector (pkg/utils/informer/informer.go newCacheInformer UpdateFunc), and only a Deleted event takes a
        node out of its set (pkg/kwok/controllers/node_controller.go), while a fresh kwok lists only the nodes the
        selector matches (--manage-nodes-with-annotation-selector, the lab's command line)."""
        _, offset = self._restart("kwok", while_stopped)
        port = (self.dir / "ports" / "kwok-port").read_text().strip()

        def healthy():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
                    return response.status == 200
            except OSError:
                return False

        wait_for(healthy, 30, "the restarted kwok's /healthz", interval_s=0.2)

    def operator_log(self) -> str:
        return (self.dir / "logs" / "kuberay-operator.log").read_text(errors="replace")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def _prepare_dir(script: Path) -> Path:
    """A fresh lab folder under .cache/k8s-lab whose bin/ holds hard links to binaries unpacked once into
    .cache/k8s-lab/bin (`lab up` checks them against the same SHA256SUMS), so each session skips the 431 MB unpack
    and two sessions never share one folder's pids/ports."""
    CACHE.mkdir(parents=True, exist_ok=True)
    sums = script.parent / "bin" / "SHA256SUMS"
    shared_bin = CACHE / "bin"
    stamp = shared_bin / ".sha256sums"
    if not (stamp.is_file() and stamp.read_bytes() == sums.read_bytes()):
        # Unpacked as `lab up` does (lab `unpack_bins`): the .xz sums checked, then the plain ones.
        scratch = Path(tempfile.mkdtemp(prefix="unpack-", dir=CACHE))
        try:
            lines = sums.read_text().splitlines()
            subprocess.run(["sha256sum", "-c", "--quiet", "-"], cwd=sums.parent, check=True, timeout=120,
                           input="\n".join(ln for ln in lines if ln.endswith(".xz")) + "\n", text=True)
            procs = []
            for xz in sorted(sums.parent.glob("*.xz")):
                out = open(scratch / xz.stem, "wb")
                procs.append((subprocess.Popen(["xz", "-dc", str(xz)], stdout=out), out))
            for proc, out in procs:
                proc.wait(timeout=300)
                out.close()
                if proc.returncode != 0:
                    raise RuntimeError(f"xz -d failed for {out.name}")
            subprocess.run(["sha256sum", "-c", "--quiet", "-"], cwd=scratch, check=True, timeout=120,
                           input="\n".join(ln for ln in lines if not ln.endswith(".xz")) + "\n", text=True)
            for binary in scratch.iterdir():
                binary.chmod(0o755)
            shutil.copyfile(sums, scratch / ".sha256sums")
            shutil.rmtree(shared_bin, ignore_errors=True)
            os.replace(scratch, shared_bin)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=CACHE))
    (run_dir / "bin").mkdir()
    for item in shared_bin.iterdir():
        os.link(item, run_dir / "bin" / item.name)
    return run_dir


def start(*, operator_args: list[str], operator_env: dict[str, str], script: Path | None = None) -> Lab:
    """`lab up` in a fresh folder with the operator's flags (LAB_KUBERAY_ARGS) and environment; the Lab."""
    script = script or lab_script()
    if script is None:
        raise FileNotFoundError(HOW_TO_GET)
    run_dir = _prepare_dir(script)
    env = {**os.environ, **operator_env, "LAB_KUBERAY_ARGS": shlex.join(operator_args),
           "LAB_READY_TIMEOUT": os.environ.get("LAB_READY_TIMEOUT", "120")}
    env.pop("KUBECONFIG", None)
    try:
        result = subprocess.run([str(script), "up", str(run_dir)], capture_output=True, text=True, env=env,
                                timeout=300, check=False)
    except subprocess.TimeoutExpired:
        stop_dir(script, run_dir)
        raise
    if result.returncode != 0:
        stop_dir(script, run_dir)
        raise RuntimeError(f"lab up failed ({result.returncode}):\n{result.stderr[-4000:]}")
    kubeconfig = Path(result.stdout.strip().split("=", 1)[1])
    return Lab(dir=run_dir, kubeconfig=kubeconfig, operator_args=operator_args, operator_env=operator_env)


def stop_dir(script: Path, run_dir: Path) -> None:
    """`lab down` (SIGTERM, then SIGKILL, to the recorded PIDs only), then the folder is removed."""
    subprocess.run([str(script), "down", str(run_dir)], capture_output=True, timeout=60, check=False)
    shutil.rmtree(run_dir, ignore_errors=True)


def stop(lab: Lab) -> None:
    stop_dir(lab_script(), lab.dir)


def running_operator_args(lab: Lab) -> list[str]:
    """The running operator's command line after the binary (from /proc, so what it really got)."""
    raw = Path(f"/proc/{lab.operator_pid()}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    return [a.decode() for a in raw[1:]]


def load_manifests(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(Path(path).read_text()) if doc]


REPORT = REPO_ROOT / "dist" / "cluster-report.json"
"""Every failure scenario of both cluster tiers (tests/cluster, tests/cluster_real): a list of {"scenario", "outcome",
"gpu_nodes", "gpu_node_minutes_lost", "limit"} (+ its timeline), the issue's format."""


def write_report(rows: list[dict]) -> None:
    """Put `rows` into REPORT, replacing earlier rows of the same scenarios and keeping the others.

    Both tiers write it, from the two pytest processes of `make test`: the read-modify-write holds an exclusive
    lock, so neither loses the other's rows.
    """
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    with open(REPORT.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            kept = json.loads(REPORT.read_text())
            kept = [r for r in kept if r["scenario"] not in {x["scenario"] for x in rows}]
        except (OSError, ValueError, KeyError, TypeError):
            kept = []
        REPORT.write_text(json.dumps(kept + rows, indent=1) + "\n")
