"""The cdk8s charts, synthesized in-process (once per variable file) from the real loader's output.

Covers the issue's numbered points (base objects and code ConfigMap, RayCluster, RayJob, pre-pull
DaemonSet), EFA and socket transport, the p5.48xlarge example, schema validation, and the
consistency of the manifests with the derived values. Whether pods fit the node groups the stacks
really create is checked against the synthesized CloudFormation in tests/test_consistency.py.
"""

from __future__ import annotations

import copy
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from charts import DASHBOARDS_CHART, ChartError, build_app, bundle, inputs, manifests, ray, validation
from charts.__main__ import synthesize
from config import ClusterConfig, load_config
from config.k8s import GPU_TAINT, system_node_labels
from tests.helpers import EXAMPLES, REPO, load_variant, write_variant


@dataclass
class Synth:
    """One variable file's synthesized charts."""

    config: ClusterConfig
    file: Path
    charts: dict[str, list[dict]]

    def objects(self, kind: str) -> list[dict]:
        return [o for objs in self.charts.values() for o in objs if o["kind"] == kind]

    def one(self, kind: str) -> dict:
        found = self.objects(kind)
        assert len(found) == 1, f"expected one {kind}, got {len(found)}"
        return found[0]

    @property
    def all(self) -> list[dict]:
        return [o for objs in self.charts.values() for o in objs]

    @property
    def cluster_spec(self) -> dict:
        return self.one("RayCluster")["spec"]

    def worker(self, name: str) -> dict:
        (group,) = [g for g in self.cluster_spec["workerGroupSpecs"] if g["groupName"] == name]
        return group

    @property
    def configmap(self) -> dict:
        return self.one("ConfigMap")


def _synth(file: Path) -> Synth:
    config = load_config(file)
    charts = manifests(build_app(inputs(config, file)))
    # The Grafana dashboards (namespace monitoring) are tests/test_observability.py's; the watchdog (a second
    # ServiceAccount, cluster-scoped node RBAC) is tests/test_watchdog.py's.
    return Synth(config=config, file=file, charts={k: v for k, v in charts.items()
                                                   if k not in (DASHBOARDS_CHART, "ray-watchdog")})


def _container(pod_template: dict) -> dict:
    (container,) = pod_template["spec"]["containers"]
    return container


def _env(container: dict) -> dict[str, str]:
    """The container's literal environment values (entries read from the Downward API left out)."""
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def _pod_templates(spec: dict) -> list[dict]:
    return [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]


@pytest.fixture(scope="module")
def default() -> Synth:
    return _synth(REPO / "config" / "cluster.yaml")


@pytest.fixture(scope="module")
def socket() -> Synth:
    return _synth(EXAMPLES / "socket.yaml")


@pytest.fixture(scope="module")
def p5() -> Synth:
    return _synth(EXAMPLES / "p5.yaml")


@pytest.fixture(scope="module")
def two_groups(tmp_path_factory) -> Synth:
    """Two worker groups, an explicit bucket, extra pip packages, no preflight and no pre-pull."""
    data = yaml.safe_load((REPO / "config" / "cluster.yaml").read_text())
    second = dict(data["cluster"]["worker_groups"][0], name="big", instance_type="g6.24xlarge", nodes=1)
    data["cluster"]["worker_groups"].append(second)
    overrides = {
        "cluster": {"worker_groups": data["cluster"]["worker_groups"]},
        "job": {"global_batch_size": 96},
        "storage": {"bucket_name": "my-ckpt-bucket"},
        "ray": {"extra_pip_packages": ["peft==0.18.0", "tabulate"], "preflight": False, "prepull_image": False},
        "nccl": {"debug": "WARN"},
    }
    return _synth(write_variant(tmp_path_factory.mktemp("two"), overrides))


@pytest.fixture(scope="module", params=["default", "socket", "p5", "two_groups"])
def any_synth(request) -> Synth:
    return request.getfixturevalue(request.param)


# ---- 1. namespace, service account, code ConfigMap ------------------------------------------


def test_namespace_and_service_account(default):
    config = default.config
    assert default.one("Namespace")["metadata"]["name"] == config.ray.namespace
    sa = default.one("ServiceAccount")
    assert sa["metadata"] == sa["metadata"] | {"name": config.ray.service_account, "namespace": config.ray.namespace}
    for obj in default.all:
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == config.ray.namespace, obj["kind"]


def test_configmap_carries_workloads_config_and_variable_file(default):
    data = default.configmap["data"]
    shipped = {bundle.flatten(p.relative_to(REPO).as_posix()): p for p in (REPO / "workloads").rglob("*.py")
               if "__pycache__" not in p.parts}
    shipped |= {bundle.flatten(p.relative_to(REPO).as_posix()): p for p in (REPO / "config").glob("*.py")}
    shipped["config__instances.yaml"] = REPO / "config" / "instances.yaml"
    assert "workloads__fsdp_finetune____init__.py" in shipped or "workloads____init__.py" in shipped
    for key, path in shipped.items():
        assert data[key] == path.read_text(), key
    assert data["config__cluster.yaml"] == default.file.read_text()


def test_every_ray_pod_mounts_the_bundle_back_at_its_paths(any_synth):
    data = any_synth.configmap["data"]
    for template in _pod_templates(any_synth.cluster_spec):
        (volume,) = [v for v in template["spec"]["volumes"] if "configMap" in v]
        assert volume["configMap"]["name"] == any_synth.configmap["metadata"]["name"]
        items = {i["key"]: i["path"] for i in volume["configMap"]["items"]}
        assert set(items) == set(data)
        for key, path in items.items():
            assert bundle.flatten(path) == key
        assert items["config__cluster.yaml"] == "config/cluster.yaml"
        container = _container(template)
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
        assert mount["mountPath"] == "/app" and container["workingDir"] == "/app"
        env = _env(container)
        assert env["PYTHONPATH"] == "/app"
        assert env["CLUSTER_CONFIG"] == "/app/config/cluster.yaml"


def test_configmap_over_one_mib_is_refused_and_nothing_is_written(tmp_path, default):
    root = tmp_path / "repo"
    (root / "workloads").mkdir(parents=True)
    (root / "config").mkdir()
    (root / "config" / "instances.yaml").write_text("{}\n")
    (root / "workloads" / "weights.py").write_text("x = 1\n" * 200_000)
    out = tmp_path / "dist"
    out.mkdir()
    (out / "previous.k8s.yaml").write_text("kept: true\n")
    with pytest.raises(ChartError, match=r"over the 1 MiB .*workloads/weights.py"):
        synthesize(default.config, default.file, out, repo_root=root)
    assert [p.name for p in out.iterdir()] == ["previous.k8s.yaml"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dist", "repo"]


def test_colliding_configmap_keys_are_refused(tmp_path, default):
    root = tmp_path / "repo"
    (root / "workloads" / "a__b").mkdir(parents=True)
    (root / "workloads" / "a").mkdir()
    (root / "workloads" / "a__b" / "c.py").write_text("")
    (root / "workloads" / "a" / "b__c.py").write_text("")
    (root / "config").mkdir()
    (root / "config" / "instances.yaml").write_text("{}\n")
    with pytest.raises(ChartError, match="both flatten to ConfigMap key 'workloads__a__b__c.py'"):
        bundle.collect(default.file, config=default.config, runtime_env_json="{}", repo_root=root)


# ---- 2. RayCluster ----------------------------------------------------------------------------


def test_one_pinned_image_for_head_and_workers(any_synth):
    images = {_container(t)["image"] for t in _pod_templates(any_synth.cluster_spec)}
    assert images == {any_synth.config.ray.image}
    assert not any_synth.config.ray.image.endswith(":latest") and ":" in any_synth.config.ray.image
    assert {_container(t)["imagePullPolicy"] for t in _pod_templates(any_synth.cluster_spec)} == {"IfNotPresent"}
    assert any_synth.cluster_spec["rayVersion"] == any_synth.config.ray.ray_version


def test_head_on_system_nodes_without_gpu_and_cluster_internal(default):
    head = default.cluster_spec["headGroupSpec"]
    assert head["template"]["spec"]["nodeSelector"] == system_node_labels()
    assert head["rayStartParams"]["num-gpus"] == "0"
    assert head["serviceType"] == "ClusterIP" and head.get("enableIngress") is False
    container = _container(head["template"])
    assert _env(container)["NVIDIA_VISIBLE_DEVICES"] == "void"
    expected = {"cpu": str(default.config.ray.head.cpu), "memory": f"{default.config.ray.head.memory_gib}Gi"}
    assert container["resources"] == {"requests": expected, "limits": expected}
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    assert not default.objects("Ingress")
    assert all(s["spec"].get("type") != "LoadBalancer" for s in default.objects("Service"))


def test_one_worker_group_per_group_sized_from_derived_values(any_synth):
    config = any_synth.config
    assert [g["groupName"] for g in any_synth.cluster_spec["workerGroupSpecs"]] == \
        [g.name for g in config.cluster.worker_groups]
    for group in config.cluster.worker_groups:
        spec = any_synth.worker(group.name)
        pods = config.pods(group)
        assert spec["replicas"] == spec["minReplicas"] == spec["maxReplicas"] == pods
        res = config.pod_resources[group.name]
        resources = _container(spec["template"])["resources"]
        assert resources["requests"] == resources["limits"]
        limits = resources["limits"]
        assert limits["nvidia.com/gpu"] == str(res.gpus) and limits["cpu"] == str(res.cpu)
        assert limits["memory"] == f"{res.memory_gib}Gi"
        pod = spec["template"]["spec"]
        (shm,) = [v for v in pod["volumes"] if "emptyDir" in v]
        assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": f"{res.shm_gib}Gi"}
        container = _container(spec["template"])
        assert {"name": shm["name"], "mountPath": "/dev/shm"} in container["volumeMounts"]
        assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
        assert container["lifecycle"]["preStop"]["exec"]["command"][-1] == "ray stop"
        assert _env(container)["NCCL_DEBUG"] == config.nccl.debug
        assert _env(container)["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def _nccl_excludes(ifname_setting: str, interface: str) -> bool:
    """NCCL's rule: '^a,b' excludes interfaces whose names start with a or b ('=' would mean exact)."""
    assert ifname_setting.startswith("^") and not ifname_setting.startswith("^=")
    return any(interface.startswith(prefix) for prefix in ifname_setting[1:].split(","))


def test_efa_transport_on_g6(default):
    (group,) = default.config.cluster.worker_groups
    container = _container(default.worker(group.name)["template"])
    env = _env(container)
    assert env["FI_PROVIDER"] == "efa"
    assert env["NCCL_NET_PLUGIN"] == "ofi" and env["NCCL_NET"] == "AWS Libfabric"
    for interface in ("lo", "docker0", "pod-id-link0"):
        assert _nccl_excludes(env["NCCL_SOCKET_IFNAME"], interface)
    assert not _nccl_excludes(env["NCCL_SOCKET_IFNAME"], "eth0")
    # g6 has no GPUDirect RDMA: libfabric aborts if asked for it.
    assert not default.config.instance(group).gpudirect_rdma and "FI_EFA_USE_DEVICE_RDMA" not in env
    limits = container["resources"]["limits"]
    res = default.config.pod_resources[group.name]
    assert limits["vpc.amazonaws.com/efa"] == str(res.efa_devices) == "1"
    assert limits["hugepages-2Mi"] == f"{res.hugepages_2mi_mib}Mi" == "5120Mi"


def test_socket_transport_has_no_efa(socket):
    (group,) = socket.config.cluster.worker_groups
    container = _container(socket.worker(group.name)["template"])
    env = _env(container)
    assert env["NCCL_NET"] == "Socket"
    assert not [k for k in env if k.startswith("FI_")] and "NCCL_NET_PLUGIN" not in env
    assert "vpc.amazonaws.com/efa" not in container["resources"]["limits"]
    assert "hugepages-2Mi" not in container["resources"]["limits"]
    assert _nccl_excludes(env["NCCL_SOCKET_IFNAME"], "pod-id-link0")


def test_p5_example_uses_all_efa_interfaces_and_gpudirect_rdma(p5):
    (group,) = p5.config.cluster.worker_groups
    spec = p5.worker(group.name)
    container = _container(spec["template"])
    assert spec["replicas"] == 2
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert container["resources"]["limits"]["vpc.amazonaws.com/efa"] == "32"
    assert _env(container)["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert p5.config.world_size == 16


def test_gpudirect_rdma_env_needs_the_group_to_ask(tmp_path):
    config = load_variant(tmp_path, base=EXAMPLES / "p5.yaml", group={"gpudirect_rdma": False})
    assert "FI_EFA_USE_DEVICE_RDMA" not in ray.transport_env(config, config.cluster.worker_groups[0])


def test_nccl_debug_is_switchable(two_groups):
    for group in two_groups.config.cluster.worker_groups:
        assert _env(_container(two_groups.worker(group.name)["template"]))["NCCL_DEBUG"] == "WARN"


def test_every_ray_pod_knows_its_node_name(any_synth):
    for template in _pod_templates(any_synth.cluster_spec):
        (entry,) = [e for e in _container(template)["env"] if e["name"] == "K8S_NODE_NAME"]
        assert entry == {"name": "K8S_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}


def _shm_bytes(template: dict) -> int:
    (volume,) = [v for v in template["spec"]["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
    assert {"name": volume["name"], "mountPath": "/dev/shm"} in _container(template)["volumeMounts"]
    assert volume["emptyDir"]["sizeLimit"].endswith("Gi")
    return int(volume["emptyDir"]["sizeLimit"].removesuffix("Gi")) * 1024**3


def test_object_store_is_set_and_fits_in_dev_shm_with_room_for_nccl(any_synth):
    spec = any_synth.cluster_spec
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    for group in groups:
        shm = _shm_bytes(group["template"])
        store = int(group["rayStartParams"]["object-store-memory"])
        # Ray would otherwise take 30% of the pod's memory (more than /dev/shm) and spill to /tmp.
        assert shm / 2 <= store <= shm - 1024**3, (group.get("groupName", "head"), store, shm)


def test_object_store_and_head_shm_for_the_default_file(default):
    head = default.cluster_spec["headGroupSpec"]
    # Head: 16 GiB -> /dev/shm a quarter, 4 GiB; object store three quarters of it, 3 GiB.
    assert _shm_bytes(head["template"]) == 4 * 1024**3
    assert head["rayStartParams"]["object-store-memory"] == str(3 * 1024**3)
    # g6.12xlarge worker: /dev/shm 43 GiB; object store 0.75 x 43 GiB = 33024 MiB.
    worker = default.worker("gpu")
    assert _shm_bytes(worker["template"]) == 43 * 1024**3
    assert worker["rayStartParams"] == {"object-store-memory": str(33024 * 1024**2), "metrics-export-port": "8080"}


def test_ray_train_polls_workers_every_second(default, two_groups):
    for synth in (default, two_groups):
        runtime_env = yaml.safe_load(synth.one("RayJob")["spec"]["runtimeEnvYAML"])
        assert runtime_env["env_vars"]["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "1.0"
        for template in _pod_templates(synth.cluster_spec):
            assert _env(_container(template))["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "1.0"


# ---- 3. RayJob ------------------------------------------------------------------------------------


def _without_owner(spec: dict) -> dict:
    spec = copy.deepcopy(spec)
    for template in _pod_templates(spec):
        template["metadata"]["labels"].pop(ray.OWNER_LABEL)
    return spec


def test_rayjob_uses_the_same_cluster_spec(any_synth):
    # Identical but for the label naming the object the pods belong to (their NetworkPolicy selects by it).
    job_spec = any_synth.one("RayJob")["spec"]["rayClusterSpec"]
    assert _without_owner(job_spec) == _without_owner(any_synth.cluster_spec)
    assert {t["metadata"]["labels"][ray.OWNER_LABEL] for t in _pod_templates(job_spec)} == {
        ray.job_name(any_synth.config)}


def test_rayjob_runs_job_sh(default):
    # Deadlines, retries, submission mode and deletion rules: tests/test_rayjob_lifecycle.py.
    assert default.one("RayJob")["spec"]["entrypoint"] == "bash /app/job.sh"


def _script_commands(text: str) -> list[list[str]]:
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return [shlex.split(line.removeprefix("exec ")) for line in lines]


def test_job_script_plans_then_runs_the_workload_which_runs_preflight_itself(default):
    commands = _script_commands(default.configmap["data"]["job.sh"])
    modules = [c[2] for c in commands if c[:2] == ["python", "-m"]]
    assert modules == ["workloads.plan", "workloads.fsdp_finetune"]
    assert commands[-2][3] == "/app/config/cluster.yaml"  # the plan reads the mounted file; set -e stops on exit 2
    assert "set -euo pipefail" in default.configmap["data"]["job.sh"]
    assert commands[-1][3:5] == ["--config", "/app/config/cluster.yaml"]
    assert "--storage-path" not in commands[-1]  # bucket name needs the account: resolved at run time
    env = _env(_container(default.cluster_spec["headGroupSpec"]["template"]))
    assert env["CHECKPOINT_BUCKET"] == "" and env["AWS_REGION"] == default.config.region
    assert env["CLUSTER_CONFIG"] == "/app/config/cluster.yaml"


def test_explicit_bucket_extra_pip_and_no_preflight(two_groups):
    commands = _script_commands(two_groups.configmap["data"]["job.sh"])
    assert [c[2] for c in commands if c[:2] == ["python", "-m"]] == ["workloads.plan", "workloads.fsdp_finetune"]
    assert "--storage-path" not in commands[-1]
    runtime_env = yaml.safe_load(two_groups.one("RayJob")["spec"]["runtimeEnvYAML"])
    assert runtime_env["pip"] == ["peft==0.18.0", "tabulate"]
    assert runtime_env["env_vars"]["CHECKPOINT_BUCKET"] == "my-ckpt-bucket"
    submit = shlex.split(two_groups.configmap["data"]["submit.sh"].splitlines()[-1])
    assert submit[:3] == ["exec", "ray", "job"] and submit[-3:] == ["--", "bash", "/app/job.sh"]
    assert yaml.safe_load(submit[submit.index("--runtime-env-json") + 1]) == runtime_env


def test_default_runtime_env_has_no_pip(default):
    assert "pip" not in yaml.safe_load(default.one("RayJob")["spec"]["runtimeEnvYAML"])


def test_mlflow_uri_adds_the_pinned_client_to_the_runtime_env(tmp_path):
    pin = next(line for line in (REPO / "requirements.txt").read_text().splitlines()
               if line.startswith("mlflow-skinny=="))
    synth = _synth(write_variant(tmp_path, {"job": {"mlflow_tracking_uri": "https://mlflow.example.com"},
                                            "ray": {"extra_pip_packages": ["tabulate"]}}))
    runtime_env = yaml.safe_load(synth.one("RayJob")["spec"]["runtimeEnvYAML"])
    assert runtime_env["pip"] == ["tabulate", pin]
    # Listed by the user already: not twice.
    listed = write_variant(tmp_path, {"job": {"mlflow_tracking_uri": "https://mlflow.example.com"},
                                      "ray": {"extra_pip_packages": ["MLflow_Skinny==3.17.0"]}}, name="own.yaml")
    assert ray.job_pip(load_config(listed)) == ["MLflow_Skinny==3.17.0"]


def test_head_and_workers_run_the_nccl_flight_recorder(any_synth):
    for template in _pod_templates(any_synth.cluster_spec):
        env = _env(_container(template))
        assert int(env["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0
        assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
        # One file per rank, in the Ray log folder of the pod's current session.
        assert env["TORCH_FR_DUMP_TEMP_FILE"].startswith("/tmp/ray/session_latest/logs/")


# ---- 4. image pre-pull DaemonSet ---------------------------------------------------------------


def test_prepull_daemonset_on_every_node(default):
    pod = default.one("DaemonSet")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    (hold,) = pod["containers"]
    assert init["image"] == hold["image"] == default.config.ray.image
    assert init["command"] == ["true"] and hold["command"] == ["sleep", "infinity"]
    assert pod["tolerations"] == [{"key": GPU_TAINT.key, "operator": "Equal", "value": GPU_TAINT.value,
                                   "effect": GPU_TAINT.effect}]
    # No selector: GPU nodes (workers) and system nodes (the head and its SidecarMode submitter) alike.
    assert "nodeSelector" not in pod and "affinity" not in pod
    assert "nvidia.com/gpu" not in init["resources"]["limits"]


def test_prepull_is_optional(two_groups):
    assert not two_groups.objects("DaemonSet")


# ---- validation ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_every_object_validates(any_synth):
    assert validation.problems(any_synth.all, any_synth.config.cluster.kubernetes_version) == []
    kinds = {o["kind"] for o in any_synth.all}
    assert {"Namespace", "ServiceAccount", "ConfigMap", "RayCluster", "RayJob", "NetworkPolicy"} <= kinds


def test_misspelt_fields_are_reported(default):
    cluster = copy.deepcopy(default.one("RayCluster"))
    cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["reqests"] = {}
    cluster["spec"]["headGroupSpec"]["rayStartParam"] = {}
    job = copy.deepcopy(default.one("RayJob"))
    job["spec"]["shutdownAfterJobFinish"] = True
    namespace = copy.deepcopy(default.one("Namespace"))
    namespace["metadata"]["labelz"] = {}
    found = validation.problems([cluster, job, namespace], "1.34")
    text = "\n".join(found)
    assert "RayCluster/ray-efa: spec.workerGroupSpecs[0].template.spec.containers[0].resources:" in text
    assert "'reqests' was unexpected" in text and "'rayStartParam' was unexpected" in text
    assert "RayJob/ray-efa-job: spec: " in text and "'shutdownAfterJobFinish' was unexpected" in text
    assert "Namespace/ray: metadata:" in text and "'labelz' was unexpected" in text
    with pytest.raises(ChartError, match="fail schema validation"):
        validation.check([namespace], "1.34")


def test_wrong_types_are_reported(default):
    cluster = copy.deepcopy(default.one("RayCluster"))
    cluster["spec"]["workerGroupSpecs"][0]["replicas"] = "2"
    assert any("replicas" in p and "is not of type 'integer'" in p
               for p in validation.problems([cluster], "1.34"))


def test_strict_leaves_preserve_unknown_fields_open():
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {}},
                                                     "x-kubernetes-preserve-unknown-fields": True},
                                               "m": {"type": "object", "additionalProperties": {"type": "string"}}}}
    strict = validation.strict(schema)
    assert strict["additionalProperties"] is False
    assert "additionalProperties" not in strict["properties"]["a"]
    assert strict["properties"]["m"]["additionalProperties"] == {"type": "string"}


def test_kubernetes_schema_version():
    assert validation.kubernetes_schema_version("1.34") == "1.34"
    assert validation.kubernetes_schema_version("1.99") == "1.37"  # newest shipped by kubernetes-validate 1.37.0


# ---- consistency with the derived values (against the stacks: tests/test_consistency.py) ----------


def test_worker_gpus_add_up_to_the_world_size(any_synth):
    for spec in (any_synth.cluster_spec, any_synth.one("RayJob")["spec"]["rayClusterSpec"]):
        gpus = sum(g["replicas"] * int(_container(g["template"])["resources"]["limits"]["nvidia.com/gpu"])
                   for g in spec["workerGroupSpecs"])
        assert gpus == any_synth.config.world_size
