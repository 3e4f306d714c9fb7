"""The stacks, the manifests and the workload agree, because they derive from one variable file.

Each check reads what was really synthesized: CloudFormation from the CDK app and Kubernetes objects
from the cdk8s app, built from the same variant file.
"""

from __future__ import annotations

from functools import cache

import pytest

from charts import watchdog
from charts.charts import build_app, inputs, manifests
from config.k8s import cfn_taint_effect
from tests.stack_synth import synth, variant_file

pytestmark = pytest.mark.slow  # `make check` leaves this module out (pyproject.toml markers)

VARIANTS = ["default", "p5", "socket"]


@cache
def k8s_objects(name: str) -> list[dict]:
    """Every Kubernetes object the cdk8s app synthesizes for variant `name`."""
    file = variant_file(name)
    from config import load_config

    charts = manifests(build_app(inputs(load_config(file), file)))
    return [obj for objs in charts.values() for obj in objs]


def nodegroups(name: str) -> list[dict]:
    """Properties of every EKS managed node group in the synthesized CloudFormation."""
    return [res["Properties"] for template in synth(name).templates.values()
            for res in template["Resources"].values() if res["Type"] == "AWS::EKS::Nodegroup"]


def ray_cluster_spec(name: str) -> dict:
    return next(o for o in k8s_objects(name) if o["kind"] == "RayCluster")["spec"]


def pod_templates(name: str) -> list[dict]:
    spec = ray_cluster_spec(name)
    return [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]


def schedulable_on(pod_spec: dict, group: dict) -> bool:
    """Whether a pod with this spec could land on a node of this node group (labels and taints)."""
    labels = group.get("Labels") or {}
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    tolerations = pod_spec.get("tolerations") or []
    for taint in group.get("Taints") or []:
        if not any(t.get("key") == taint["Key"] and t.get("value", "") == taint.get("Value", "")
                   and cfn_taint_effect(t.get("effect", "NoSchedule")) == taint["Effect"] for t in tolerations):
            return False
    return True


@pytest.mark.parametrize("name", VARIANTS)
def test_every_ray_pod_fits_a_node_group_the_stacks_create(name):
    groups = nodegroups(name)
    for template in pod_templates(name):
        matches = [g for g in groups if schedulable_on(template["spec"], g)]
        assert matches, f"{template['spec'].get('nodeSelector')} matches no node group's labels and taints"


@pytest.mark.parametrize("name", VARIANTS)
def test_each_worker_group_lands_on_gpu_nodes_only_and_head_on_system_nodes(name):
    groups = nodegroups(name)
    spec = ray_cluster_spec(name)
    head_groups = [g for g in groups if schedulable_on(spec["headGroupSpec"]["template"]["spec"], g)]
    assert head_groups and all(not g.get("Taints") for g in head_groups)
    for worker in spec["workerGroupSpecs"]:
        targets = [g for g in groups if schedulable_on(worker["template"]["spec"], g)]
        assert len(targets) == 1, worker["groupName"]
        assert targets[0]["AmiType"] == "AL2023_x86_64_NVIDIA"


@pytest.mark.parametrize("name", VARIANTS)
def test_image_prepull_lands_on_every_node_group(name):
    """GPU groups (workers) and the system group (the head and its SidecarMode submitter)."""
    (daemon_set,) = [o for o in k8s_objects(name) if o["kind"] == "DaemonSet"]
    pod = daemon_set["spec"]["template"]["spec"]
    for group in nodegroups(name):
        assert schedulable_on(pod, group), group["Labels"]


@pytest.mark.parametrize("name", [*VARIANTS, "alt"])
def test_no_public_ray_endpoint(name):
    """Nothing in the stacks exposes Ray (no load balancer, no Kubernetes object applied by CDK), and the
    manifests keep the head's dashboard and GCS behind a ClusterIP Service with no Ingress."""
    for stack, template in synth(name).templates.items():
        for res in template["Resources"].values():
            assert not res["Type"].startswith("AWS::ElasticLoadBalancing"), stack
            assert res["Type"] != "Custom::AWSCDK-EKS-KubernetesResource", stack
            if res["Type"] == "Custom::AWSCDK-EKS-HelmChart":
                assert "LoadBalancer" not in res["Properties"].get("Values", ""), res["Properties"]["Chart"]
    objects = k8s_objects(name)
    head = ray_cluster_spec(name)["headGroupSpec"]
    assert head["serviceType"] == "ClusterIP" and head["enableIngress"] is False
    assert not [o for o in objects if o["kind"] in {"Ingress", "Service"}]  # KubeRay makes the ClusterIP one


@pytest.mark.parametrize("name", VARIANTS)
def test_worker_gpus_equal_world_size_and_node_group_capacity(name):
    config = synth(name).config
    spec = ray_cluster_spec(name)
    total = 0
    for worker in spec["workerGroupSpecs"]:
        gpus = int(worker["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        total += worker["replicas"] * gpus
    assert total == config.world_size
    # The most GPUs the node groups can hold (the autoscaler brings them up to MaxSize for the job's pods).
    gpu_capacity = sum(g["ScalingConfig"]["MaxSize"] * config.instance(wg).gpus
                       for g, wg in zip(sorted((g for g in nodegroups(name) if g.get("Taints")),
                                               key=lambda g: g["Labels"]["ray-efa.io/worker-group"]),
                                        sorted(config.cluster.worker_groups, key=lambda w: w.name), strict=True))
    assert gpu_capacity == total


@pytest.mark.parametrize("name", VARIANTS)
def test_service_account_matches_pod_identity_association(name):
    associations = [res["Properties"] for template in synth(name).templates.values()
                    for res in template["Resources"].values() if res["Type"] == "AWS::EKS::PodIdentityAssociation"]
    ray_assoc = [a for a in associations if a["ServiceAccount"] == synth(name).config.ray.service_account]
    assert len(ray_assoc) == 1
    accounts = [o for o in k8s_objects(name) if o["kind"] == "ServiceAccount"]
    # The watchdog's account (job.watchdog) talks only to the Kubernetes API: no AWS role, no association.
    watchdog_account = [(synth(name).config.ray.namespace, watchdog.name(synth(name).config))] \
        if synth(name).config.job.watchdog else []
    assert [(a["metadata"]["namespace"], a["metadata"]["name"]) for a in accounts] == [
        (ray_assoc[0]["Namespace"], ray_assoc[0]["ServiceAccount"]), *watchdog_account]
    assert [a for a in associations if (a["Namespace"], a["ServiceAccount"]) in watchdog_account] == []
    for template in pod_templates(name):
        assert template["spec"]["serviceAccountName"] == ray_assoc[0]["ServiceAccount"]


@pytest.mark.parametrize("name", VARIANTS)
def test_scaling_config_matches_the_ray_cluster(name):
    from workloads.fsdp_finetune.run_plan import cluster_plan
    from workloads.fsdp_finetune.trainer import build_trainer

    config = synth(name).config
    scaling = build_trainer(cluster_plan(config, bucket="example-bucket")).scaling_config
    spec = ray_cluster_spec(name)
    assert scaling.num_workers == config.world_size
    assert scaling.use_gpu and scaling.resources_per_worker["GPU"] == 1
    for worker in spec["workerGroupSpecs"]:
        limits = worker["template"]["spec"]["containers"][0]["resources"]["limits"]
        # Every Ray Train worker of the pod must fit in the pod's CPU (Ray reads it from the limit).
        assert scaling.resources_per_worker["CPU"] * int(limits["nvidia.com/gpu"]) < int(limits["cpu"])


def test_workload_storage_lies_where_the_stacks_expire_and_keep_objects():
    from workloads.fsdp_finetune.run_plan import cluster_plan

    result = synth("default")
    config = result.config
    plan = cluster_plan(config, bucket="example-bucket")
    bucket = next(r["Properties"] for r in result.templates["storage"]["Resources"].values()
                  if r["Type"] == "AWS::S3::Bucket")
    expiring = [r["Prefix"] for r in bucket["LifecycleConfiguration"]["Rules"] if "ExpirationInDays" in r]
    assert plan.storage_path.startswith("s3://example-bucket/")
    checkpoint_key = plan.storage_path.removeprefix("s3://example-bucket/") + "/"
    export_key = plan.export_uri.removeprefix("s3://example-bucket/")
    assert any(checkpoint_key.startswith(prefix) for prefix in expiring)
    assert not any(export_key.startswith(prefix) for prefix in expiring)
    assert checkpoint_key.startswith(config.storage.prefix + "/") and export_key.startswith(config.storage.prefix + "/")
