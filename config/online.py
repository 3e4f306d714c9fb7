"""`python -m config check --online`: what only the network can tell, with every request bounded in time.

Without `--online` nothing here runs: `offline_notes` says in one line each what was skipped. With it:

* the Hub: that a Hugging Face model or dataset id exists (huggingface_hub `model_info` / `dataset_info`);
* S3: that the `s3://` model or dataset bucket answers (`HeadBucket`);
* with AWS credentials (boto3's default chain; `AWS_ENDPOINT_URL` points it elsewhere, as the tests do):
  - the account's vCPU quota for each GPU family (Service Quotas `GetServiceQuota`, EC2's "Running
    On-Demand ..." / "All ... Spot Instance Requests" quotas, counted in vCPUs) against the vCPUs the
    worker groups can grow to;
  - that each GPU instance type is offered in the GPU AZ (EC2 `DescribeInstanceTypeOfferings` with
    `LocationType=availability-zone`: AZ names map to different zones in each account, so only the
    account can say);
  - that each capacity reservation exists, is in the GPU AZ and is for the group's instance type
    (EC2 `DescribeCapacityReservations`);
  - that EKS offers each pinned managed add-on version (MANAGED_ADDON_VERSIONS, config/versions.py) for the
    cluster's Kubernetes version in the region (EKS `DescribeAddonVersions`); offline they are unconfirmed;
  - that the KubeRay operator chart at `ray.kuberay_version` is in its Helm repository's index.yaml (no
    credentials needed);
  - that each worker group's `deployed` flag says what EKS has: `deployed: false` for a node group that exists
    (EKS `ListNodegroups` / `DescribeNodegroup` of the cluster, matched by the node group's worker-group tag)
    would keep `ScalingConfig.DesiredSize` in the template, and `deployed: true` for one that does not would
    create it without (check_node_groups);
  - with `storage.existing_bucket: true`, that the kept checkpoint bucket exists and its bucket policy still
    holds the TLS-only statement the first deploy wrote (S3 `GetBucketPolicy`; STS `GetCallerIdentity` for the
    account in the derived name): the redeploy declares no policy of its own (stacks/storage.py).

A failure of the check itself (no route, a timeout, an API the endpoint does not implement) is a note,
not a problem: only an answer that the file cannot deploy is a problem.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from config.base import Problem
from config.model import ClusterConfig

# Seconds for one connection and one read; one retry at most. A dead network costs seconds, not the
# ~50 s of huggingface_hub's and botocore's default retries.
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 10

# EC2's vCPU quotas by instance-family letter (Service Quotas, service code `ec2`), on-demand and spot.
VCPU_QUOTAS = {
    ("g", "on_demand"): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("p", "on_demand"): ("L-417A185B", "Running On-Demand P instances"),
    ("g", "spot"): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ("p", "spot"): ("L-7212CCBC", "All P Spot Instance Requests"),
}


@dataclass
class Findings:
    """What the online checks found: problems (the file cannot deploy) and notes (what was not checked, why)."""

    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _hub_sources(config: ClusterConfig) -> dict[str, str]:
    from config.job_fields import _looks_like_hub_id

    return {name: getattr(config.job, name) for name in ("model", "dataset")
            if not getattr(config.job, name).startswith("s3://") and _looks_like_hub_id(getattr(config.job, name))
            and not os.path.exists(getattr(config.job, name))}


def offline_notes(config: ClusterConfig) -> list[str]:
    """One line per check skipped because `--online` was not given."""
    notes = [f"job.{name} '{value}' is on the Hugging Face Hub: not checked (offline; --online checks it)"
             for name, value in _hub_sources(config).items()]
    notes += [f"job.{name} s3://{loc.bucket}/{loc.key}: not checked (offline; --online checks it)"
              for name, loc in config.job.s3_sources.items()]
    notes.append("AWS quota, instance offering and capacity reservation: not checked (offline; --online checks "
                 "them with AWS credentials)")
    notes.append(f"ray.kuberay_version: chart kuberay-operator {config.ray.kuberay_version} not confirmed in its "
                 "Helm repository (offline; --online reads its index.yaml)")
    if _owned_groups(config):
        notes.append("cluster.worker_groups.*.deployed: not compared with the node groups EKS has (offline; --online "
                     "asks EKS ListNodegroups/DescribeNodegroup)")
    notes.append(f"EKS add-on versions ({', '.join(f'{n} {v}' for n, v in addon_pins(config).items())}): not "
                 "confirmed for this region (offline; --online asks EKS DescribeAddonVersions)")
    if config.storage.existing_bucket:
        notes.append("storage.existing_bucket: the kept bucket and its TLS-only policy: not checked (offline; "
                     "--online checks them with AWS credentials)")
    return notes


def _boto_config():
    from botocore.config import Config

    return Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
                  retries={"max_attempts": 2, "mode": "standard"})


def check_hub(config: ClusterConfig, found: Findings) -> None:
    """The model and dataset ids exist on the Hub (bounded by READ_TIMEOUT_S per request)."""
    sources = _hub_sources(config)
    if not sources:
        return
    try:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError
    except ImportError:
        found.notes.append("huggingface_hub is not installed: Hub ids not checked")
        return
    from config.hub import TOKEN_FIELD, http_status, hub_access, needs_token_message

    api = HfApi()
    secret = config.job.hf_token_secret
    for name, repo in sources.items():
        info = api.model_info if name == "model" else api.dataset_info
        try:
            info(repo, timeout=READ_TIMEOUT_S)
        except (RepositoryNotFoundError, HfHubHTTPError) as exc:
            if not isinstance(exc, RepositoryNotFoundError) and http_status(exc) not in (401, 403):
                found.notes.append(f"job.{name} '{repo}': the Hub answered HTTP {http_status(exc)}; not checked")
                continue
            # The Hub answers 401 to an anonymous request for a private or gated repository, 404 for a missing one.
            if http_status(exc) in (401, 403) and not secret:
                found.problems.append(Problem(path=TOKEN_FIELD, message=needs_token_message(
                    repo, f"is refused without a token (HTTP {http_status(exc)}: private or gated)")))
            elif http_status(exc) in (401, 403):
                found.notes.append(f"job.{name} '{repo}': needs the token in {TOKEN_FIELD}, which the preflight and "
                                   "`python -m workloads.plan --online` check")
            else:
                found.problems.append(Problem(path=f"job.{name}", message=(
                    f"'{repo}' is not on the Hugging Face Hub; check the id (a private repository needs "
                    f"{TOKEN_FIELD}: docs/gated-models.md)")))
            continue
        except Exception as exc:  # noqa: BLE001 - no route, timeout, rate limit: not the file's fault
            found.notes.append(f"job.{name} '{repo}': the Hub did not answer ({type(exc).__name__}); not checked")
            continue
        if secret:
            continue  # whether the token reads it: plan --online and the preflight, which can fetch the secret
        # A gated repository's metadata is public; only its auth-check says a token is needed for the files.
        access = hub_access(repo, token=None, repo_type=name if name == "dataset" else "model",
                            timeout_s=READ_TIMEOUT_S, field=f"job.{name}")
        if access.status == "needs_token":
            found.problems.append(Problem(path=TOKEN_FIELD, message=access.message))


def check_chart_index(config: ClusterConfig, found: Findings, repository: str | None = None) -> None:
    """The KubeRay operator chart at `ray.kuberay_version` is listed in its repository's index.yaml (`helm install`
    of a version the index lacks fails the chart's custom resource, and a first deploy rolls the cluster back)."""
    import urllib.request

    import yaml

    from config.versions import KUBERAY_CHART, KUBERAY_REPOSITORY

    # KUBERAY_HELM_REPOSITORY points it elsewhere (a mirror; the tests' loopback server), as AWS_ENDPOINT_URL does AWS.
    repository = repository or os.environ.get("KUBERAY_HELM_REPOSITORY") or KUBERAY_REPOSITORY
    url = f"{repository.rstrip('/')}/index.yaml"
    version = config.ray.kuberay_version
    try:
        with urllib.request.urlopen(url, timeout=READ_TIMEOUT_S) as answer:  # noqa: S310 - a fixed https URL
            index = yaml.safe_load(answer.read())
    except Exception as exc:  # noqa: BLE001 - no route, a timeout, a bad index: a note, not a problem
        found.notes.append(f"ray.kuberay_version: chart {KUBERAY_CHART} {version} not confirmed ({url}: "
                           f"{type(exc).__name__})")
        return
    listed = [str(entry.get("version")) for entry in (index or {}).get("entries", {}).get(KUBERAY_CHART, [])]
    if version not in listed:
        found.problems.append(Problem(path="ray.kuberay_version", message=(
            f"{url} lists no {KUBERAY_CHART} {version} (newest: {', '.join(listed[:3]) or 'none'}); pick a "
            "version it lists")))


def check_aws(config: ClusterConfig, found: Findings, session=None) -> None:
    """S3 sources, GPU quotas, offerings in the GPU AZ, capacity reservations (needs credentials)."""
    import boto3

    session = session or boto3.session.Session(region_name=config.region)
    if session.get_credentials() is None:
        found.notes.append("no AWS credentials: S3 sources, quotas, offerings and reservations not checked")
        return
    cfg = _boto_config()
    s3 = session.client("s3", config=cfg)
    _check_s3(config, found, s3)
    if config.storage.existing_bucket:
        check_kept_bucket(config, found, s3, session.client("sts", region_name=config.region, config=cfg))
    eks = session.client("eks", region_name=config.region, config=cfg)
    check_node_groups(config, found, eks)
    check_addon_versions(config, found, eks)
    ec2 = session.client("ec2", region_name=config.region, config=cfg)
    _check_offerings(config, found, ec2)
    _check_reservations(config, found, ec2)
    _check_quotas(config, found, session.client("service-quotas", region_name=config.region, config=cfg))


def _error(exc: Exception) -> tuple[str, str]:
    response = getattr(exc, "response", None) or {}
    error = response.get("Error", {})
    return error.get("Code", type(exc).__name__), error.get("Message", str(exc))


def _check_s3(config: ClusterConfig, found: Findings, s3) -> None:
    for name, location in config.job.s3_sources.items():
        try:
            s3.head_bucket(Bucket=location.bucket)
        except Exception as exc:  # noqa: BLE001 - botocore's ClientError and connection errors alike
            code, _ = _error(exc)
            if code in ("404", "NoSuchBucket"):
                found.problems.append(Problem(path=f"job.{name}", message=(
                    f"bucket '{location.bucket}' does not exist; check the s3:// URI")))
            else:
                found.notes.append(f"job.{name}: bucket '{location.bucket}' not checked ({code})")


def addon_pins(config: ClusterConfig) -> dict[str, str]:
    """The managed add-ons the cluster stack installs for `config`, with their pinned versions."""
    from config.versions import MANAGED_ADDON_VERSIONS

    pins = dict(MANAGED_ADDON_VERSIONS.get(config.cluster.kubernetes_version, {}))
    if not config.cluster.cloudwatch_observability:
        pins.pop("amazon-cloudwatch-observability", None)
    return pins


def check_addon_versions(config: ClusterConfig, found: Findings, eks) -> None:
    """Every pinned add-on version is one EKS offers for the Kubernetes version in this region; a version it does not
    list fails `AWS::EKS::Addon` at deploy time, after the cluster was created."""
    version = config.cluster.kubernetes_version
    for name, pinned in addon_pins(config).items():
        try:
            answer = eks.describe_addon_versions(kubernetesVersion=version, addonName=name)
        except Exception as exc:  # noqa: BLE001
            found.notes.append(f"EKS add-on {name} {pinned}: not confirmed ({_error(exc)[0]})")
            continue
        offered = [v["addonVersion"] for addon in answer.get("addons", []) for v in addon.get("addonVersions", [])]
        if pinned not in offered:
            newest = ", ".join(offered[:3]) or "none"
            found.problems.append(Problem(path="cluster.kubernetes_version", message=(
                f"EKS in {config.region} offers no {name} {pinned} for Kubernetes {version} (it lists {newest}); "
                "pin one it offers in MANAGED_ADDON_VERSIONS (config/versions.py)")))


def existing_node_groups(config: ClusterConfig, eks) -> dict[str, str] | None:
    """The node groups of the cluster `cluster.name` that EKS has, by worker group: {worker group: node group name}.
    None when the cluster itself does not exist (a first deploy, or after a teardown). The stacks do not name the node
    groups (CloudFormation generates the names), so each is recognised by the tag the stack puts on it,
    `ray-efa.io/worker-group: <worker group>` (stacks/efa_nodegroup.py, the Cluster Autoscaler's template tags);
    DescribeNodegroup returns a node group's tags. Errors other than a missing cluster propagate."""
    from config.k8s import WORKER_GROUP_LABEL

    name = config.cluster.name
    try:
        eks.describe_cluster(name=name)
    except Exception as exc:  # noqa: BLE001 - botocore's ClientError; anything else propagates below
        if _error(exc)[0] == "ResourceNotFoundException":
            return None
        raise
    groups: dict[str, str] = {}
    for page in eks.get_paginator("list_nodegroups").paginate(clusterName=name):
        for nodegroup in page.get("nodegroups", []):
            try:
                tags = eks.describe_nodegroup(clusterName=name, nodegroupName=nodegroup)["nodegroup"].get("tags") or {}
            except Exception as exc:  # noqa: BLE001
                if _error(exc)[0] == "ResourceNotFoundException":
                    continue  # deleted between the listing and the describe
                raise
            if WORKER_GROUP_LABEL in tags:
                groups[tags[WORKER_GROUP_LABEL]] = nodegroup
    return groups


def _owned_groups(config: ClusterConfig) -> list:
    """(index, group) of the worker groups whose template depends on `deployed`: under the autoscaler, or a capacity
    block's (stacks/efa_nodegroup.py); the others keep DesiredSize = nodes whatever the flag says."""
    return [(i, g) for i, g in enumerate(config.cluster.worker_groups)
            if config.autoscaling.enabled or g.capacity == "capacity_block"]


def check_node_groups(config: ClusterConfig, found: Findings, eks) -> None:
    """Each worker group's `deployed` against the node groups EKS has, for the groups where the flag changes the
    template (under the autoscaler, or a capacity block: stacks/efa_nodegroup.py).

    Creating a node group needs DesiredSize beside MinSize and MaxSize: "When creating a node group, you must specify
    all or none of the properties" (EKS API Reference, NodegroupScalingConfig; the same sentence in the CloudFormation
    template reference, AWS::EKS::Nodegroup ScalingConfig; "none" would mean EKS's own sizes, not the file's). And
    "whenever this parameter changes, the number of worker nodes in the node group is updated to the specified size
    ... When using CloudFormation, no action occurs if you remove this parameter from your CFN template" (same page,
    desiredSize). So both mismatches cost something: `deployed: true` for a group that does not exist fails its
    creation (the deploy rolls back); `deployed: false` for one that exists keeps DesiredSize = the minimum in the
    template, and the next min_nodes/max_nodes change resizes the group to it, terminating the nodes of a running
    job."""
    owned = _owned_groups(config)
    if not owned:
        return
    name = config.cluster.name
    try:
        existing = existing_node_groups(config, eks)
    except Exception as exc:  # noqa: BLE001 - no route, no permission, an API the endpoint lacks: a note
        found.notes.append(f"cluster.worker_groups.*.deployed: not compared with EKS's node groups of cluster "
                           f"{name} ({_error(exc)[0]})")
        return
    for i, group in owned:
        path = f"cluster.worker_groups.{i}.deployed"
        nodegroup = (existing or {}).get(group.name)
        if nodegroup and not group.deployed:
            found.problems.append(Problem(path=path, message=(
                f"false, but cluster {name} already has node group {nodegroup} for worker group '{group.name}' (EKS "
                f"DescribeNodegroup): the template would keep ScalingConfig.DesiredSize = {config.group_min(group)}, "
                "and the next min_nodes or max_nodes change would resize the group to it, terminating running nodes. "
                "Set deployed: true (docs/lifecycle.md, 'The first deploy and deployed: true')")))
        elif not nodegroup and group.deployed:
            where = f"there is no cluster {name}" if existing is None else f"cluster {name} has no node group for it"
            found.problems.append(Problem(path=path, message=(
                f"true, but {where} (EKS ListNodegroups): the template would create worker group '{group.name}' "
                "without ScalingConfig.DesiredSize, while EKS documents that creating a node group takes all three "
                "sizes or none (NodegroupScalingConfig), so expect the creation to fail and the deploy to roll back. "
                "Set deployed: false until a deploy has created it (after a "
                "teardown too; docs/lifecycle.md, 'The first deploy and deployed: true')")))


def is_tls_only_statement(statement: dict, bucket: str) -> bool:
    """The statement `s3.Bucket(enforce_ssl=True)` writes (aws-cdk-lib aws-s3 bucket.js `enforceSSLStatement`):
    Deny every action to every principal when `aws:SecureTransport` is false, on the bucket and its objects."""
    def listed(value, wanted: str) -> bool:
        return value == wanted or (isinstance(value, list) and wanted in value)

    principal = statement.get("Principal")
    condition = statement.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport")
    arn = f"arn:aws:s3:::{bucket}"
    resources = statement.get("Resource")
    resources = resources if isinstance(resources, list) else [resources]
    return (statement.get("Effect") == "Deny" and (principal == "*" or listed((principal or {}).get("AWS"), "*"))
            and listed(statement.get("Action"), "s3:*") and str(condition).lower() == "false"
            and any(str(r).endswith(arn) for r in resources) and any(str(r).endswith(f"{arn}/*") for r in resources))


def check_kept_bucket(config: ClusterConfig, found: Findings, s3, sts) -> None:
    """`storage.existing_bucket: true`: the bucket exists and still refuses plain HTTP (its retained policy)."""
    import json

    path = "storage.existing_bucket"
    try:
        bucket = config.storage.bucket_name or config.bucket_name(sts.get_caller_identity()["Account"])
        policy = json.loads(s3.get_bucket_policy(Bucket=bucket)["Policy"])
    except Exception as exc:  # noqa: BLE001
        code, _ = _error(exc)
        if code in ("NoSuchBucket", "404"):
            found.problems.append(Problem(path=path, message=(
                f"true, but bucket '{bucket}' does not exist in this account; set existing_bucket: false so the "
                "storage stack creates it")))
        elif code == "NoSuchBucketPolicy":
            found.problems.append(Problem(path=path, message=(
                f"bucket '{bucket}' has no bucket policy, so it accepts plain HTTP: the TLS-only policy the first "
                "deploy kept is gone. Put it back (docs/lifecycle.md, 'Teardown and the next deploy') before "
                "deploying")))
        else:
            found.notes.append(f"{path}: the kept bucket's policy not checked ({code})")
        return
    statements = policy.get("Statement", [])
    statements = statements if isinstance(statements, list) else [statements]
    if not any(is_tls_only_statement(statement, bucket) for statement in statements):
        found.problems.append(Problem(path=path, message=(
            f"the policy of bucket '{bucket}' has no TLS-only statement (Deny s3:* to every principal when "
            "aws:SecureTransport is false, on the bucket and its objects), so it accepts plain HTTP; put it back "
            "(docs/lifecycle.md, 'Teardown and the next deploy') before deploying")))


def _check_offerings(config: ClusterConfig, found: Findings, ec2) -> None:
    az = config.gpu_availability_zone
    for i, group in enumerate(config.cluster.worker_groups):
        try:
            offers = ec2.describe_instance_type_offerings(
                LocationType="availability-zone",
                Filters=[{"Name": "location", "Values": [az]},
                         {"Name": "instance-type", "Values": [group.instance_type]}])["InstanceTypeOfferings"]
        except Exception as exc:  # noqa: BLE001
            found.notes.append(f"cluster.worker_groups.{i}.instance_type: offerings not checked ({_error(exc)[0]})")
            continue
        if not offers:
            found.problems.append(Problem(path=f"cluster.worker_groups.{i}.instance_type", message=(
                f"{group.instance_type} is not offered in {az} for this account (AZ names map to different zones "
                "per account); pick another gpu_availability_zone or instance type")))


def _check_reservations(config: ClusterConfig, found: Findings, ec2) -> None:
    az = config.gpu_availability_zone
    for i, group in enumerate(config.cluster.worker_groups):
        if not group.capacity_reservation_id:
            continue
        path = f"cluster.worker_groups.{i}.capacity_reservation_id"
        try:
            found_crs = ec2.describe_capacity_reservations(
                CapacityReservationIds=[group.capacity_reservation_id])["CapacityReservations"]
        except Exception as exc:  # noqa: BLE001
            code, message = _error(exc)
            if code.startswith("InvalidCapacityReservationId"):
                found.problems.append(Problem(path=path, message=f"{group.capacity_reservation_id}: {message}"))
            else:
                found.notes.append(f"{path}: reservation not checked ({code})")
            continue
        for cr in found_crs:
            if cr.get("AvailabilityZone") != az:
                found.problems.append(Problem(path=path, message=(
                    f"{group.capacity_reservation_id} is in {cr.get('AvailabilityZone')}, not the GPU AZ {az}; "
                    f"set gpu_availability_zone: {cr.get('AvailabilityZone')}")))
            if cr.get("InstanceType") != group.instance_type:
                found.problems.append(Problem(path=path, message=(
                    f"{group.capacity_reservation_id} reserves {cr.get('InstanceType')}, not {group.instance_type}")))


def _check_quotas(config: ClusterConfig, found: Findings, quotas) -> None:
    needed: dict[tuple[str, str], int] = {}
    for group in config.cluster.worker_groups:
        key = (group.instance_type[0], group.capacity)
        if key in VCPU_QUOTAS:
            needed[key] = needed.get(key, 0) + config.group_max(group) * config.instance(group).vcpus
    for key, vcpus in sorted(needed.items()):
        code, name = VCPU_QUOTAS[key]
        try:
            value = quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]
        except Exception as exc:  # noqa: BLE001
            found.notes.append(f"quota '{name}' ({code}) not checked ({_error(exc)[0]})")
            continue
        if value < vcpus:
            found.problems.append(Problem(path="cluster.worker_groups", message=(
                f"the groups can grow to {vcpus} vCPUs of {key[0].upper()} instances ({key[1]}), over the "
                f"account's quota '{name}' of {value:g} vCPUs; request an increase (Service Quotas {code}) or "
                "lower max_nodes")))


def online_findings(config: ClusterConfig, session=None) -> Findings:
    """Every online check; problems mean the file cannot deploy from this account."""
    found = Findings()
    check_hub(config, found)
    check_chart_index(config, found)
    check_aws(config, found, session)
    return found
