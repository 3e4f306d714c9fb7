"""The EC2 target's Ray cluster-launcher YAML (`ray up`), rendered from the variable file and the EC2 stack's outputs.

    python -m ops.launcher render --deployed                   # after `cdk deploy` (reads CloudFormation)
    python -m ops.launcher render --outputs outputs.json       # describe-stacks or `cdk deploy --outputs-file`

writes `out/ec2/cluster.yaml` and the code bundle `out/ec2/app/` (the same files the EKS ConfigMap
carries: workloads, config, the variable file, job.sh, submit.sh), which `file_mounts` syncs to every host and
a bind mount puts at /app in every Ray container, as the ConfigMap does on EKS. So `ray exec out/ec2/cluster.yaml 'bash
/app/submit.sh'` submits exactly what `kubectl exec ... bash /app/submit.sh` submits there.

Upstream behaviour this relies on (ray 2.58.0, ray/autoscaler/): prepare_config merges aws/defaults.yaml
under the file, so every command list is written out (an absent `head_setup_commands` would bring in
the defaults' `pip install boto3`); a node type's `initialization_commands` replace the global list
(_private/autoscaler.py _get_node_type_specific_fields); the docker runner always adds `--net=host`
(_private/docker.py) and `--runtime=nvidia` where nvidia-smi works (_private/command_runner.py), and
bind-mounts each file mount at its path inside the container; NetworkInterfaces carry the subnet and
groups themselves (_private/aws/config.py _configure_subnets_and_groups_from_network_interfaces).
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import yaml

from config import ClusterConfig, load_catalog, load_config, resolve_path
from config.cli import add_file_argument, chosen_file
from config.ec2 import NETWORK_OUTPUTS, RAY_CLUSTER_TAG, ROOT_DEVICE, SSH_USER, STACK_OUTPUTS, efa_devices, node_sizing
from config.efa import INTERFACE_TYPES, efa_interface_layout
from config.errors import UserError, run_cli
from config.loader import REPO_ROOT
from config.topology import LOGICAL_GPU_RESOURCE

# charts.bundle and charts.ray are imported where used: they load cdk8s (jsii, a Node.js process), which
# `--help` and the tests of the pure parts do not need.
MOUNT_PATH = "/app"
"""Where the code bundle is in every container: charts.bundle.MOUNT_PATH, the pods' mount."""
# `file_mounts` syncs the bundle to each host (under Ray's docker mount prefix) and bind-mounts it at this staging
# path; a run option of our own bind-mounts the same host folder at /app. Not `file_mounts: {/app: ...}` alone: when
# a worker's container dies and its instance lives on, the autoscaler's recovery starts a new container with
# `file_mounts={}` (ray 2.58.0, ray/autoscaler/_private/autoscaler.py StandardAutoscaler.recover_if_needed;
# DockerCommandRunner.run_init mounts only the file mounts it is given), so that container had no /app and the
# resumed training workers could not import the workload (found by the ray up tier's worker kill). The run options
# are the node's docker config, which recovery keeps.
APP_STAGING_PATH = "/opt/ray-efa-app"
HEAD_TYPE = "head"
OUT_DIR = REPO_ROOT / "out" / "ec2"
# The Ray token: a root-only file on each host, bind-mounted read-only into the containers, which are given only its
# path. Ray 2.58 reads a token from the file RAY_AUTH_TOKEN_PATH names when RAY_AUTH_TOKEN is unset
# (src/ray/rpc/authentication/authentication_token_loader.cc, TryLoadTokenFromSources: RAY_AUTH_TOKEN, then
# RAY_AUTH_TOKEN_PATH, then ~/.ray/auth_token; a set path that is unreadable or empty is an error, never an
# unauthenticated start), so the token is in no container's environment and never in `docker inspect`, which
# `--env`/`--env-file` would put it in. /run is a tmpfs on AL2023: the token never reaches the root volume.
# Owned by root, mode 0600, in a 0700 directory: Docker (root) makes the bind mount and the DLC's processes run as
# root (no USER line), so nothing else needs to read it; the SSH user writes it through sudo.
AUTH_TOKEN_DIR = "/run/ray-auth"
AUTH_TOKEN_FILE = f"{AUTH_TOKEN_DIR}/token"
OBJECT_STORE_ENV = "RAY_EFA_OBJECT_STORE_BYTES"
STOP_TIMEOUT_S = 1
"""Seconds `docker stop` waits before SIGKILL. Ray runs each container with `bash` as its command (ray 2.58.0
ray/autoscaler/_private/docker.py, docker_start_cmds: `docker run ... -it ... <image> bash`): an interactive shell,
which ignores SIGTERM, so `ray down`'s `docker stop` (commands.py teardown_cluster, after `ray stop` has stopped
Ray) always waited out Docker's default 10 s before the same SIGKILL. Measured in the `ray up` tier."""
# Ray's AWS example configs run `ray start` under a raised open-file limit; kept.
_ULIMIT = "ulimit -n 65536;"
# The launcher needs `rsync` inside every Ray container (it copies the bootstrap config into the head's with
# `rsync -e 'docker exec -i'`, and the head's autoscaler syncs file mounts into each worker's the same way) and
# an ssh client inside the head's (the autoscaler reaches the workers over SSH): ray 2.58.0,
# ray/autoscaler/_private/command_runner.py DockerCommandRunner.run_init and run_rsync_up, with no fallback.
# The Ray Train DLC has neither. The host (the DLAMI) has both: its binaries and the shared libraries they load,
# with the host's own dynamic loader, are copied into HOST_TOOLS_DIR and bind-mounted read-only; the wrappers
# run them through that loader, so they work whatever the container's distribution or libc.
HOST_TOOLS = ("rsync", "ssh")
HOST_TOOLS_DIR = f"/home/{SSH_USER}/.ray-host-tools"
CONTAINER_TOOLS_DIR = "/opt/ray-host-tools"


class LauncherError(UserError):
    """Outputs that cannot render a launcher YAML: `str()` names the file or stack and the missing key."""


# ---- the stack's outputs ---------------------------------------------------------------------------

def outputs_from_json(data: object, *, source: str) -> dict[str, str]:
    """The network and EC2 stacks' outputs as one flat dict (`SubnetId` for the network stack's `GpuSubnetId`),
    from what `aws cloudformation describe-stacks` writes (`{"Stacks": [{"Outputs": [...]}, ...]}`, every stack
    listed merged) or `cdk deploy --all --outputs-file` writes (`{"<stack>": {key: value}, ...}`), or a flat dict."""
    found: dict = {}
    if isinstance(data, dict) and "Stacks" in data:
        for stack in data["Stacks"]:
            found.update({o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])})
    elif isinstance(data, list):
        found = {o["OutputKey"]: o["OutputValue"] for o in data if isinstance(o, dict) and "OutputKey" in o}
    elif isinstance(data, dict) and data and all(isinstance(v, dict) for v in data.values()):
        for outputs in data.values():
            found.update(outputs)
    elif isinstance(data, dict):
        found = data
    else:
        raise LauncherError(f"{source}: not CloudFormation outputs (describe-stacks JSON or cdk --outputs-file)")
    missing = [key for key in (*STACK_OUTPUTS, *NETWORK_OUTPUTS) if key not in found]
    if missing:
        raise LauncherError(f"{source}: missing output(s) {', '.join(missing)}; deploy the EC2 target "
                            "(`npx cdk deploy -c target=ec2 --all`) and read the outputs of <cluster>-network and "
                            "<cluster>-ec2")
    return {**{key: str(found[key]) for key in STACK_OUTPUTS}, "SubnetId": str(found["GpuSubnetId"])}


def stack_outputs(name: str, region: str) -> dict[str, str]:
    """The deployed network and EC2 stacks' outputs (`<name>-network`, `<name>-ec2`) through CloudFormation."""
    import boto3

    client = boto3.client("cloudformation", region_name=region)
    stacks = [client.describe_stacks(StackName=f"{name}-{part}")["Stacks"][0] for part in ("network", "ec2")]
    return outputs_from_json({"Stacks": stacks}, source=f"stacks {name}-network, {name}-ec2")


# ---- the YAML --------------------------------------------------------------------------------------

def _root_volume(size_gib: int) -> list[dict]:
    return [{"DeviceName": ROOT_DEVICE, "Ebs": {"VolumeSize": size_gib, "VolumeType": "gp3", "Encrypted": True,
                                                 "DeleteOnTermination": True}}]


# IMDSv2 only; hop limit 1 suffices because the Ray containers share the host's network namespace.
_METADATA = {"HttpTokens": "required", "HttpPutResponseHopLimit": 1, "HttpEndpoint": "enabled"}


def app_host_path(cluster_name: str) -> str:
    """Where Ray syncs the staged bundle on each host (ray 2.58.0 ray/autoscaler/sdk/sdk.py
    get_docker_host_mount_location, joined as docker.py docker_start_cmds joins a file mount's destination)."""
    return f"/tmp/ray_tmp_mount/{cluster_name}/{APP_STAGING_PATH}"


def _env_options(env: dict[str, str]) -> list[str]:
    return [f"--env {shlex.quote(f'{k}={v}')}" for k, v in env.items()]


def _initialization_commands(config: ClusterConfig, outputs: dict[str, str]) -> list[str]:
    """Host commands before `docker run`: docker if absent, the Ray token into a root-only env file."""
    # The DLAMI (workers) has docker with ec2-user allowed; the head's plain AL2023 gets it here. Ray runs
    # `docker` without sudo over a reused SSH connection, so the socket's ACL admits ec2-user at once (the group
    # takes effect only at the next login).
    commands = ["command -v docker >/dev/null || { sudo dnf install -y docker && sudo systemctl enable --now docker "
                "&& sudo usermod -aG docker $USER && sudo setfacl -m u:$USER:rw /var/run/docker.sock; }",
                host_tools_command()]
    if config.ray.auth == "token":
        read = (f"aws secretsmanager get-secret-value --region {config.region} --secret-id "
                f"{shlex.quote(outputs['AuthTokenSecretArn'])} --query SecretString --output text")
        # A token that cannot be read stops the node's setup (never an empty token). Not `(...)`: Ray wraps
        # each command in `(...)`, and bash reads `((` as arithmetic (found by the ray up tier).
        commands.append(f"{{ t=$({read}) && [ -n \"$t\" ]; }} || {{ echo 'error: cannot read the Ray auth token "
                        f"from Secrets Manager ({outputs['AuthTokenSecretArn']}): check the instance profile and the "
                        f"secret (docs/ec2.md)' >&2; exit 1; }}; {auth_token_write()}")
    return commands


def auth_token_write() -> str:
    """Write "$t" (the token, a shell variable: never on a command line) to AUTH_TOKEN_FILE as root, mode 0600.
    In place (`cat >`), so a container that has it bind-mounted keeps seeing the file on a second `ray up`."""
    script = (f"umask 077 && mkdir -p {AUTH_TOKEN_DIR} && chmod 700 {AUTH_TOKEN_DIR} && cat > {AUTH_TOKEN_FILE} "
              f"&& chmod 600 {AUTH_TOKEN_FILE}")
    return f"printf '%s\\n' \"$t\" | sudo sh -c {shlex.quote(script)}"


def auth_run_options() -> list[str]:
    """The token file, read-only, and its path: what every Ray container gets with `ray.auth: token`."""
    return ["--env RAY_AUTH_MODE=token", f"--env RAY_AUTH_TOKEN_PATH={AUTH_TOKEN_FILE}",
            f"-v {AUTH_TOKEN_FILE}:{AUTH_TOKEN_FILE}:ro"]


def host_tools_command() -> str:
    """Copy the host's rsync and ssh, their libraries and loader into HOST_TOOLS_DIR (once), with wrappers that
    run them from CONTAINER_TOOLS_DIR; fails naming the tool when the host lacks one."""
    t = HOST_TOOLS_DIR
    wrapper = (f"'#!/bin/sh\\nexec {CONTAINER_TOOLS_DIR}/lib/ld.so --library-path {CONTAINER_TOOLS_DIR}/lib "
               f"{CONTAINER_TOOLS_DIR}/%s.bin \"$@\"\\n'")
    copy = (f"rm -rf {t}.new && mkdir -p {t}.new/lib && for b in {' '.join(HOST_TOOLS)}; do "
            "p=$(command -v $b) || { echo \"error: $b is not installed on the host; the Ray containers use the "
            "host's (docs/ec2.md)\" >&2; exit 1; }; "
            f"cp -L $p {t}.new/$b.bin && "
            "for l in $(ldd $p | awk '$2 == \"=>\" && $3 ~ /^\\// {print $3} $1 ~ /^\\// {print $1}'); do "
            f"cp -L $l {t}.new/lib/; done && "
            f"cp -L $(ldd $p | awk '$1 ~ /ld-linux/ {{print $1}}') {t}.new/lib/ld.so && "
            f"printf {wrapper} $b > {t}.new/$b && chmod 755 {t}.new/$b || exit 1; done && mv {t}.new {t}")
    checks = " && ".join(f"[ -x {t}/{b} ]" for b in HOST_TOOLS)
    return f"{checks} || ({copy})"


def host_tools_run_options() -> list[str]:
    """The bind mounts that put the host's rsync and ssh on the container's PATH (/usr/local/bin)."""
    return [f"-v {HOST_TOOLS_DIR}:{CONTAINER_TOOLS_DIR}:ro",
            *(f"-v {HOST_TOOLS_DIR}/{b}:/usr/local/bin/{b}:ro" for b in HOST_TOOLS)]


def _worker_node_type(config: ClusterConfig, group, outputs: dict[str, str], init: list[str]) -> dict:
    from charts.ray import EFA_CAPABILITIES, GPU_ALLOCATOR_ENV, transport_env

    itype = load_catalog().instances[group.instance_type]
    efa = efa_devices(config, group)
    # The same /dev/shm, object store and huge pages as the group's Ray pod on EKS (one per node: the EC2
    # target requires gpus_per_pod = the type's GPUs), so the preflight's expectations hold on both targets.
    res = config.pod_resources[group.name]
    node_config: dict = {
        "InstanceType": group.instance_type,
        "ImageId": outputs["ImageId"],
        "IamInstanceProfile": {"Arn": outputs["WorkerInstanceProfileArn"]},
        "Placement": {"GroupName": outputs["PlacementGroupName"], "AvailabilityZone": outputs["AvailabilityZone"]},
        "BlockDeviceMappings": _root_volume(group.disk_gib),
        "MetadataOptions": dict(_METADATA),
    }
    if efa:
        node_config["NetworkInterfaces"] = [
            {"DeviceIndex": i.device, "NetworkCardIndex": i.card, "InterfaceType": i.kind,
             "SubnetId": outputs["SubnetId"], "Groups": [outputs["SecurityGroupId"]], "DeleteOnTermination": True}
            for i in efa_interface_layout(efa)]
    else:
        node_config["SubnetIds"] = [outputs["SubnetId"]]
        node_config["SecurityGroupIds"] = [outputs["SecurityGroupId"]]
    if group.capacity == "spot":
        node_config["InstanceMarketOptions"] = {"MarketType": "spot"}
    run_options = [f"--shm-size={res.shm_gib}g",
                   *_env_options({**transport_env(config, group), **GPU_ALLOCATOR_ENV,
                                  OBJECT_STORE_ENV: str(res.object_store_bytes)})]
    if itype.gpus:
        # Every GPU of the node, through Docker's own `--gpus` (the NVIDIA Container Toolkit the DLAMI ships
        # registers it); Ray's guess (`--runtime=nvidia` when nvidia-smi answers) is switched off below.
        run_options.append("--gpus all")
    if efa:
        # The EFA devices (one uverbs per EFA interface) and what libfabric needs to pin memory with them
        # (the DLC's EC2 instructions; on EKS the device plugin and IPC_LOCK do the same).
        run_options += [f"--device=/dev/infiniband/uverbs{n}" for n in range(efa)]
        run_options += [f"--cap-add {cap}" for cap in EFA_CAPABILITIES]
    commands = list(init)
    if res.hugepages_2mi_mib:
        # libfabric's EFA provider takes its bounce buffers from 2 MiB huge pages (as on EKS, where the launch
        # template's user data reserves them; config.nvidia_nodes_hugepages is the same count).
        commands.append(f"sudo sysctl -w vm.nr_hugepages={config.nvidia_nodes_hugepages(group)}")
    return {
        "node_config": node_config,
        "resources": _worker_resources(group, itype),
        "min_workers": config.group_min(group),
        "max_workers": config.group_max(group),
        "initialization_commands": commands,
        "docker": {"worker_run_options": run_options},
    }


def _worker_resources(group, itype) -> dict[str, int]:
    """What the node type offers Ray (the autoscaler launches a type for demand its resources meet). A lab's
    logical GPUs (`logical_gpus`, a CPU type) are the custom resource the CPU training workers ask for
    (config.topology.LOGICAL_GPU_RESOURCE, as charts.ray gives the EKS pods), with no real GPU."""
    if group.logical_gpus is not None:
        return {"CPU": itype.vcpus, "GPU": 0, LOGICAL_GPU_RESOURCE: group.logical_gpus}
    return {"CPU": itype.vcpus, "GPU": itype.gpus}


def launcher_config(config: ClusterConfig, outputs: dict[str, str], *, app_dir: Path) -> dict:
    """The `ray up` cluster config for `config` on the EC2 stack with `outputs`; `app_dir` is the local code bundle."""
    from charts.ray import _code_env

    head_type = load_catalog().instances[config.ec2.head_instance_type]
    head_sizing = node_sizing(head_type.memory_gib)
    init = _initialization_commands(config, outputs)
    env = {**_code_env(config), "CHECKPOINT_BUCKET": outputs["BucketName"]}
    run_options = ["--ulimit memlock=-1", f"--stop-timeout={STOP_TIMEOUT_S}",
                   f"-v {app_host_path(config.cluster.name)}:{MOUNT_PATH}:ro",
                   *host_tools_run_options(), *_env_options(env)]
    if config.ray.auth == "token":
        run_options += auth_run_options()
    auth: dict = {"ssh_user": SSH_USER}
    if config.ec2.access == "ssm":
        # `ray up` SSHes to the head's private IP; Session Manager needs the instance id, looked up by that IP.
        # ssh runs ProxyCommand with the user's $SHELL: the JMESPath query is single-quoted, since zsh would
        # glob the unquoted `[0]` ("no matches found"); only a running instance (a terminated one keeps its
        # private IP for a while) with this cluster's tag is taken.
        lookup = (f"$(aws ec2 describe-instances --region {config.region} --filters "
                  "Name=private-ip-address,Values=%h Name=instance-state-name,Values=running "
                  f"Name=tag:{RAY_CLUSTER_TAG},Values={config.cluster.name} "
                  "--query 'Reservations[0].Instances[0].InstanceId' --output text)")
        auth["ssh_proxy_command"] = (f"aws ssm start-session --region {config.region} --target {lookup} "
                                     "--document-name AWS-StartSSHSession --parameters portNumber=%p")
    node_types = {
        HEAD_TYPE: {
            "node_config": {
                "InstanceType": config.ec2.head_instance_type,
                "ImageId": outputs["HeadImageId"],
                "IamInstanceProfile": {"Arn": outputs["HeadInstanceProfileArn"]},
                "SubnetIds": [outputs["SubnetId"]],
                "SecurityGroupIds": [outputs["SecurityGroupId"]],
                "BlockDeviceMappings": _root_volume(config.ec2.head_disk_gib),
                "MetadataOptions": dict(_METADATA),
            },
            # Nothing that asks for a CPU or a GPU lands on the head: training, preflight and data
            # tasks go to the workers; the job driver and Ray Train's controller ask for none.
            "resources": {"CPU": 0, "GPU": 0},
            "min_workers": 0,
            "max_workers": 0,
        },
    }
    for group in config.cluster.worker_groups:
        node_types[group.name] = _worker_node_type(config, group, outputs, init)
    pip = list(config.ray.extra_pip_packages)
    return {
        "cluster_name": config.cluster.name,
        "max_workers": sum(config.group_max(g) for g in config.cluster.worker_groups),
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": config.ec2.idle_timeout_minutes,
        "docker": {
            "image": config.ray.image,
            "container_name": "ray_container",
            "pull_before_run": True,
            "run_options": run_options,
            "head_run_options": [f"--shm-size={head_sizing.shm_gib}g",
                                 *_env_options({OBJECT_STORE_ENV: str(head_sizing.object_store_mib * 1024**2)})],
            # Sized here per node type instead (Ray would give every container the same share of memory).
            "disable_shm_size_detection": True,
            # GPUs are asked for with `--gpus all` per node type, not guessed from nvidia-smi on the host
            # (ray 2.58.0 command_runner.py DockerCommandRunner._configure_runtime).
            "disable_automatic_runtime_detection": True,
        },
        "provider": {
            "type": "aws",
            "region": config.region,
            "availability_zone": outputs["AvailabilityZone"],
            "use_internal_ips": True,
            # An idle worker is terminated, not stopped: a stopped GPU instance still pays for its volume
            # and would come back with the old image.
            "cache_stopped_nodes": False,
        },
        "auth": auth,
        "available_node_types": node_types,
        "head_node_type": HEAD_TYPE,
        "file_mounts": {APP_STAGING_PATH: str(app_dir)},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": ["**/__pycache__"],
        "rsync_filter": [],
        "initialization_commands": init,
        "setup_commands": [shlex.join(["pip", "install", "--no-cache-dir", *pip])] if pip else [],
        # The autoscaler on the head needs boto3; the DLC image may lack it. Pinned as requirements.txt pins it.
        "head_setup_commands": ["python -c 'import boto3' 2>/dev/null || pip install --no-cache-dir "
                                f"{_boto3_pin()}"],
        "worker_setup_commands": [],
        "head_start_ray_commands": [
            "ray stop",
            f"{_ULIMIT} ray start --head --port=6379 --object-manager-port=8076 "
            "--autoscaling-config=~/ray_bootstrap_config.yaml --dashboard-host=127.0.0.1 --disable-usage-stats "
            f"--object-store-memory=${OBJECT_STORE_ENV}",
        ],
        "worker_start_ray_commands": [
            "ray stop",
            f"{_ULIMIT} ray start --address=$RAY_HEAD_IP:6379 --object-manager-port=8076 --disable-usage-stats "
            f"--object-store-memory=${OBJECT_STORE_ENV}",
        ],
    }


def _boto3_pin() -> str:
    from charts.ray import pinned_requirement

    return pinned_requirement("boto3")


# ---- the project's own checks (what Ray's validator, botocore and the emulator let through) -------

def node_config_problems(launcher: dict, config: ClusterConfig, outputs: dict[str, str]) -> list[str]:
    """What EC2 would refuse only at launch time, which neither Ray's schema, botocore's validator nor moto
    catch: an unknown InterfaceType, an instance type the catalog lacks, an EFA layout that does not match the
    type, a placement group or AZ other than the stack's."""
    problems = []
    catalog = load_catalog()
    for name, node_type in launcher["available_node_types"].items():
        node = node_type["node_config"]
        itype = catalog.get(node["InstanceType"])
        if itype is None:
            problems.append(f"{name}: InstanceType {node['InstanceType']} is not in config/instances.yaml")
            continue
        interfaces = node.get("NetworkInterfaces", [])
        for interface in interfaces:
            if interface.get("InterfaceType", "interface") not in INTERFACE_TYPES:
                problems.append(f"{name}: InterfaceType '{interface.get('InterfaceType')}' is not one of "
                                f"{sorted(INTERFACE_TYPES)}")
        efa = sum(1 for i in interfaces if i.get("InterfaceType") in ("efa", "efa-only"))
        if efa > itype.efa_interfaces:
            problems.append(f"{name}: {efa} EFA interfaces, but {itype.name} supports {itype.efa_interfaces}")
        if len({i.get("NetworkCardIndex", 0) for i in interfaces if i.get("InterfaceType") != "interface"}) < efa:
            problems.append(f"{name}: two EFA interfaces on one network card")
        if name == launcher["head_node_type"]:
            continue
        placement = node.get("Placement", {})
        if placement.get("GroupName") != outputs["PlacementGroupName"]:
            problems.append(f"{name}: Placement.GroupName {placement.get('GroupName')!r} is not the stack's "
                            f"placement group {outputs['PlacementGroupName']!r}")
        if placement.get("AvailabilityZone") != config.gpu_availability_zone:
            problems.append(f"{name}: Placement.AvailabilityZone {placement.get('AvailabilityZone')!r} is not "
                            f"gpu_availability_zone {config.gpu_availability_zone!r}")
    return problems


# ---- files and the command line --------------------------------------------------------------------

def write_app_dir(config_file: Path, config: ClusterConfig, app_dir: Path) -> None:
    """The code bundle the EKS ConfigMap carries, as files under `app_dir` (at /app in every container)."""
    from charts import bundle
    from charts.ray import runtime_env_json

    code = bundle.collect(config_file, runtime_env_json=runtime_env_json(config), config=config)
    for key, text in code.data.items():
        target = app_dir / code.paths[key]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def render(config_file: Path, config: ClusterConfig, outputs: dict[str, str], out_dir: Path) -> Path:
    """Write `out_dir/cluster.yaml` and `out_dir/app/`; refuse (LauncherError) what the project's checks catch."""
    app_dir = (out_dir / "app").resolve()
    launcher = launcher_config(config, outputs, app_dir=app_dir)
    problems = node_config_problems(launcher, config, outputs)
    if problems:
        raise LauncherError("\n".join(problems))
    out_dir.mkdir(parents=True, exist_ok=True)
    write_app_dir(config_file, config, app_dir)
    path = out_dir / "cluster.yaml"
    header = (f"# Generated by `python -m ops.launcher render` from {config_file.name} and the stack's outputs;\n"
              "# `ray up` this file (docs/ec2.md). Edit the variable file, not this one.\n")
    path.write_text(header + yaml.safe_dump(launcher, sort_keys=False, width=120))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.launcher", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rend = sub.add_parser("render", help="write the ray up YAML and the /app bundle from the stack's outputs")
    add_file_argument(rend)
    source = rend.add_mutually_exclusive_group(required=True)
    source.add_argument("--outputs", type=Path,
                        help="JSON of the stack's outputs (describe-stacks or cdk --outputs-file)")
    source.add_argument("--deployed", action="store_true",
                        help="read the deployed <cluster>-network and <cluster>-ec2 stacks' outputs (CloudFormation)")
    rend.add_argument("--out-dir", type=Path, default=OUT_DIR, help=f"where to write (default: {OUT_DIR})")
    upp = sub.add_parser("up", help="`ray up` the rendered YAML within job.start_deadline_minutes; on a failure or "
                         "the deadline, `ray down` and say what to fix (ops/launcher_up.py)")
    add_file_argument(upp)
    upp.add_argument("--yaml", type=Path, default=OUT_DIR / "cluster.yaml",
                     help=f"the launcher YAML (default: {OUT_DIR / 'cluster.yaml'})")
    args = parser.parse_args(argv)
    if args.command == "up":
        from ops.launcher_up import up

        config = load_config(resolve_path(chosen_file(upp, args)))
        return up(args.yaml, deadline_minutes=config.job.start_deadline_minutes)
    config_file = resolve_path(chosen_file(rend, args))
    config = load_config(config_file)
    if args.outputs:
        try:
            data = json.loads(args.outputs.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise LauncherError(f"{args.outputs}: cannot read outputs ({exc})") from None
        outputs = outputs_from_json(data, source=str(args.outputs))
    else:
        outputs = stack_outputs(config.cluster.name, config.region)
    path = render(config_file, config, outputs, args.out_dir)
    print(f"wrote {path} and {args.out_dir / 'app'}/; next: ray up {path}")
    return 0


if __name__ == "__main__":
    run_cli(main)
