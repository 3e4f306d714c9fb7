"""`config check` touches no network unless `--online`; with it, the Hub, S3 and EC2 checks, against loopback servers.

AWS answers come from moto's server on 127.0.0.1 (harness/loopback.py, IAM auth enforced, a user with only
the read actions the checks need); the Hub is a loopback HTTP server that counts requests, so "offline"
is shown by zero requests reaching it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from http.server import BaseHTTPRequestHandler

import pytest

from harness.loopback import _OTHER_CREDENTIAL_VARS, ThreadedHTTPServer, only_policy
from tests.helpers import REPO, write_variant

pytestmark = pytest.mark.slow  # the config CLI in child processes, against moto and a fake Hub

CHECK_TIMEOUT_S = 120
NO_AWS = {"AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true"}
# HeadBucket needs s3:ListBucket on AWS; moto 5.2.5 authorizes it as "s3:HeadBucket" (moto/s3/responses.py
# ACTION_MAP), so the user gets both.
READ_ACTIONS = ["ec2:DescribeInstanceTypeOfferings", "ec2:DescribeCapacityReservations",
                "servicequotas:GetServiceQuota", "s3:ListBucket", "s3:HeadBucket"]


class _Hub(BaseHTTPRequestHandler):
    """Answers every request as the Hub answers for a repository that does not exist, and counts them."""

    def do_GET(self):  # noqa: N802 (http.server's naming)
        self.server.paths.append(self.path)
        body = json.dumps({"error": "Repository not found"}).encode()
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET  # noqa: N815

    def log_message(self, *args):
        pass


@pytest.fixture
def hub():
    served = ThreadedHTTPServer(_Hub)
    served.server.paths = []
    try:
        yield served.server
    finally:
        served.close()


# Where `--online` looks for the KubeRay chart's index.yaml: a loopback port nothing listens on (refused at once, a
# note), unless a test serves one; tests talk to 127.0.0.1 only.
NO_HELM = {"KUBERAY_HELM_REPOSITORY": "http://127.0.0.1:1/"}


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in _OTHER_CREDENTIAL_VARS and not k.startswith("HF_")}
    base.update(NO_HELM)
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, env={**base, **env}, capture_output=True,
                          text=True, timeout=CHECK_TIMEOUT_S)


def _hub_env(hub, tmp_path) -> dict[str, str]:
    return {"HF_ENDPOINT": f"http://127.0.0.1:{hub.server_address[1]}", "HF_HOME": str(tmp_path / "hf")}


def test_offline_check_names_what_it_skipped_and_sends_nothing(tmp_path, hub):
    path = write_variant(tmp_path)
    result = _run(["config", "check", str(path)], _hub_env(hub, tmp_path))
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert any("job.model 'Qwen/Qwen2.5-1.5B' is on the Hugging Face Hub: not checked" in n for n in notes)
    assert any("job.dataset 'yahma/alpaca-cleaned'" in n for n in notes)
    assert any("AWS quota, instance offering and capacity reservation: not checked" in n for n in notes)
    assert any("cluster.worker_groups.*.deployed: not compared with the node groups EKS has (offline" in n
               for n in notes)
    assert hub.paths == []


def test_workloads_check_offline_does_not_ask_the_hub_for_the_tokenizer(tmp_path, hub):
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"instruction": "hi", "output": "there"}) + "\n")
    path = write_variant(tmp_path, {"job": {"dataset": str(data)}})
    result = _run(["workloads.check", str(path)], _hub_env(hub, tmp_path))
    assert result.returncode == 0, result.stderr
    assert hub.paths == []
    assert "note: dataset tokens and epochs not counted here" in result.stderr


def test_online_check_refuses_a_model_the_hub_does_not_have(tmp_path, hub):
    path = write_variant(tmp_path)
    result = _run(["config", "check", str(path), "--online"], {**_hub_env(hub, tmp_path), **NO_AWS})
    assert result.returncode == 2, result.stderr
    assert f"{path}: job.model: 'Qwen/Qwen2.5-1.5B' is not on the Hugging Face Hub" in result.stderr
    assert f"{path}: job.dataset: 'yahma/alpaca-cleaned' is not on the Hugging Face Hub" in result.stderr
    assert "Traceback" not in result.stderr
    assert any(p.startswith("/api/models/Qwen/Qwen2.5-1.5B") for p in hub.paths)


@pytest.fixture(scope="module")
def reader(moto_server):
    keys = moto_server.create_user("config-check-online", only_policy(READ_ACTIONS))
    moto_server.create_bucket("online-models")
    return keys


def _aws_env(moto_server, keys, tmp_path) -> dict[str, str]:
    return {**keys.env(), "AWS_ENDPOINT_URL": moto_server.endpoint_url, "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "HF_HOME": str(tmp_path / "hf")}


S3_JOB = {"job": {"model": "s3://online-models/qwen", "dataset": "s3://online-missing/alpaca/train.jsonl"}}


def test_online_check_refuses_a_missing_s3_bucket(tmp_path, moto_server, reader):
    path = write_variant(tmp_path, {**S3_JOB, "region": "us-west-2", "gpu_availability_zone": "us-west-2a"})
    result = _run(["config", "check", str(path), "--online"], _aws_env(moto_server, reader, tmp_path))
    assert result.returncode == 2, result.stderr
    assert f"{path}: job.dataset: bucket 'online-missing' does not exist" in result.stderr
    assert "job.model:" not in result.stderr


def test_online_check_refuses_a_type_not_offered_in_the_gpu_az(tmp_path, moto_server, reader):
    path = write_variant(tmp_path, {"job": {"model": "s3://online-models/qwen", "dataset": "s3://online-models/d"},
                                    "region": "us-east-1", "gpu_availability_zone": "us-east-1e"})
    result = _run(["config", "check", str(path), "--online"], _aws_env(moto_server, reader, tmp_path))
    assert result.returncode == 2, result.stderr
    assert (f"{path}: cluster.worker_groups.0.instance_type: g6.12xlarge is not offered in us-east-1e"
            in result.stderr)


def test_online_check_accepts_a_type_offered_in_the_gpu_az(tmp_path, moto_server, reader):
    path = write_variant(tmp_path, {"job": {"model": "s3://online-models/qwen", "dataset": "s3://online-models/d"},
                                    "region": "us-east-1", "gpu_availability_zone": "us-east-1a"})
    result = _run(["config", "check", str(path), "--online"], _aws_env(moto_server, reader, tmp_path))
    assert result.returncode == 0, result.stderr
    # moto 5.2.5 implements Service Quotas for the `vpc` service only (moto/servicequotas/models.py): the EC2
    # GPU quota is reported as not checked, not as a problem.
    assert "note: quota 'Running On-Demand G and VT instances' (L-DB2E81BA) not checked" in result.stderr


def test_online_check_notes_a_reservation_it_cannot_read(tmp_path, moto_server, reader):
    group = {"capacity": "capacity_block", "capacity_reservation_id": "cr-0123456789abcdef0"}
    path = write_variant(tmp_path, {"job": {"model": "s3://online-models/qwen", "dataset": "s3://online-models/d"},
                                    "region": "us-east-1", "gpu_availability_zone": "us-east-1a"}, group=group)
    result = _run(["config", "check", str(path), "--online"], _aws_env(moto_server, reader, tmp_path))
    # moto 5.2.5 has no DescribeCapacityReservations: the check says so instead of guessing.
    assert "note: cluster.worker_groups.0.capacity_reservation_id: reservation not checked" in result.stderr
    assert "Traceback" not in result.stderr


def test_online_check_without_credentials_says_so(tmp_path):
    path = write_variant(tmp_path, {"job": {"model": "s3://online-models/qwen", "dataset": "s3://online-models/d"}})
    result = _run(["config", "check", str(path), "--online"], NO_AWS)
    assert result.returncode == 0, result.stderr
    assert "note: no AWS credentials: S3 sources, quotas, offerings and reservations not checked" in result.stderr


def test_online_check_names_the_token_field_for_a_gated_model(tmp_path):
    from tests.hub_server import FakeHub

    with FakeHub(repo="meta-llama/Llama-3.2-1B", token="hf_right") as gated:
        path = write_variant(tmp_path, {"job": {"model": "meta-llama/Llama-3.2-1B", "dataset": "/tmp/none.jsonl"}})
        env = {"HF_ENDPOINT": gated.url, "HF_HOME": str(tmp_path / "hf"), **NO_AWS}
        result = _run(["config", "check", str(path), "--online"], env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{path}: job.hf_token_secret: " in result.stderr and "Traceback" not in result.stderr


# ---- storage.existing_bucket: the kept bucket's TLS-only policy (the redeploy declares none) -------------------

KEPT = "kept-ckpt-bucket"


def _tls_only(bucket: str) -> dict:
    """The policy the first deploy wrote and kept (s3.Bucket(enforce_ssl=True)'s statement, as S3 returns it)."""
    arn = f"arn:aws:s3:::{bucket}"
    return {"Version": "2012-10-17", "Statement": [{
        "Effect": "Deny", "Principal": {"AWS": "*"}, "Action": "s3:*", "Resource": [arn, f"{arn}/*"],
        "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]}


@pytest.fixture(scope="module")
def kept_reader(moto_server, reader):  # reader: the online-models bucket the job reads
    # moto 5.2.5 authorizes GetBucketPolicy as s3:GetBucketPolicy (moto/s3/responses.py ACTION_MAP).
    keys = moto_server.create_user("config-check-kept", only_policy([*READ_ACTIONS, "s3:GetBucketPolicy"]))
    moto_server.create_bucket(KEPT)
    return keys


def _kept_variant(tmp_path, bucket: str):
    return write_variant(tmp_path, {"job": {"model": "s3://online-models/qwen", "dataset": "s3://online-models/d"},
                                    "region": "us-east-1", "gpu_availability_zone": "us-east-1a",
                                    "storage": {"existing_bucket": True, "bucket_name": bucket}})


def test_online_check_accepts_a_kept_bucket_that_is_still_tls_only(tmp_path, moto_server, kept_reader):
    moto_server.client("s3").put_bucket_policy(Bucket=KEPT, Policy=json.dumps(_tls_only(KEPT)))
    result = _run(["config", "check", str(_kept_variant(tmp_path, KEPT)), "--online"],
                  _aws_env(moto_server, kept_reader, tmp_path))
    assert result.returncode == 0, result.stderr
    assert "storage.existing_bucket" not in result.stderr


def test_online_check_refuses_a_kept_bucket_whose_policy_is_gone(tmp_path, moto_server, kept_reader):
    moto_server.client("s3").delete_bucket_policy(Bucket=KEPT)
    path = _kept_variant(tmp_path, KEPT)
    result = _run(["config", "check", str(path), "--online"], _aws_env(moto_server, kept_reader, tmp_path))
    assert result.returncode == 2, result.stderr
    assert f"{path}: storage.existing_bucket: bucket '{KEPT}' has no bucket policy, so it accepts plain HTTP" \
        in result.stderr


def test_online_check_refuses_a_kept_policy_without_the_tls_rule(tmp_path, moto_server, kept_reader):
    policy = _tls_only(KEPT)
    policy["Statement"][0]["Condition"] = {"Bool": {"aws:SecureTransport": "true"}}  # the rule turned around
    moto_server.client("s3").put_bucket_policy(Bucket=KEPT, Policy=json.dumps(policy))
    path = _kept_variant(tmp_path, KEPT)
    result = _run(["config", "check", str(path), "--online"], _aws_env(moto_server, kept_reader, tmp_path))
    assert result.returncode == 2, result.stderr
    assert f"storage.existing_bucket: the policy of bucket '{KEPT}' has no TLS-only statement" in result.stderr


def test_online_check_refuses_existing_bucket_when_there_is_none(tmp_path, moto_server, kept_reader):
    path = _kept_variant(tmp_path, "never-kept-bucket")
    result = _run(["config", "check", str(path), "--online"], _aws_env(moto_server, kept_reader, tmp_path))
    assert result.returncode == 2, result.stderr
    assert "storage.existing_bucket: true, but bucket 'never-kept-bucket' does not exist" in result.stderr


# ---- EKS add-on versions: DescribeAddonVersions, answered by a loopback endpoint in EKS's REST-JSON shape ---------

class _Eks(BaseHTTPRequestHandler):
    """GET /addons/supported-versions?addonName=...&kubernetesVersion=... as EKS answers it (botocore's eks model,
    DescribeAddonVersions: `addons[].addonVersions[].addonVersion`), from the server's `offered` table."""

    def do_GET(self):  # noqa: N802 (http.server's naming)
        from urllib.parse import parse_qs, urlparse

        url = urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        self.server.asked.append((url.path, query.get("addonName"), query.get("kubernetesVersion")))
        versions = self.server.offered.get(query.get("addonName"), [])
        body = json.dumps({"addons": [{"addonName": query.get("addonName"), "type": "networking",
                                       "addonVersions": [{"addonVersion": v} for v in versions]}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _addon_findings(offered: dict[str, list[str]]):
    import boto3

    from config import load_config
    from config.online import Findings, check_addon_versions

    served = ThreadedHTTPServer(_Eks)
    served.server.offered, served.server.asked = offered, []
    try:
        eks = boto3.session.Session(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="x",
                                    region_name="us-east-2").client(
            "eks", endpoint_url=f"http://127.0.0.1:{served.port}")
        found = Findings()
        check_addon_versions(load_config(None), found, eks)
        return found, served.server.asked
    finally:
        served.close()


def test_online_check_confirms_every_pinned_addon_version():
    from config.versions import MANAGED_ADDON_VERSIONS

    pins = MANAGED_ADDON_VERSIONS["1.34"]
    found, asked = _addon_findings({name: ["v9.9.9-eksbuild.1", version] for name, version in pins.items()})
    assert (found.problems, found.notes) == ([], [])
    # The CloudWatch add-on is off in the shipped file: not asked about.
    assert sorted(a[1] for a in asked) == sorted(set(pins) - {"amazon-cloudwatch-observability"})
    assert {(a[0], a[2]) for a in asked} == {("/addons/supported-versions", "1.34")}


def test_online_check_refuses_an_addon_version_eks_does_not_offer():
    from config.versions import MANAGED_ADDON_VERSIONS

    offered = {name: [version] for name, version in MANAGED_ADDON_VERSIONS["1.34"].items()}
    offered["eks-node-monitoring-agent"] = ["v1.6.2-eksbuild.1"]
    found, _ = _addon_findings(offered)
    (problem,) = found.problems
    assert problem.path == "cluster.kubernetes_version"
    assert ("offers no eks-node-monitoring-agent v1.7.0-eksbuild.1 for Kubernetes 1.34 (it lists v1.6.2-eksbuild.1)"
            in problem.message)


def test_online_check_notes_addon_versions_it_cannot_ask(tmp_path, moto_server, reader):
    # moto 5.2.5 has no EKS add-on API, and the reader may not call it: each add-on is "not confirmed", not a problem.
    path = write_variant(tmp_path, {"job": {"model": "s3://online-models/qwen", "dataset": "s3://online-models/d"},
                                    "region": "us-east-1", "gpu_availability_zone": "us-east-1a"})
    result = _run(["config", "check", str(path), "--online"], _aws_env(moto_server, reader, tmp_path))
    assert result.returncode == 0, result.stderr
    assert "note: EKS add-on eks-node-monitoring-agent v1.7.0-eksbuild.1: not confirmed (" in result.stderr


# ---- the KubeRay chart in its Helm repository's index.yaml ----------------------------------------------------

class _HelmRepo(BaseHTTPRequestHandler):
    """A Helm repository's /index.yaml (`entries.<chart>[].version`), from the server's `versions`."""

    def do_GET(self):  # noqa: N802 (http.server's naming)
        import yaml

        self.server.paths.append(self.path)
        body = yaml.safe_dump({"apiVersion": "v1", "entries": {"kuberay-operator": [
            {"name": "kuberay-operator", "version": v} for v in self.server.versions]}}).encode()
        self.send_response(200 if self.path == "/index.yaml" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _chart_findings(versions: list[str]):
    from config import load_config
    from config.online import Findings, check_chart_index

    served = ThreadedHTTPServer(_HelmRepo)
    served.server.versions, served.server.paths = versions, []
    try:
        found = Findings()
        check_chart_index(load_config(None), found, repository=f"http://127.0.0.1:{served.port}/")
        return found, served.server.paths
    finally:
        served.close()


def test_online_check_confirms_the_kuberay_chart_in_its_index():
    found, paths = _chart_findings(["1.7.0", "1.6.1"])
    assert (found.problems, found.notes, paths) == ([], [], ["/index.yaml"])


def test_online_check_refuses_a_kuberay_chart_its_index_lacks():
    found, _ = _chart_findings(["1.4.2", "1.4.1"])
    (problem,) = found.problems
    assert problem.path == "ray.kuberay_version"
    assert "lists no kuberay-operator 1.7.0 (newest: 1.4.2, 1.4.1)" in problem.message


def test_online_check_notes_an_index_it_cannot_read(tmp_path):
    path = write_variant(tmp_path, {"job": {"model": "s3://online-models/qwen", "dataset": "s3://online-models/d"}})
    result = _run(["config", "check", str(path), "--online"], NO_AWS)
    assert result.returncode == 0, result.stderr
    assert "note: ray.kuberay_version: chart kuberay-operator 1.7.0 not confirmed (http://127.0.0.1:1/index.yaml" \
        in result.stderr


# ---- worker groups' `deployed` against the node groups EKS has (ListNodegroups / DescribeNodegroup) -------------
# moto 5.2.5's EKS backend, through its server without IAM enforcement (harness.loopback.moto_ec2_server): with auth
# enforced (the `moto_server` above) its SigV4 check refuses every EKS GET (DescribeCluster, ListNodegroups,
# DescribeNodegroup answer 403 SignatureDoesNotMatch even for the admin; measured), while the POSTs that create a
# cluster and a node group pass. The calls under test are EKS's; the IAM side is a note either way.

NG_CLUSTER = "online-ng"  # its own cluster name: nothing else in the session's moto backends uses it
NG_REGION = "us-east-1"


@pytest.fixture(scope="module")
def eks_server():
    import boto3

    from harness.loopback import FAKE_KEYS, moto_ec2_server

    with moto_ec2_server() as server:
        session = boto3.session.Session(region_name=NG_REGION, aws_access_key_id=FAKE_KEYS["AWS_ACCESS_KEY_ID"],
                                        aws_secret_access_key=FAKE_KEYS["AWS_SECRET_ACCESS_KEY"])
        eks = session.client("eks", endpoint_url=server.endpoint_url)
        role = "arn:aws:iam::123456789012:role/online-ng"
        eks.create_cluster(name=NG_CLUSTER, roleArn=role, resourcesVpcConfig={"subnetIds": ["subnet-0a"]})
        # As the stack creates it: a CloudFormation-generated name, the worker group only in the node group's tags.
        eks.create_nodegroup(clusterName=NG_CLUSTER, nodegroupName="Nodegroupgpu-1A2B3C4D5E6F", nodeRole=role,
                             subnets=["subnet-0a"], scalingConfig={"minSize": 0, "maxSize": 2, "desiredSize": 0},
                             tags={"ray-efa.io/worker-group": "gpu", "k8s.io/cluster-autoscaler/enabled": "true"})
        # Another worker group's name on a node group without the tag (made by hand): not taken for the group.
        eks.create_nodegroup(clusterName=NG_CLUSTER, nodegroupName="spare", nodeRole=role, subnets=["subnet-0a"],
                             scalingConfig={"minSize": 0, "maxSize": 1, "desiredSize": 0}, tags={"team": "spare"})
        yield server, eks


def _node_group_findings(tmp_path, eks, *, name: str = NG_CLUSTER, deployed: bool, autoscaling: bool = True):
    from config.online import Findings, check_node_groups
    from tests.helpers import load_variant

    config = load_variant(tmp_path, {"cluster": {"name": name}, "autoscaling": {"enabled": autoscaling},
                                     "region": NG_REGION, "gpu_availability_zone": "us-east-1a"},
                          group={"deployed": deployed})
    found = Findings()
    check_node_groups(config, found, eks)
    return found


def test_online_check_refuses_deployed_false_for_a_group_eks_has(tmp_path, eks_server):
    _, eks = eks_server
    found = _node_group_findings(tmp_path, eks, deployed=False)
    (problem,) = found.problems
    assert problem.path == "cluster.worker_groups.0.deployed"
    assert problem.message.startswith(f"false, but cluster {NG_CLUSTER} already has node group "
                                      "Nodegroupgpu-1A2B3C4D5E6F for worker group 'gpu'")
    assert "Set deployed: true" in problem.message and found.notes == []


def test_online_check_accepts_deployed_true_for_a_group_eks_has(tmp_path, eks_server):
    _, eks = eks_server
    found = _node_group_findings(tmp_path, eks, deployed=True)
    assert (found.problems, found.notes) == ([], [])


def test_online_check_refuses_deployed_true_when_the_cluster_is_gone(tmp_path, eks_server):
    # After a teardown (or before the first deploy): no cluster of that name, so no node group.
    _, eks = eks_server
    found = _node_group_findings(tmp_path, eks, name="online-torn-down", deployed=True)
    (problem,) = found.problems
    assert problem.path == "cluster.worker_groups.0.deployed"
    assert problem.message.startswith("true, but there is no cluster online-torn-down (EKS ListNodegroups)")
    assert "Set deployed: false until a deploy has created it" in problem.message


def test_online_check_accepts_deployed_false_before_the_first_deploy(tmp_path, eks_server):
    _, eks = eks_server
    found = _node_group_findings(tmp_path, eks, name="online-not-yet", deployed=False)
    assert (found.problems, found.notes) == ([], [])


def test_online_check_refuses_deployed_true_for_a_group_the_cluster_lacks(tmp_path, eks_server):
    # The cluster exists but has no node group tagged for this worker group (a group added to the file since).
    from config.online import Findings, check_node_groups
    from tests.helpers import load_variant

    _, eks = eks_server
    config = load_variant(tmp_path, {"cluster": {"name": NG_CLUSTER}, "region": NG_REGION,
                                     "gpu_availability_zone": "us-east-1a"}, group={"name": "spare", "deployed": True})
    found = Findings()
    check_node_groups(config, found, eks)
    (problem,) = found.problems
    assert problem.message.startswith(f"true, but cluster {NG_CLUSTER} has no node group for it")


def test_online_check_ignores_deployed_where_the_template_keeps_desired_size(tmp_path, eks_server):
    # Without the autoscaler an on-demand group keeps DesiredSize = nodes whatever `deployed` says: nothing to refuse.
    _, eks = eks_server
    assert _node_group_findings(tmp_path, eks, deployed=False, autoscaling=False).problems == []


def test_online_check_notes_node_groups_it_cannot_ask(tmp_path):
    # No route to EKS (a port nothing listens on): a note, not a problem.
    import boto3
    from botocore.config import Config

    eks = boto3.session.Session(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="x",
                                region_name=NG_REGION).client(
        "eks", endpoint_url="http://127.0.0.1:1", config=Config(retries={"max_attempts": 1}, connect_timeout=2))
    found = _node_group_findings(tmp_path, eks, deployed=True)
    assert found.problems == []
    (note,) = found.notes
    assert note.startswith(f"cluster.worker_groups.*.deployed: not compared with EKS's node groups of cluster "
                           f"{NG_CLUSTER} (")


def test_online_check_names_the_file_and_field_of_a_deployed_mismatch(tmp_path, eks_server):
    # The whole CLI against the same server: the problem is reported as FILE: FIELD: message, exit 2.
    import boto3

    from harness.loopback import FAKE_KEYS

    server, _ = eks_server
    boto3.session.Session(region_name=NG_REGION, aws_access_key_id=FAKE_KEYS["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=FAKE_KEYS["AWS_SECRET_ACCESS_KEY"]).client(
        "s3", endpoint_url=server.endpoint_url).create_bucket(Bucket="online-ng-models")
    path = write_variant(tmp_path, {"job": {"model": "s3://online-ng-models/qwen", "dataset": "s3://online-ng-models/d"},
                                    "cluster": {"name": NG_CLUSTER}, "region": NG_REGION,
                                    "gpu_availability_zone": "us-east-1a"}, group={"deployed": False})
    env = {**server.env(str(tmp_path)), "HF_HOME": str(tmp_path / "hf")}
    result = _run(["config", "check", str(path), "--online"], env)
    assert result.returncode == 2, result.stderr
    assert (f"{path}: cluster.worker_groups.0.deployed: false, but cluster {NG_CLUSTER} already has node group "
            "Nodegroupgpu-1A2B3C4D5E6F" in result.stderr)
    assert "Traceback" not in result.stderr
