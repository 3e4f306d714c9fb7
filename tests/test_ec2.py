"""The EC2 target (issue 22): the variable file's `target: ec2`, its stack, and the Ray cluster-launcher YAML.

Checked with upstream code: Ray's own `prepare_config` / `validate_config` (ray 2.58.0) on the YAML,
botocore's ParamValidator with the EC2 service model on each node type's RunInstances input, Ray's
launcher bootstrap and AWS node provider against moto's server on 127.0.0.1, and cdk-nag on the stack.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import yaml

from config import ConfigError, load_config
from config.ec2 import DLAMI_SSM_PARAMETER, RAY_CLUSTER_TAG, STACK_OUTPUTS
from config.efa import efa_interface_layout
from config.errors import run_cli
from config.target import with_target
from ops.launcher import (
    AUTH_TOKEN_DIR,
    AUTH_TOKEN_FILE,
    HEAD_TYPE,
    LauncherError,
    launcher_config,
    main,
    node_config_problems,
    outputs_from_json,
)
from tests.helpers import EXAMPLES, REPO, cdk_app, load_variant, write_variant

FIXTURE = REPO / "config" / "examples" / "ec2" / "outputs.json"


def fixture_outputs() -> dict[str, str]:
    return outputs_from_json(json.loads(FIXTURE.read_text()), source=str(FIXTURE))


def ec2_variant(tmp_path: Path, overrides: dict | None = None, **kwargs):
    return load_variant(tmp_path, {"target": "ec2", **(overrides or {})}, **kwargs)


def rendered(config, outputs=None) -> dict:
    return launcher_config(config, outputs or fixture_outputs(), app_dir=Path("/tmp/app"))


def run_instances_input(node_config: dict) -> dict:
    """What Ray's AWS node provider sends to RunInstances for `node_config` (node_provider.py _create_node,
    ray 2.58.0): SubnetIds resolved to one SubnetId, or dropped with SecurityGroupIds for NetworkInterfaces."""
    conf = copy.deepcopy(node_config)
    subnets = conf.pop("SubnetIds", [])
    if "NetworkInterfaces" in conf:
        conf.pop("SecurityGroupIds", None)
    else:
        conf["SubnetId"] = subnets[0]
    conf.update(MinCount=1, MaxCount=1, TagSpecifications=[
        {"ResourceType": "instance", "Tags": [{"Key": RAY_CLUSTER_TAG, "Value": "ray-efa"}]}])
    return conf


# ---- 1. the variable file ----------------------------------------------------------------------------

def test_default_file_targets_eks():
    assert load_config().target == "eks"


def test_target_ec2_loads(tmp_path):
    assert ec2_variant(tmp_path).target == "ec2"


def test_unknown_target_is_refused_with_the_field_named(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_variant(tmp_path, {"target": "ecs"})
    assert "target: Input should be 'eks' or 'ec2'" in str(err.value)


def test_gpu_head_is_refused_with_the_field_named(tmp_path):
    with pytest.raises(ConfigError) as err:
        ec2_variant(tmp_path, {"ec2": {"head_instance_type": "g6.12xlarge"}})
    assert "ec2.head_instance_type: g6.12xlarge has 4 GPU(s), but the head trains nothing" in str(err.value)


def test_unknown_head_type_is_refused(tmp_path):
    with pytest.raises(ConfigError) as err:
        ec2_variant(tmp_path, {"ec2": {"head_instance_type": "m9z.large"}})
    assert "ec2.head_instance_type: unknown instance type 'm9z.large'" in str(err.value)


def test_efa_transport_on_a_type_without_efa_is_refused_for_ec2_too(tmp_path):
    with pytest.raises(ConfigError) as err:
        ec2_variant(tmp_path, group={"instance_type": "g6.4xlarge", "gpus_per_pod": 1})
    assert "nccl.transport: efa, but cluster.worker_groups.0.instance_type g6.4xlarge has no EFA" in str(err.value)


def test_capacity_block_is_refused_for_ec2_only(tmp_path):
    block = {"capacity": "capacity_block", "capacity_reservation_id": "cr-0123456789abcdef0"}
    assert load_variant(tmp_path, group=block).target == "eks"
    with pytest.raises(ConfigError) as err:
        ec2_variant(tmp_path, group=block)
    assert "cluster.worker_groups.0.capacity: capacity_block is not supported by target: ec2" in str(err.value)


def test_a_gpu_share_per_container_is_refused_for_ec2(tmp_path):
    socket = {"nccl": {"transport": "socket"}}  # on EFA the EKS rules already want one pod per g6.12xlarge
    assert load_variant(tmp_path, socket, group={"gpus_per_pod": 2}).target == "eks"
    with pytest.raises(ConfigError) as err:
        ec2_variant(tmp_path, socket, group={"gpus_per_pod": 2})
    assert ("cluster.worker_groups.0.gpus_per_pod: 2, but target: ec2 runs one Ray container per node holding all "
            "g6.12xlarge's 4 GPUs; set gpus_per_pod: 4") in str(err.value)


def test_idle_timeout_bounds(tmp_path):
    with pytest.raises(ConfigError) as err:
        ec2_variant(tmp_path, {"ec2": {"idle_timeout_minutes": 0}})
    assert "ec2.idle_timeout_minutes" in str(err.value)


def test_with_target_revalidates_for_the_other_target(tmp_path):
    config = load_variant(tmp_path, group={"capacity": "capacity_block",
                                           "capacity_reservation_id": "cr-0123456789abcdef0"})
    with pytest.raises(ValueError, match="capacity_block is not supported by target: ec2"):
        with_target(config, "ec2")
    assert with_target(load_config(), "ec2").target == "ec2"
    with pytest.raises(ValueError, match="target: 'k8s' is not one of eks, ec2"):
        with_target(load_config(), "k8s")


# ---- 2. the launcher YAML ---------------------------------------------------------------------------

def test_yaml_passes_rays_prepare_and_validate_config():
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(rendered(load_config()))
    validate_config(prepared)
    # prepare_config merges aws/defaults.yaml under the file: nothing of the defaults' commands may survive.
    assert prepared["head_setup_commands"] == [
        "python -c 'import boto3' 2>/dev/null || pip install --no-cache-dir boto3==1.44.5"]
    assert prepared["setup_commands"] == []
    assert sorted(prepared["available_node_types"]) == ["gpu", HEAD_TYPE]


def test_network_interfaces_pass_rays_aws_interface_rules():
    from ray.autoscaler._private.aws.config import _configure_from_network_interfaces

    out = _configure_from_network_interfaces(rendered(load_config()))
    worker = out["available_node_types"]["gpu"]["node_config"]
    assert worker["SubnetIds"] == ["subnet-0123456789abcdef0"]
    assert worker["SecurityGroupIds"] == ["sg-0123456789abcdef0"]


@pytest.mark.parametrize("example", ["cluster", "p5", "socket", "spot"])
def test_each_node_config_passes_botocores_run_instances_validation(tmp_path, example):
    from botocore.session import get_session
    from botocore.validate import ParamValidator

    base = REPO / "config" / "cluster.yaml" if example == "cluster" else EXAMPLES / f"{example}.yaml"
    overrides = {"target": "ec2"}
    group = {"capacity": "on_demand", "capacity_reservation_id": None} if example == "p5" else None
    config = load_config(write_variant(tmp_path, overrides, base=base, group=group))
    shape = get_session().get_service_model("ec2").operation_model("RunInstances").input_shape
    for name, node_type in rendered(config)["available_node_types"].items():
        report = ParamValidator().validate(run_instances_input(node_type["node_config"]), shape)
        assert not report.has_errors(), f"{example}/{name}: {report.generate_report()}"


def test_botocore_does_not_check_interface_type_so_the_project_does():
    from botocore.session import get_session
    from botocore.validate import ParamValidator

    config = load_config()
    launcher = rendered(config)
    launcher["available_node_types"]["gpu"]["node_config"]["NetworkInterfaces"][0]["InterfaceType"] = "efaa"
    shape = get_session().get_service_model("ec2").operation_model("RunInstances").input_shape
    node = launcher["available_node_types"]["gpu"]["node_config"]
    assert not ParamValidator().validate(run_instances_input(node), shape).has_errors()
    assert node_config_problems(launcher, config, fixture_outputs()) == [
        "gpu: InterfaceType 'efaa' is not one of ['efa', 'efa-only', 'interface']"]


def test_docker_image_is_ray_image_and_efa_run_options(tmp_path):
    config = load_config()
    launcher = rendered(config)
    assert launcher["docker"]["image"] == config.ray.image
    assert "--ulimit memlock=-1" in launcher["docker"]["run_options"]
    worker = launcher["available_node_types"]["gpu"]["docker"]["worker_run_options"]
    assert worker.count("--device=/dev/infiniband/uverbs0") == 1
    assert "--cap-add IPC_LOCK" in worker
    # The group's EKS pod sizes (so the preflight expects the same on both targets).
    res = config.pod_resources["gpu"]
    assert f"--shm-size={res.shm_gib}g" in worker
    assert f"--env RAY_EFA_OBJECT_STORE_BYTES={res.object_store_bytes}" in worker
    init = launcher["available_node_types"]["gpu"]["initialization_commands"]
    assert f"sudo sysctl -w vm.nr_hugepages={config.nvidia_nodes_hugepages(config.cluster.worker_groups[0])}" in init


def test_p5_gets_32_interfaces_laid_out_as_the_launch_template_and_32_devices(tmp_path):
    config = load_config(write_variant(tmp_path, {"target": "ec2"}, base=EXAMPLES / "p5.yaml",
                                       group={"capacity": "on_demand", "capacity_reservation_id": None}))
    group = config.cluster.worker_groups[0]
    node_type = rendered(config)["available_node_types"][group.name]
    interfaces = node_type["node_config"]["NetworkInterfaces"]
    assert [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in interfaces] == [
        (i.card, i.device, i.kind) for i in efa_interface_layout(32)]
    assert interfaces[:2] == [
        {"DeviceIndex": 0, "NetworkCardIndex": 0, "InterfaceType": "interface", "SubnetId": "subnet-0123456789abcdef0",
         "Groups": ["sg-0123456789abcdef0"], "DeleteOnTermination": True},
        {"DeviceIndex": 1, "NetworkCardIndex": 0, "InterfaceType": "efa-only", "SubnetId": "subnet-0123456789abcdef0",
         "Groups": ["sg-0123456789abcdef0"], "DeleteOnTermination": True}]
    devices = [o for o in node_type["docker"]["worker_run_options"] if o.startswith("--device=")]
    assert devices == [f"--device=/dev/infiniband/uverbs{n}" for n in range(32)]


def test_socket_transport_has_no_efa_interfaces_devices_or_huge_pages(tmp_path):
    config = load_config(write_variant(tmp_path, {"target": "ec2"}, base=EXAMPLES / "socket.yaml"))
    node_type = next(v for k, v in rendered(config)["available_node_types"].items() if k != HEAD_TYPE)
    assert "NetworkInterfaces" not in node_type["node_config"]
    assert node_type["node_config"]["SubnetIds"] == ["subnet-0123456789abcdef0"]
    assert not [o for o in node_type["docker"]["worker_run_options"] if o.startswith("--device")]
    assert not [c for c in node_type["initialization_commands"] if "nr_hugepages" in c]


def test_worker_placement_names_the_stacks_group_and_az():
    node = rendered(load_config())["available_node_types"]["gpu"]["node_config"]
    assert node["Placement"] == {"GroupName": "ray-efa-ec2-PlacementGroup-1A2B3C4D5E6F",
                                 "AvailabilityZone": "us-east-2b"}
    assert node["ImageId"] == "ami-0123456789abcdef0"


def test_head_keeps_training_off_and_min_max_workers_come_from_the_file(tmp_path):
    config = ec2_variant(tmp_path, {"autoscaling": {"enabled": False}}, group={"nodes": 2, "max_nodes": 3})
    launcher = rendered(config)
    assert launcher["available_node_types"][HEAD_TYPE]["resources"] == {"CPU": 0, "GPU": 0}
    gpu = launcher["available_node_types"]["gpu"]
    assert (gpu["min_workers"], gpu["max_workers"], launcher["max_workers"]) == (2, 3, 3)
    assert gpu["resources"] == {"CPU": 48, "GPU": 4}


def test_setup_commands_install_extra_pip_packages_only(tmp_path):
    config = ec2_variant(tmp_path, {"ray": {"extra_pip_packages": ["peft==0.18.0"]}})
    assert rendered(config)["setup_commands"] == ["pip install --no-cache-dir peft==0.18.0"]
    assert rendered(load_config())["setup_commands"] == []


def test_idle_timeout_internal_ips_and_terminated_not_stopped(tmp_path):
    launcher = rendered(ec2_variant(tmp_path, {"ec2": {"idle_timeout_minutes": 25}}))
    assert launcher["idle_timeout_minutes"] == 25
    assert launcher["provider"]["use_internal_ips"] is True
    assert launcher["provider"]["cache_stopped_nodes"] is False


def test_containers_stop_within_a_second_since_their_shell_ignores_sigterm():
    from ops.launcher import STOP_TIMEOUT_S

    # Every container (the head's and each worker's) takes the global run_options; below Docker's default 10 s.
    assert 0 < STOP_TIMEOUT_S < 10
    assert f"--stop-timeout={STOP_TIMEOUT_S}" in rendered(load_config())["docker"]["run_options"]


def test_token_auth_reaches_every_container_from_the_stacks_secret():
    launcher = rendered(load_config())
    options = launcher["docker"]["run_options"]
    # Only the token file's path reaches the container's environment (docker inspect); the file is mounted read-only.
    assert {"--env RAY_AUTH_MODE=token", f"--env RAY_AUTH_TOKEN_PATH={AUTH_TOKEN_FILE}",
            f"-v {AUTH_TOKEN_FILE}:{AUTH_TOKEN_FILE}:ro"} <= set(options)
    assert not [o for o in options if "env-file" in o or "RAY_AUTH_TOKEN=" in o]
    fetch = [c for c in launcher["initialization_commands"] if "secretsmanager get-secret-value" in c]
    assert len(fetch) == 1 and fixture_outputs()["AuthTokenSecretArn"] in fetch[0]
    assert "umask 077" in fetch[0] and "sudo sh -c" in fetch[0]
    # A node type's initialization_commands replace the global ones: the worker's list repeats the fetch.
    assert fetch[0] in launcher["available_node_types"]["gpu"]["initialization_commands"]


def test_auth_disabled_has_no_token_plumbing(tmp_path):
    launcher = rendered(ec2_variant(tmp_path, {"ray": {"auth": "disabled"}}))
    assert not [o for o in launcher["docker"]["run_options"] if "env-file" in o or "RAY_AUTH" in o]
    assert not [c for c in launcher["initialization_commands"] if "secretsmanager" in c]


def test_ssm_access_tunnels_ssh_and_ssh_access_does_not(tmp_path):
    assert "AWS-StartSSHSession" in rendered(load_config())["auth"]["ssh_proxy_command"]
    assert "ssh_proxy_command" not in rendered(ec2_variant(tmp_path, {"ec2": {"access": "ssh"}}))["auth"]


def test_project_checks_catch_what_the_emulator_accepts():
    config = load_config()
    outputs = fixture_outputs()
    launcher = rendered(config)
    worker = launcher["available_node_types"]["gpu"]["node_config"]
    worker["Placement"]["GroupName"] = "no-such-group"
    worker["InstanceType"] = "g6.13xlarge"
    assert node_config_problems(launcher, config, outputs) == [
        "gpu: InstanceType g6.13xlarge is not in config/instances.yaml"]
    worker["InstanceType"] = "g6.12xlarge"
    assert node_config_problems(launcher, config, outputs) == [
        "gpu: Placement.GroupName 'no-such-group' is not the stack's placement group "
        "'ray-efa-ec2-PlacementGroup-1A2B3C4D5E6F'"]


def test_file_mounts_put_the_bundle_where_the_pods_mount_it():
    from charts import bundle
    from ops.launcher import MOUNT_PATH

    assert MOUNT_PATH == bundle.MOUNT_PATH


def test_render_command_writes_the_yaml_and_the_app_bundle(tmp_path):
    out = tmp_path / "ec2"
    assert main(["render", "--outputs", str(FIXTURE), "--out-dir", str(out)]) == 0
    launcher = yaml.safe_load((out / "cluster.yaml").read_text())
    # Synced to each host by file_mounts, at /app through a run option (kept by the autoscaler's recovery).
    assert launcher["file_mounts"] == {"/opt/ray-efa-app": str((out / "app").resolve())}
    assert "-v /tmp/ray_tmp_mount/ray-efa//opt/ray-efa-app:/app:ro" in launcher["docker"]["run_options"]
    assert (out / "app" / "submit.sh").is_file() and (out / "app" / "config" / "cluster.yaml").is_file()
    assert (out / "app" / "workloads" / "fsdp_finetune" / "__main__.py").is_file()


def test_render_names_the_missing_output(tmp_path, capsys):
    data = json.loads(FIXTURE.read_text())
    data["Stacks"][1]["Outputs"] = [o for o in data["Stacks"][1]["Outputs"] if o["OutputKey"] != "ImageId"]
    partial = tmp_path / "outputs.json"
    partial.write_text(json.dumps(data))
    with pytest.raises(SystemExit) as exited:
        run_cli(main, ["render", "--outputs", str(partial), "--out-dir", str(tmp_path / "out")])
    assert exited.value.code == 2
    assert f"{partial}: missing output(s) ImageId" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_outputs_read_from_cdk_outputs_file_format():
    stacks = json.loads(FIXTURE.read_text())["Stacks"]
    per_stack = {s["StackName"]: {o["OutputKey"]: o["OutputValue"] for o in s["Outputs"]} for s in stacks}
    assert outputs_from_json(per_stack, source="x") == fixture_outputs()
    assert fixture_outputs()["SubnetId"] == "subnet-0123456789abcdef0"
    del per_stack["ray-efa-network"]
    with pytest.raises(LauncherError, match="x: missing output[(]s[)] GpuSubnetId"):
        outputs_from_json(per_stack, source="x")


# ---- 3. Ray's launcher bootstrap and node provider against moto on 127.0.0.1 -------------------------

@pytest.mark.slow
@pytest.mark.timeout(180)
def test_rays_bootstrap_and_create_node_run_against_moto(tmp_path, monkeypatch):
    import boto3
    from ray.autoscaler._private.aws import utils as aws_utils
    from ray.autoscaler._private.aws.node_provider import AWSNodeProvider
    from ray.autoscaler._private.commands import _bootstrap_config
    from ray.autoscaler.tags import TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE

    from harness.loopback import moto_ec2_server

    with moto_ec2_server() as moto:
        for key, value in moto.env(str(tmp_path)).items():
            monkeypatch.setenv(key, value)
        aws_utils.resource_cache.cache_clear()
        aws_utils.client_cache.cache_clear()
        config = load_config()
        region = config.region
        ec2 = boto3.client("ec2", region_name=region)
        iam = boto3.client("iam", region_name=region)
        vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24",
                                   AvailabilityZone=config.gpu_availability_zone)["Subnet"]["SubnetId"]
        group = ec2.create_security_group(GroupName="nodes", Description="nodes", VpcId=vpc)["GroupId"]
        # moto 5.2.5 has no CreatePlacementGroup (and launches into any group name): the name stays a name.
        image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        profiles = {}
        for role in ("head", "worker"):
            iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [
                {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}))
            profiles[role] = iam.create_instance_profile(InstanceProfileName=role)["InstanceProfile"]["Arn"]
            iam.add_role_to_instance_profile(InstanceProfileName=role, RoleName=role)
        outputs = {**fixture_outputs(), "SubnetId": subnet, "SecurityGroupId": group, "ImageId": image,
                   "PlacementGroupName": "ray-efa-pg", "HeadInstanceProfileArn": profiles["head"],
                   "WorkerInstanceProfileArn": profiles["worker"]}

        bootstrapped = _bootstrap_config(launcher_config(config, outputs, app_dir=tmp_path / "app"),
                                         no_config_cache=True)

        # Key pair: created in the emulator, private key written under (the moved) ~/.ssh.
        key_name = f"ray-autoscaler_{region}"
        assert ec2.describe_key_pairs(KeyNames=[key_name])["KeyPairs"]
        assert bootstrapped["auth"]["ssh_private_key"] == os.path.join(str(tmp_path), ".ssh", f"{key_name}.pem")
        # Subnet lookup: the stack's subnet, in the GPU AZ, kept for both node types.
        types = bootstrapped["available_node_types"]
        assert types[HEAD_TYPE]["node_config"]["SubnetIds"] == [subnet]
        assert types["gpu"]["node_config"]["SubnetIds"] == [subnet]
        # IAM: the head's profile from the stack is used as is (no ray-autoscaler-v1 role created).
        assert types[HEAD_TYPE]["node_config"]["IamInstanceProfile"] == {"Arn": profiles["head"]}
        assert sorted(r["RoleName"] for r in iam.list_roles()["Roles"]) == ["head", "worker"]
        # Resources: Ray's autodetection read the emulator's instance types (it adds the worker's memory and
        # accelerator type), then the file's own CPU and GPU counts win.
        assert types["gpu"]["resources"]["GPU"] == 4 and types["gpu"]["resources"]["memory"] > 0
        assert types[HEAD_TYPE]["resources"] == {"CPU": 0, "GPU": 0}

        provider = AWSNodeProvider(bootstrapped["provider"], bootstrapped["cluster_name"])
        provider.create_node(types["gpu"]["node_config"], {TAG_RAY_NODE_KIND: "worker",
                                                          TAG_RAY_USER_NODE_TYPE: "gpu"}, 1)
        instance = ec2.describe_instances()["Reservations"][0]["Instances"][0]
        tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
        assert tags[RAY_CLUSTER_TAG] == config.cluster.name and tags[TAG_RAY_USER_NODE_TYPE] == "gpu"
        assert instance["InstanceType"] == "g6.12xlarge"
        assert instance["Placement"]["AvailabilityZone"] == config.gpu_availability_zone
        assert instance["IamInstanceProfile"]["Arn"] == profiles["worker"]
        assert instance["KeyName"] == key_name
        # The interface the YAML laid out, in the stack's subnet and group (moto reports every interface as
        # InterfaceType "interface", whatever was asked: another thing only the project's check sees).
        assert [(i["SubnetId"], [g["GroupId"] for g in i["Groups"]]) for i in instance["NetworkInterfaces"]] == [
            (subnet, [group])]
        aws_utils.resource_cache.cache_clear()
        aws_utils.client_cache.cache_clear()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_emulator_accepts_what_ec2_would_refuse(tmp_path, monkeypatch):
    """moto launches into a placement group that does not exist, with a bogus InterfaceType, and an
    instance type EC2 does not have: only the project's checks (node_config_problems) stand between
    these and a failed `ray up`, so they are tested above and this records the emulator's limit."""
    import boto3

    from harness.loopback import moto_ec2_server

    with moto_ec2_server() as moto:
        for key, value in moto.env(str(tmp_path)).items():
            monkeypatch.setenv(key, value)
        ec2 = boto3.client("ec2", region_name="us-east-2")
        vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24", AvailabilityZone="us-east-2b")["Subnet"]
        image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        launched = ec2.run_instances(
            ImageId=image, MinCount=1, MaxCount=1, InstanceType="g6.12xlarge",
            Placement={"GroupName": "no-such-group", "AvailabilityZone": "us-east-2b"},
            NetworkInterfaces=[{"DeviceIndex": 0, "SubnetId": subnet["SubnetId"], "InterfaceType": "efaa"}])
        assert launched["Instances"][0]["State"]["Name"] in ("pending", "running")
        odd = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="g6.13xlarge",
                                SubnetId=subnet["SubnetId"])
        assert odd["Instances"][0]["InstanceType"] == "g6.13xlarge"


# ---- the stack (synthesized once, cdk-nag on) ---------------------------------------------------------

@pytest.fixture(scope="module")
def ec2_synth(tmp_path_factory):

    from stacks import build

    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")
    out = tmp_path_factory.mktemp("ec2-synth")
    config = with_target(load_config(), "ec2")
    app = cdk_app(outdir=str(out))
    stacks = build(app, config, nag=True)
    app.synth()
    templates = {name: json.loads((out / f"ray-efa-{name}.template.json").read_text())
                 for name in ("network", "storage", "ec2")}
    report = json.loads((out / "validation-report.json").read_text())
    return stacks, templates, report, out


def _resources(template: dict, kind: str) -> dict:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == kind}


def _head_statements(templates) -> dict[str, dict]:
    ec2 = templates["ec2"]
    head_role = next(k for k in _resources(ec2, "AWS::IAM::Role") if k.startswith("HeadRole"))
    policy = next(v for v in _resources(ec2, "AWS::IAM::Policy").values()
                  if v["Properties"]["Roles"] == [{"Ref": head_role}])
    return {s.get("Sid"): s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s.get("Sid")}


@pytest.mark.slow
def test_ec2_target_deploys_without_the_eks_cluster(ec2_synth):
    stacks, templates = ec2_synth[:2]
    assert stacks.cluster is None and stacks.ec2 is not None
    for template in templates.values():
        # CDK's own: the bucket auto-delete, and the VPC default security group's emptying (a cdk.json flag).
        assert not [r for r in template["Resources"].values() if r["Type"].startswith(("AWS::EKS::", "Custom::"))
                    and r["Type"] not in ("Custom::S3AutoDeleteObjects", "Custom::VpcRestrictDefaultSG")]
    assert not _resources(templates["storage"], "AWS::IAM::Role")
    assert "RayPodRoleArn" not in templates["storage"]["Outputs"]


def test_cdk_nag_is_clean_on_the_ec2_target(ec2_synth):
    report = ec2_synth[2]
    for plugin in report["pluginReports"]:
        assert plugin["conclusion"] == "success", plugin["violations"]


@pytest.mark.slow
def test_cfn_lint_is_clean_on_the_ec2_target(ec2_synth):
    from cfnlint.api import ManualArgs, lint_file

    findings = []
    for name in ("network", "storage", "ec2"):
        path = ec2_synth[3] / f"ray-efa-{name}.template.json"
        findings += [(path.name, m.rule.id, m.message)
                     for m in lint_file(path, config=ManualArgs(regions=["us-east-2"]))]
    # W3010: the AZs come from the variable file by design (as in test_stacks_compliance). W3005: a redundant
    # DependsOn CDK's own provider of the VPC default-security-group restriction (a cdk.json flag) writes.
    assert [f for f in findings if f[1] != "W3010" and not f[1].startswith("I")
            and not (f[1] == "W3005" and "CustomVpcRestrictDefaultSG" in f[2])] == []


def test_stack_has_a_cluster_placement_group_and_a_self_referencing_security_group(ec2_synth):
    from aws_cdk.assertions import Match, Template

    templates = ec2_synth[1]
    template = Template.from_json(templates["ec2"])
    template.has_resource_properties("AWS::EC2::PlacementGroup", {"Strategy": "cluster"})
    group = next(iter(_resources(templates["ec2"], "AWS::EC2::SecurityGroup")))
    self_ref = {"Fn::GetAtt": [group, "GroupId"]}
    template.has_resource_properties("AWS::EC2::SecurityGroupIngress", {
        "IpProtocol": "-1", "SourceSecurityGroupId": self_ref, "GroupId": self_ref})
    template.has_resource_properties("AWS::EC2::SecurityGroupEgress", {
        "IpProtocol": "-1", "DestinationSecurityGroupId": self_ref, "GroupId": self_ref})
    # Nothing open to the internet: no ingress rule with a CIDR (ssm access is the default).
    ingress = json.dumps(templates["ec2"]["Resources"][group]["Properties"].get("SecurityGroupIngress", []))
    assert "0.0.0.0/0" not in ingress
    template.has_resource_properties("AWS::EC2::SecurityGroup", {"SecurityGroupEgress": Match.array_with([
        Match.object_like({"CidrIp": "0.0.0.0/0", "FromPort": 443, "ToPort": 443, "IpProtocol": "tcp"})])})


def test_image_comes_from_the_dlami_ssm_parameter_and_is_an_output(ec2_synth):
    templates = ec2_synth[1]
    template = templates["ec2"]
    parameter = next(k for k, v in template["Parameters"].items() if v.get("Default") == DLAMI_SSM_PARAMETER)
    assert template["Parameters"][parameter]["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"
    assert template["Outputs"]["ImageId"]["Value"] == {"Ref": parameter}
    assert sorted(template["Outputs"]) == sorted(STACK_OUTPUTS)
    assert "GpuSubnetId" in templates["network"]["Outputs"]


def test_head_launches_only_instances_tagged_with_this_cluster(ec2_synth):
    statements = _head_statements(ec2_synth[1])
    launch = statements["LaunchTaggedInstances"]
    assert launch["Action"] == "ec2:RunInstances"
    assert launch["Condition"] == {"StringEquals": {f"aws:RequestTag/{RAY_CLUSTER_TAG}": "ray-efa"}}
    assert json.dumps(launch["Resource"]).endswith(':instance/*"]]}')
    # The other RunInstances statement never names instances, so it cannot launch one untagged.
    assert ":instance/" not in json.dumps(statements["LaunchWith"]["Resource"])


def test_head_tags_and_terminates_only_its_clusters_instances(ec2_synth):
    statements = _head_statements(ec2_synth[1])
    owned = {"StringEquals": {f"ec2:ResourceTag/{RAY_CLUSTER_TAG}": "ray-efa"}}
    assert statements["EndOwnInstances"]["Condition"] == owned
    assert set(statements["EndOwnInstances"]["Action"]) == {"ec2:TerminateInstances", "ec2:StopInstances",
                                                            "ec2:StartInstances"}
    retag = statements["RetagOwnInstances"]["Condition"]
    assert retag["StringEquals"] == owned["StringEquals"]
    assert retag["ForAllValues:StringNotEquals"] == {"aws:TagKeys": [RAY_CLUSTER_TAG]}
    assert statements["TagOnLaunch"]["Condition"]["StringEquals"]["ec2:CreateAction"] == "RunInstances"
    # No other statement grants any of these actions.
    actions = {"ec2:TerminateInstances", "ec2:StopInstances", "ec2:CreateTags", "ec2:RunInstances"}
    for sid, statement in statements.items():
        granted = set([statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"])
        if granted & actions:
            assert sid in {"LaunchTaggedInstances", "LaunchWith", "TagOnLaunch", "RetagOwnInstances",
                           "EndOwnInstances"}


def test_head_passes_only_the_worker_role(ec2_synth):
    templates = ec2_synth[1]
    worker_role = next(k for k in _resources(templates["ec2"], "AWS::IAM::Role") if k.startswith("WorkerRole"))
    passing = [s for s in _head_statements(templates).values() if "iam:PassRole" in json.dumps(s["Action"])]
    assert passing == [{"Sid": "PassWorkerRoleOnly", "Action": "iam:PassRole", "Effect": "Allow",
                        "Resource": {"Fn::GetAtt": [worker_role, "Arn"]},
                        "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}}]


def test_workers_reach_the_bucket_prefix_and_nothing_of_ec2(ec2_synth):
    templates = ec2_synth[1]
    ec2 = templates["ec2"]
    worker_role = next(k for k in _resources(ec2, "AWS::IAM::Role") if k.startswith("WorkerRole"))
    policy = next(v for v in _resources(ec2, "AWS::IAM::Policy").values()
                  if v["Properties"]["Roles"] == [{"Ref": worker_role}])
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    assert "ec2:" not in json.dumps(statements) and "iam:" not in json.dumps(statements)
    objects = next(s for s in statements if s.get("Sid") == "ObjectsUnderPrefix")
    assert json.dumps(objects["Resource"]).endswith('/ray-finetune/*"]]}')


def test_ec2_cost_idle_and_running_for_the_default_file():
    from config.target import ec2_cost_per_hour

    config = load_config()
    # Idle: one m7i.2xlarge head and the NAT gateway; running: plus 2 x g6.12xlarge (catalog prices).
    assert ec2_cost_per_hour(config) == pytest.approx((0.4032 + 0.045, 0.4032 + 0.045 + 2 * 4.6016))
    assert ec2_cost_per_hour(config)[0] < config.idle_cost_per_hour


@pytest.mark.parametrize("example", ["cluster", "socket", "single-node"])
def test_docs_cost_table_matches_the_model(example):
    from config.target import ec2_cost_per_hour

    path = REPO / "config" / "cluster.yaml" if example == "cluster" else EXAMPLES / f"{example}.yaml"
    config = load_config(path)
    row = next(line for line in (REPO / "docs" / "ec2.md").read_text().splitlines()
               if line.startswith(f"| `{path.relative_to(REPO)}`"))
    figures = [float(cell) for cell in row.strip("|").split("|")[1:]]
    expected = [config.idle_cost_per_hour, config.cost_per_hour, *ec2_cost_per_hour(with_target(config, "ec2"))]
    assert figures == [round(v, 2) for v in expected]


def test_the_token_secrets_checkov_finding_is_acknowledged_with_its_reason(ec2_synth):
    (secret,) = _resources(ec2_synth[1]["ec2"], "AWS::SecretsManager::Secret").values()
    skips = {s["id"]: s["comment"] for s in secret["Metadata"]["checkov"]["skip"]}
    assert list(skips) == ["CKV_AWS_149"] and "AWS-managed key" in skips["CKV_AWS_149"]


# ---- issue 34: what the real `ray up` run showed, and what reading it did --------------------------------

def _run_proxy_command(shell: str, tmp_path: Path) -> list[list[str]]:
    """The rendered ProxyCommand as ssh runs it (`$SHELL -c`, %h and %p substituted), with `aws` on PATH a
    recorder of its arguments: what each `aws` invocation received, one list per call."""
    import shutil
    import subprocess

    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed (apt-get install {shell})")
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    calls = tmp_path / f"calls-{shell}.jsonl"
    recorder = bindir / "aws"
    recorder.write_text(f"#!{os.sys.executable}\nimport json, sys\n"
                        f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\nprint('i-0abc')\n")
    recorder.chmod(0o755)
    command = rendered(load_config())["auth"]["ssh_proxy_command"].replace("%h", "10.0.0.5").replace("%p", "22")
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run([shell, "-c", command], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in calls.read_text().splitlines()]


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_ssm_proxy_command_runs_under_bash_and_zsh_and_takes_running_instances_only(shell, tmp_path):
    describe, start = _run_proxy_command(shell, tmp_path)
    assert describe[:2] == ["ec2", "describe-instances"]
    assert "Reservations[0].Instances[0].InstanceId" in describe  # one argument, unglobbed
    assert "Name=instance-state-name,Values=running" in describe
    assert "Name=private-ip-address,Values=10.0.0.5" in describe
    assert f"Name=tag:{RAY_CLUSTER_TAG},Values=ray-efa" in describe
    assert start[:2] == ["ssm", "start-session"] and start[start.index("--target") + 1] == "i-0abc"
    assert "portNumber=22" in start


def test_gpu_containers_get_gpus_all_and_ray_guesses_nothing(tmp_path):
    launcher = rendered(load_config())
    assert launcher["docker"]["disable_automatic_runtime_detection"] is True
    assert "--gpus all" in launcher["available_node_types"]["gpu"]["docker"]["worker_run_options"]
    assert "--gpus all" not in json.dumps(launcher["docker"])


def test_every_container_gets_the_hosts_rsync_and_ssh(tmp_path):
    from ops.launcher import host_tools_command

    launcher = rendered(load_config())
    for name, node_type in launcher["available_node_types"].items():
        commands = node_type.get("initialization_commands", launcher["initialization_commands"])
        assert host_tools_command() in commands, name
    mounts = [o for o in launcher["docker"]["run_options"] if o.startswith("-v ")]
    assert {m.split(":")[1] for m in mounts} >= {"/usr/local/bin/rsync", "/usr/local/bin/ssh"}


def test_host_tools_command_bundles_binaries_that_run_through_their_own_loader(tmp_path):
    """The bundle the command makes runs with nothing from the system's library path (as in a container of
    another distribution): the loader and every library come from the bundle."""
    import subprocess

    from ops.launcher import HOST_TOOLS_DIR, host_tools_command

    target = tmp_path / "tools"
    command = host_tools_command().replace(HOST_TOOLS_DIR, str(target))
    subprocess.run(["bash", "-c", command], check=True, timeout=60)
    loader, lib = target / "lib" / "ld.so", target / "lib"
    for tool, flag, expect in (("rsync", "--version", "rsync"), ("ssh", "-V", "OpenSSH")):
        out = subprocess.run([str(loader), "--library-path", str(lib), str(target / f"{tool}.bin"), flag],
                             capture_output=True, text=True, env={}, timeout=30)
        assert expect in out.stdout + out.stderr, (tool, out.stderr)
    # Idempotent: a second run keeps the bundle a running container has bind-mounted.
    inode = (target / "rsync").stat().st_ino
    subprocess.run(["bash", "-c", command], check=True, timeout=60)
    assert (target / "rsync").stat().st_ino == inode


def test_an_unreadable_token_secret_stops_the_node_setup_with_the_secret_named(tmp_path):
    import subprocess

    launcher = rendered(load_config())
    command = next(c for c in launcher["initialization_commands"] if "secretsmanager" in c)
    token_dir = tmp_path / "ray-auth"
    env_file = token_dir / "token"
    command = command.replace(AUTH_TOKEN_DIR, str(token_dir))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    # The SSH user writes the root-only file through sudo (the DLAMI's ec2-user has it without a password).
    (bindir / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
    (bindir / "sudo").chmod(0o755)
    for name, body in (("fails", "echo 'AccessDeniedException' >&2; exit 254"), ("empty", "echo")):
        (bindir / "aws").write_text(f"#!/bin/sh\n{body}\n")
        (bindir / "aws").chmod(0o755)
        # Ray runs every command as `(command)` in a login bash (command_runner.py SSHCommandRunner.run).
        proc = subprocess.run(["bash", "-c", f"({command})"], env={"PATH": f"{bindir}:/usr/bin:/bin"},
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode != 0, name
        assert "cannot read the Ray auth token" in proc.stderr and fixture_outputs()["AuthTokenSecretArn"] in \
            proc.stderr, name
        assert not env_file.exists(), name
    (bindir / "aws").write_text("#!/bin/sh\necho s3cret\n")
    proc = subprocess.run(["bash", "-c", f"({command})"], env={"PATH": f"{bindir}:/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert env_file.read_text() == "s3cret\n"
    assert env_file.stat().st_mode & 0o777 == 0o600 and token_dir.stat().st_mode & 0o777 == 0o700
    assert "s3cret" not in command  # the token reaches the file through a pipe, never a command line


def test_the_cpu_head_boots_plain_al2023_and_the_workers_the_gpu_dlami():
    launcher = rendered(load_config())
    assert launcher["available_node_types"][HEAD_TYPE]["node_config"]["ImageId"] == fixture_outputs()["HeadImageId"]
    assert launcher["available_node_types"]["gpu"]["node_config"]["ImageId"] == fixture_outputs()["ImageId"]


@pytest.mark.slow
def test_head_image_comes_from_the_al2023_ssm_parameter(ec2_synth):
    from config.ec2 import HEAD_AMI_SSM_PARAMETER

    template = ec2_synth[1]["ec2"]
    parameter = next(k for k, v in template["Parameters"].items() if v.get("Default") == HEAD_AMI_SSM_PARAMETER)
    assert template["Outputs"]["HeadImageId"]["Value"] == {"Ref": parameter}


@pytest.fixture(scope="module")
def ec2_spot_synth(tmp_path_factory):
    from stacks import build

    out = tmp_path_factory.mktemp("ec2-spot-synth")
    config = with_target(load_config(EXAMPLES / "spot.yaml"), "ec2")
    app = cdk_app(outdir=str(out))
    build(app, config, nag=True)
    app.synth()
    return {name: json.loads((out / f"{config.cluster.name}-{name}.template.json").read_text())
            for name in ("network", "storage", "ec2")}


@pytest.mark.slow
def test_spot_workers_may_be_launched_with_their_spot_request(ec2_spot_synth, ec2_synth):
    # IAM authorizes a spot RunInstances on the spot-instances-request it creates too (EC2's service
    # authorization reference); the on-demand default file needs no such grant.
    spot = json.dumps(_head_statements(ec2_spot_synth)["LaunchWith"]["Resource"])
    assert ":spot-instances-request/*" in spot
    assert "spot-instances-request" not in json.dumps(_head_statements(ec2_synth[1])["LaunchWith"]["Resource"])


def test_config_check_prints_the_ec2_cost_for_target_ec2():
    from config.__main__ import plan
    from config.target import ec2_cost_per_hour

    config = load_config(EXAMPLES / "ec2" / "cluster.yaml")
    assert config.target == "ec2"  # the bundled EC2 example
    idle, running = ec2_cost_per_hour(config)
    line = next(line for line in plan(config).splitlines() if "on-demand cost" in line)
    assert "target: ec2" in line and f"${idle:.2f}/hour" in line and f"${running:.2f}/hour" in line
    assert "control plane" not in line
    assert "control plane" in next(line for line in plan(load_config()).splitlines() if "on-demand cost" in line)
