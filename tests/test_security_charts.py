"""Security of the Ray manifests and the variable-file rules behind them (issue 12).

- Token authentication: `authOptions.mode` in the RayCluster and the RayJob's cluster, no token in `dist/`.
- The NetworkPolicy: evaluated against the labels the pods really get, i.e. the synthesized pod-template
  labels plus the ones the KubeRay 1.7.0 operator adds (`labelPod` for head and workers; the submitter Job's
  template in K8sJobMode; the operator's own pods from the kuberay-operator chart).
- Pod hardening: seccomp, no privilege escalation, capabilities.
- The variable file: malformed S3 URIs and digests refused with exit 2 naming the field.
"""

from __future__ import annotations

import pytest

from charts import DASHBOARDS_CHART, build_app, inputs, manifests, policy, ray, validation
from config import load_config
from config.k8s import KUBERAY_NAMESPACE
from config.model import S3Location, parse_s3_uri
from tests.helpers import EXAMPLES, REPO, write_variant
from tests.test_config import check, paths_of, refused

DIGEST = "public.ecr.aws/deep-learning-containers/ray@sha256:" + "0123456789abcdef" * 4


def _objects(file) -> list[dict]:
    config = load_config(file)
    # The Grafana dashboards' ConfigMaps (namespace monitoring) are tests/test_observability.py's.
    return [o for chart, objs in manifests(build_app(inputs(config, file))).items() if chart != DASHBOARDS_CHART
            for o in objs]


@pytest.fixture(scope="module")
def default() -> list[dict]:
    return _objects(REPO / "config" / "cluster.yaml")


@pytest.fixture(scope="module")
def socket() -> list[dict]:
    return _objects(EXAMPLES / "socket.yaml")


def _one(objects: list[dict], kind: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def _cluster_specs(objects: list[dict]) -> dict[str, dict]:
    """Ray cluster spec by owning object name: the RayCluster's and the RayJob's."""
    cluster, job = _one(objects, "RayCluster"), _one(objects, "RayJob")
    return {cluster["metadata"]["name"]: cluster["spec"], job["metadata"]["name"]: job["spec"]["rayClusterSpec"]}


def _policies(objects: list[dict]) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "NetworkPolicy"}


# ---- KubeRay's pods, as the operator labels them ----------------------------------------------


def _pod(labels: dict[str, str], namespace: str = "ray") -> dict:
    return {"namespace": namespace, "labels": labels}


def ray_pods(spec: dict, cluster_name: str) -> dict[str, dict]:
    """Head and worker pods of a RayCluster named `cluster_name`: template labels + KubeRay's (labelPod)."""
    def labelled(template: dict, node_type: str, group: str) -> dict:
        kuberay = {"ray.io/is-ray-node": "yes", "ray.io/cluster": cluster_name, "ray.io/node-type": node_type,
                   "ray.io/group": group, "ray.io/identifier": f"{cluster_name}-{node_type}",
                   "app.kubernetes.io/name": "kuberay", "app.kubernetes.io/created-by": "kuberay-operator"}
        return _pod({**template["metadata"]["labels"], **kuberay})

    pods = {"head": labelled(spec["headGroupSpec"]["template"], "head", "headgroup")}
    for group in spec["workerGroupSpecs"]:
        pods[group["groupName"]] = labelled(group["template"], "worker", group["groupName"])
    return pods


def submitter_pod(rayjob: str) -> dict:
    """The K8sJobMode submitter: KubeRay's template labels plus the batch Job controller's."""
    return _pod({"ray.io/originated-from-cr-name": rayjob, "ray.io/originated-from-crd": "RayJob",
                 "app.kubernetes.io/created-by": "kuberay-operator", "job-name": rayjob,
                 "batch.kubernetes.io/job-name": rayjob})


OPERATOR = _pod({"app.kubernetes.io/name": "kuberay-operator", "app.kubernetes.io/instance": "kuberay-operator",
                 "app.kubernetes.io/component": "kuberay-operator"}, namespace=KUBERAY_NAMESPACE)
STRANGER = _pod({"app": "something-else"})
STRANGER_ELSEWHERE = _pod({"app.kubernetes.io/name": "kuberay-operator"}, namespace="default")


# ---- a small NetworkPolicy evaluator (Kubernetes' semantics for the fields used) ---------------------


def selects(selector: dict, labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        value, op = labels.get(expr["key"]), expr["operator"]
        if (op == "In" and value not in expr["values"]) or (op == "NotIn" and value in expr["values"]) or (
                op == "Exists" and value is None) or (op == "DoesNotExist" and value is not None):
            return False
    return True


def _peer_matches(peer: dict, source: dict, policy_namespace: str) -> bool:
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": source["namespace"]}):
            return False
    elif source["namespace"] != policy_namespace:
        return False
    return selects(peer.get("podSelector") or {}, source["labels"])


def admitted(policies: list[dict], target: dict, source: dict, port: int) -> bool:
    """Whether TCP `port` on `target` accepts a connection from `source` under `policies`."""
    applying = [p for p in policies if p["metadata"]["namespace"] == target["namespace"]
                and "Ingress" in p["spec"]["policyTypes"] and selects(p["spec"]["podSelector"], target["labels"])]
    if not applying:
        return True  # a pod no policy selects is open
    for pol in applying:
        for rule in pol["spec"].get("ingress") or []:
            ports_ok = "ports" not in rule or any(p["port"] == port and p.get("protocol", "TCP") == "TCP"
                                                  for p in rule["ports"])
            if ports_ok and any(_peer_matches(peer, source, pol["metadata"]["namespace"]) for peer in rule["from"]):
                return True
    return False


# ---- token authentication -------------------------------------------------------------------------


def test_token_auth_on_by_default_in_the_raycluster_and_the_rayjob(default):
    for owner, spec in _cluster_specs(default).items():
        assert spec["authOptions"] == {"mode": "token"}, owner


def test_auth_can_be_disabled(tmp_path):
    objects = _objects(write_variant(tmp_path, {"ray": {"auth": "disabled"}}))
    assert {owner: spec["authOptions"] for owner, spec in _cluster_specs(objects).items()} == {
        "ray-efa": {"mode": "disabled"}, "ray-efa-job": {"mode": "disabled"}}
    assert "RAY_AUTH_TOKEN" not in _one(objects, "ConfigMap")["data"]["submit.sh"]


def test_no_token_in_the_manifests(default):
    # KubeRay generates the token in a Secret of its own; nothing here carries one.
    assert not [o for o in default if o["kind"] == "Secret"]
    for spec in _cluster_specs(default).values():
        for template in [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]:
            for container in template["spec"]["containers"]:
                assert not [e for e in container["env"] if e["name"].startswith("RAY_AUTH")]


@pytest.mark.slow
def test_manifests_with_auth_and_network_policies_validate(default, socket):
    for objects in (default, socket):
        assert validation.problems(objects, "1.34") == []
        assert set(_policies(objects)) == {"ray-efa-ray", "ray-efa-job-ray", "ray-efa-image-prepull",
                                          "ray-efa-watchdog"}


# ---- the NetworkPolicy ----------------------------------------------------------------------------


@pytest.mark.parametrize("rayjob_cluster", ["ray-efa-job-x7k2p", "ray-efa-job-q9z4m"])
def test_policy_admits_the_cluster_itself_on_every_port(default, rayjob_cluster):
    policies = list(_policies(default).values())
    names = {"ray-efa": "ray-efa", "ray-efa-job": rayjob_cluster}  # a RayJob's cluster gets a generated name
    for owner, spec in _cluster_specs(default).items():
        pods = ray_pods(spec, names[owner])
        for target in pods.values():
            for source in pods.values():
                for port in (6379, 8265, 10001, 52365, 41234):  # GCS, dashboard, client, agent, a worker port
                    assert admitted(policies, target, source, port), (owner, port)


def test_policy_keeps_the_two_clusters_and_strangers_apart(default):
    policies = list(_policies(default).values())
    specs = _cluster_specs(default)
    standalone = ray_pods(specs["ray-efa"], "ray-efa")
    job = ray_pods(specs["ray-efa-job"], "ray-efa-job-x7k2p")
    for target in [*standalone.values(), *job.values()]:
        for source in (STRANGER, STRANGER_ELSEWHERE):
            assert not admitted(policies, target, source, 8265)
            assert not admitted(policies, target, source, 6379)
    assert not admitted(policies, standalone["head"], job["head"], 6379)
    assert not admitted(policies, job["gpu"], standalone["gpu"], 6379)


def test_policy_admits_the_operator_and_the_submitter_on_the_dashboard_only(default):
    policies = list(_policies(default).values())
    specs = _cluster_specs(default)
    standalone = ray_pods(specs["ray-efa"], "ray-efa")["head"]
    job_head = ray_pods(specs["ray-efa-job"], "ray-efa-job-x7k2p")["head"]
    for head in (standalone, job_head):
        assert admitted(policies, head, OPERATOR, ray.DASHBOARD_PORT)
        assert not admitted(policies, head, OPERATOR, 6379)
    assert admitted(policies, job_head, submitter_pod("ray-efa-job"), ray.DASHBOARD_PORT)
    assert not admitted(policies, job_head, submitter_pod("ray-efa-job"), 6379)
    assert not admitted(policies, standalone, submitter_pod("ray-efa-job"), ray.DASHBOARD_PORT)
    assert not admitted(policies, job_head, submitter_pod("another-job"), ray.DASHBOARD_PORT)


def test_policy_selects_every_ray_pod_and_nothing_else(default):
    by_name = _policies(default)
    specs = _cluster_specs(default)
    for owner, spec in specs.items():
        pol = by_name[policy.policy_name(owner)]
        assert pol["spec"]["policyTypes"] == ["Ingress"]  # egress open: S3, the Hub, pip
        for pod in ray_pods(spec, f"{owner}-abcde").values():
            assert selects(pol["spec"]["podSelector"], pod["labels"])
    prepull = _one(default, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    submitter = submitter_pod("ray-efa-job")["labels"]
    for owner in specs:
        pol = by_name[policy.policy_name(owner)]
        assert not selects(pol["spec"]["podSelector"], prepull)
        assert not selects(pol["spec"]["podSelector"], submitter)


# ---- pod hardening --------------------------------------------------------------------------------


def _ray_containers(objects):
    for owner, spec in _cluster_specs(objects).items():
        yield owner, "head", spec["headGroupSpec"]["template"]
        for group in spec["workerGroupSpecs"]:
            yield owner, group["groupName"], group["template"]


@pytest.mark.parametrize("variant", ["default", "socket"])
def test_ray_containers_are_hardened(variant, request):
    objects = request.getfixturevalue(variant)
    for owner, group, template in _ray_containers(objects):
        assert template["spec"]["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
        (container,) = template["spec"]["containers"]
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False, (owner, group)
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}
        assert context["capabilities"]["drop"] == ["ALL"]
        assert set(context["capabilities"].get("add", [])) <= {"IPC_LOCK"}
        assert "privileged" not in context


def test_only_efa_workers_keep_ipc_lock(default):
    for _, group, template in _ray_containers(default):
        (container,) = template["spec"]["containers"]
        assert container["securityContext"]["capabilities"].get("add") == (None if group == "head" else ["IPC_LOCK"])


# ---- the variable file ----------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["model", "dataset"])
@pytest.mark.parametrize("uri", ["s3://", "s3://bucket-only", "s3://bucket-only/", "s3:/my-bucket/x",
                                 "S3://my-bucket/x", "s3://My_Bucket/x", "s3://my-bucket//x", "s3://my-bucket/a*",
                                 "s3a://my-bucket/x", "s3://10.0.0.1/x", "s3://ab/x"])
def test_malformed_s3_uri_is_refused_naming_the_field(tmp_path, field, uri):
    lines = refused(tmp_path, {"job": {field: uri}})
    assert paths_of(lines) == [f"job.{field}"]
    assert "malformed S3 URI" in lines[0] and "s3://BUCKET/PREFIX" in lines[0]


def test_s3_uris_parse_to_bucket_and_prefix(tmp_path):
    assert parse_s3_uri("s3://my-models/qwen/Qwen2.5-1.5B/") == S3Location(bucket="my-models", key="qwen/Qwen2.5-1.5B")
    assert parse_s3_uri("Qwen/Qwen2.5-1.5B") is None and parse_s3_uri("/data/train.jsonl") is None
    config = load_config(write_variant(tmp_path, {"job": {"model": "s3://m-b/x", "dataset": "s3://d-b/y/z.jsonl"}}))
    assert config.job.s3_sources == {"model": S3Location(bucket="m-b", key="x"),
                                     "dataset": S3Location(bucket="d-b", key="y/z.jsonl")}


def test_image_pinned_by_digest_is_accepted(tmp_path):
    code, out, err = check(write_variant(tmp_path, {"ray": {"image": DIGEST}}))
    assert code == 0, err


@pytest.mark.parametrize("image", ["repo@sha256:abc", "repo@sha256:" + "A" * 64, "repo@md5:" + "0" * 64])
def test_malformed_digest_is_refused(tmp_path, image):
    lines = refused(tmp_path, {"ray": {"image": image}})
    assert paths_of(lines) == ["ray.image"] and "sha256" in lines[0]


def test_unknown_auth_mode_is_refused(tmp_path):
    assert paths_of(refused(tmp_path, {"ray": {"auth": "password"}})) == ["ray.auth"]


def test_token_auth_needs_ray_2_52(tmp_path):
    lines = refused(tmp_path, {"ray": {"image": "rayproject/ray:2.50.0-gpu", "ray_version": "2.50.0"}})
    assert paths_of(lines) == ["ray.auth"] and "2.52.0" in lines[0]
    code, _, err = check(write_variant(tmp_path, {"ray": {"image": "rayproject/ray:2.50.0-gpu", "ray_version": "2.50.0",
                                                          "auth": "disabled"}}))
    assert code == 0, err


# ---- checkov acknowledgments and the scan export ------------------------------------------------


def _skips(annotations: dict[str, str]) -> dict[str, str]:
    found = dict(value.split("=", 1) for key, value in annotations.items() if key.startswith("checkov.io/skip"))
    assert all(reason.strip() for reason in found.values())
    return found


def test_ray_pod_templates_acknowledge_checkov_findings_with_reasons(default):
    for _, group, template in _ray_containers(default):
        skips = _skips(template["metadata"]["annotations"])
        assert {"CKV_K8S_8", "CKV_K8S_9", "CKV_K8S_22", "CKV_K8S_23", "CKV_K8S_43"} <= set(skips)
        assert ("CKV_K8S_25" in skips) == (group != "head")  # only the workers add a capability


def test_a_digest_pinned_image_needs_no_digest_acknowledgment(tmp_path):
    objects = _objects(write_variant(tmp_path, {"ray": {"image": DIGEST}}))
    for _, _, template in _ray_containers(objects):
        assert "CKV_K8S_43" not in _skips(template["metadata"]["annotations"])
        assert template["spec"]["containers"][0]["image"] == DIGEST
    assert "CKV_K8S_43" not in _skips(_one(objects, "DaemonSet")["metadata"]["annotations"])


def test_prepull_pods_are_hardened_and_closed(default):
    daemon_set = _one(default, "DaemonSet")
    pod = daemon_set["spec"]["template"]
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in pod["spec"]["containers"] + pod["spec"]["initContainers"]:
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
    closed = [p for p in _policies(default).values() if selects(p["spec"]["podSelector"], pod["metadata"]["labels"])]
    assert len(closed) == 1 and closed[0]["spec"]["ingress"] == []
    target = _pod(pod["metadata"]["labels"])
    assert not admitted(list(_policies(default).values()), target, OPERATOR, 8265)


def test_scan_export_writes_every_ray_pod_as_kuberay_names_it(default, tmp_path):
    from ops import scan

    pods = scan.ray_pods(default)
    assert sorted(p["metadata"]["name"] for p in pods) == ["ray-efa-gpu", "ray-efa-head", "ray-efa-job-gpu",
                                                           "ray-efa-job-head"]
    policies = list(_policies(default).values())
    for pod in pods:
        assert pod["metadata"]["annotations"]  # the inline acknowledgments travel with the pod
        assert any(selects(p["spec"]["podSelector"], pod["metadata"]["labels"]) for p in policies)
    assert validation.problems(pods, "1.34") == []
