"""The variable file: defaults, examples, every validation rule, derived values, the check CLI."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from config import ConfigError, load_config
from config.__main__ import main as config_main
from config.catalog import load_catalog
from config.model import EFA_HUGEPAGES_MIB_PER_POD
from tests.helpers import EXAMPLES, REPO, default_data, load_variant, merge, write_variant

EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))


def check(path) -> tuple[int, str, str]:
    """Run `python -m config check PATH` in-process; return (exit code, stdout, stderr)."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = config_main(["check", str(path)])
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def refused(tmp_path, overrides=None, *, group=None, text=None) -> list[str]:
    """Write a variant (or raw text), run the check CLI, assert exit 2, return the stderr lines."""
    if text is not None:
        path = tmp_path / "cluster.yaml"
        path.write_text(text)
    else:
        path = write_variant(tmp_path, overrides, group=group)
    code, out, err = check(path)
    assert code == 2, (out, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines and all(line.startswith(f"{path}: ") for line in lines), lines
    return lines


def paths_of(lines: list[str]) -> list[str]:
    """The dotted field path of each `FILE: path: message` line."""
    return [line.split(": ", 2)[1] for line in lines]


# ---- accepted files ---------------------------------------------------------------------


def test_default_file_is_valid_and_prints_plan():
    code, out, err = check(REPO / "config" / "cluster.yaml")
    assert code == 0, err
    assert "world size 8" in out
    assert "2 x g6.12xlarge" in out
    assert "/hour (prices of" in out


def test_plan_shows_cost_idle_and_while_a_job_runs():
    code, out, err = check(REPO / "config" / "cluster.yaml")
    assert code == 0, err
    config = load_config()
    assert f"idle ${config.idle_cost_per_hour:.2f}/hour (control plane, NAT, system nodes)" in out
    assert f"while a job runs ${config.cost_per_hour:.2f}/hour" in out
    assert "node group min/desired/max 0/0/2" in out


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.stem)
def test_every_example_is_valid(path):
    code, _, err = check(path)
    assert code == 0, err


def test_required_examples_exist():
    assert {p.stem for p in EXAMPLE_FILES} >= {"socket", "spot", "single-node", "p5"}


def test_default_reproduces_reference_setup():
    config = load_config()
    group = config.cluster.worker_groups[0]
    assert config.region == "us-east-2" and config.gpu_availability_zone.startswith("us-east-2")
    assert (group.instance_type, group.nodes, group.gpus_per_pod) == ("g6.12xlarge", 2, 4)
    assert config.nccl.transport == "efa"
    assert config.ray.image == "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1.0"
    assert (config.ray.ray_version, config.ray.kuberay_version) == ("2.58.0", "1.7.0")
    assert config.job.model == "Qwen/Qwen2.5-1.5B"
    assert config.ray.extra_pip_packages == []
    assert int(config.cluster.kubernetes_version.split(".")[1]) >= 34


def test_env_var_selects_the_file(tmp_path, monkeypatch):
    path = write_variant(tmp_path, {"cluster": {"name": "from-env"}})
    monkeypatch.setenv("CLUSTER_CONFIG", str(path))
    assert load_config().cluster.name == "from-env"


# ---- derived values, checked by hand ----------------------------------------------------


def test_derived_values_g6_12xlarge():
    config = load_config()
    group = config.cluster.worker_groups[0]
    res = config.pod_resources["gpu"]
    assert config.pods_per_node(group) == 1 and config.pods(group) == 2
    assert config.world_size == 8
    # 48 vCPU: kubelet reserves 60+10+5+5+44*2.5 = 190 m; 1000 m for DaemonSets -> 46810 m -> 46 CPUs.
    assert res.cpu == 46
    # 192 GiB * 0.95 = 186777 MiB; minus kube-reserved (255 + 11*250) and eviction 100 -> 183667;
    # minus 2048 DaemonSets and 5120 hugepages -> 176499 MiB -> 172 GiB; /dev/shm a quarter -> 43.
    assert res.memory_gib == 172 and res.shm_gib == 43
    # Ray's object store: three quarters of /dev/shm (0.75 x 43 GiB = 33024 MiB), the rest for NCCL.
    assert res.object_store_mib == 33024 and res.object_store_bytes == 33024 * 1024**2
    assert res.hugepages_2mi_mib == EFA_HUGEPAGES_MIB_PER_POD == 5120
    assert res.efa_devices == 1 and res.gpus == 4
    assert config.cpus_per_worker == 11  # (46 - 1) // 4
    assert config.grad_accumulation == 2  # 64 / (4 x 8)
    assert config.nvidia_nodes_hugepages(group) == 2560
    assert config.gpu_peak_tflops == 121


def test_derived_values_p5_48xlarge():
    config = load_config(EXAMPLES / "p5.yaml")
    group = config.cluster.worker_groups[0]
    res = config.pod_resources["h100"]
    assert config.world_size == 16 and config.pods(group) == 2
    # 192 vCPU: 60+10+10+188*2.5 = 550 m reserved; minus 1000 m -> 190450 m -> 190 CPUs.
    assert res.cpu == 190
    # 2048 GiB * 0.95 = 1992294 MiB - 3005 - 100 - 2048 - 5120 = 1982021 MiB -> 1935 GiB; shm capped at 64.
    assert res.memory_gib == 1935 and res.shm_gib == 64
    assert res.object_store_mib == 48 * 1024
    assert res.efa_devices == 32 and res.gpus == 8
    assert config.instance(group).gpudirect_rdma


def test_head_shm_and_object_store():
    head = load_config().head_resources
    # 16 GiB head: /dev/shm a quarter (4 GiB), object store three quarters of that (3 GiB).
    assert (head.cpu, head.memory_gib, head.shm_gib, head.object_store_mib) == (4, 16, 4, 3072)
    assert (head.gpus, head.efa_devices, head.hugepages_2mi_mib) == (0, 0, 0)


def test_plan_shows_object_store():
    _, out, _ = check(REPO / "config" / "cluster.yaml")
    assert "/dev/shm 4 GiB, object store 3 GiB" in out
    assert "/dev/shm 43 GiB (object store 32.25 GiB)" in out


def test_socket_transport_has_no_efa_or_hugepages():
    config = load_config(EXAMPLES / "socket.yaml")
    res = next(iter(config.pod_resources.values()))
    assert res.efa_devices == 0 and res.hugepages_2mi_mib == 0


def test_idle_cost_is_control_plane_nat_and_system_nodes():
    config = load_config()
    catalog = load_catalog()
    assert config.idle_cost_per_hour == pytest.approx(2 * catalog.get("m7i.2xlarge").usd_per_hour + 0.10 + 0.045)


def test_idle_cost_counts_a_gpu_minimum(tmp_path):
    config = load_variant(tmp_path, group={"min_nodes": 1})
    idle = load_config().idle_cost_per_hour
    assert config.idle_cost_per_hour == pytest.approx(idle + load_catalog().get("g6.12xlarge").usd_per_hour)
    assert config.cost_per_hour == pytest.approx(load_config().cost_per_hour)


def test_gpu_groups_scale_from_zero_to_nodes_by_default():
    config = load_config()
    (group,) = config.cluster.worker_groups
    assert (config.group_min(group), config.group_desired(group), config.group_max(group)) == (0, 0, 2)
    assert config.pods(group) == 2  # Ray's replicas still come from `nodes`


def test_autoscaling_off_gives_fixed_groups(tmp_path):
    config = load_variant(tmp_path, {"autoscaling": {"enabled": False}})
    (group,) = config.cluster.worker_groups
    assert (config.group_min(group), config.group_desired(group), config.group_max(group)) == (2, 2, 2)


def test_capacity_block_example_starts_with_no_node():
    """The README's capacity-block workflow: validate config/examples/p5.yaml as shipped; its group starts
    at 0 nodes (min and desired) and may grow to `nodes` once the block is active."""
    config = load_config(EXAMPLES / "p5.yaml")
    (group,) = config.cluster.worker_groups
    assert group.capacity == "capacity_block"
    assert (config.group_min(group), config.group_desired(group), config.group_max(group)) == (0, 0, group.nodes)


def test_capacity_block_without_autoscaler_still_starts_empty(tmp_path):
    config = load_variant(tmp_path, {"autoscaling": {"enabled": False}}, base=EXAMPLES / "p5.yaml",
                          group={"min_nodes": 0})
    (group,) = config.cluster.worker_groups
    assert (config.group_min(group), config.group_desired(group), config.group_max(group)) == (0, 0, 2)


def test_scale_down_minutes_must_be_positive(tmp_path):
    lines = refused(tmp_path, {"autoscaling": {"scale_down_minutes": 0}})
    assert paths_of(lines) == ["autoscaling.scale_down_minutes"]


def test_cost_per_hour_from_catalog():
    config = load_config()
    catalog = load_catalog()
    expected = 2 * catalog.get("g6.12xlarge").usd_per_hour + 2 * catalog.get("m7i.2xlarge").usd_per_hour + 0.10 + 0.045
    assert config.cost_per_hour == pytest.approx(expected)


def test_availability_zones_start_with_gpu_az():
    config = load_config()
    assert config.availability_zones[0] == config.gpu_availability_zone
    assert len(set(config.availability_zones)) == config.network.max_azs


def test_availability_zones_are_the_regions_real_ones(tmp_path):
    # ap-northeast-1 has no 1b: after the GPU AZ 1a come 1c and 1d.
    config = load_config(write_variant(tmp_path, {"region": "ap-northeast-1", "gpu_availability_zone":
                                                  "ap-northeast-1a", "network": {"max_azs": 3}}))
    assert config.availability_zones == ["ap-northeast-1a", "ap-northeast-1c", "ap-northeast-1d"]
    config = load_config(write_variant(tmp_path, {"network": {"max_azs": 3}}))
    assert config.availability_zones == ["us-east-2b", "us-east-2a", "us-east-2c"]


def test_catalog_lists_the_regions_azs():
    catalog = load_catalog()
    letters = {"us-east-1": "abcdef", "us-east-2": "abc", "us-west-2": "abcd", "eu-west-1": "abc",
               "eu-central-1": "abc", "ap-northeast-1": "acd", "ap-southeast-2": "abc"}
    for region, expected in letters.items():
        assert catalog.availability_zones(region) == [f"{region}{c}" for c in expected], region


def test_catalog_covers_required_families():
    names = set(load_catalog().instances)
    required = {f"g6.{s}" for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge",
                                    "48xlarge")}
    required |= {"g6e.12xlarge", "g5.12xlarge", "p4d.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge",
                 "m7i.2xlarge", "m6i.2xlarge"}
    assert required <= names
    g6 = load_catalog().get("g6.12xlarge")
    assert (g6.gpus, g6.efa_interfaces, g6.gpudirect_rdma, g6.gpu_memory_gib) == (4, 1, False, 24)
    assert not load_catalog().get("g6.4xlarge").has_efa


# ---- one test per rule --------------------------------------------------------------------


def test_unknown_instance_type(tmp_path):
    lines = refused(tmp_path, group={"instance_type": "g6.13xlarge"})
    assert paths_of(lines) == ["cluster.worker_groups.0.instance_type"]
    assert "config/instances.yaml" in lines[0]


def test_efa_transport_on_instance_without_efa(tmp_path):
    lines = refused(tmp_path, group={"instance_type": "g6.4xlarge", "gpus_per_pod": 1},
                    overrides={"job": {"global_batch_size": 64}})
    assert "nccl.transport" in paths_of(lines)
    assert "transport: socket" in lines[paths_of(lines).index("nccl.transport")]


def test_gpus_per_pod_not_dividing(tmp_path):
    lines = refused(tmp_path, group={"gpus_per_pod": 3})
    assert paths_of(lines) == ["cluster.worker_groups.0.gpus_per_pod"]
    assert "[1, 2, 4]" in lines[0]


def test_gpus_per_pod_exceeding(tmp_path):
    lines = refused(tmp_path, group={"gpus_per_pod": 8})
    assert paths_of(lines) == ["cluster.worker_groups.0.gpus_per_pod"]
    assert "outside 1..4" in lines[0]


def test_efa_interface_cannot_be_split_across_pods(tmp_path):
    lines = refused(tmp_path, group={"gpus_per_pod": 1})
    assert paths_of(lines) == ["cluster.worker_groups.0.gpus_per_pod"]
    assert "EFA" in lines[0]


def test_worker_nodes_below_one(tmp_path):
    lines = refused(tmp_path, group={"nodes": 0})
    assert "cluster.worker_groups.0.nodes" in paths_of(lines)


def test_system_nodes_below_one(tmp_path):
    lines = refused(tmp_path, {"cluster": {"system_nodes": {"nodes": 0}}})
    assert paths_of(lines) == ["cluster.system_nodes.nodes"]


def test_head_not_fitting_system_node(tmp_path):
    lines = refused(tmp_path, {"ray": {"head": {"cpu": 8, "memory_gib": 16}}})
    assert paths_of(lines) == ["ray.head"]
    assert "m7i.2xlarge" in lines[0]


def test_az_not_in_region(tmp_path):
    lines = refused(tmp_path, {"gpu_availability_zone": "us-west-2a"})
    assert paths_of(lines) == ["gpu_availability_zone"]


def test_az_letter_the_region_does_not_have(tmp_path):
    lines = refused(tmp_path, {"gpu_availability_zone": "us-east-2d"})
    assert paths_of(lines) == ["gpu_availability_zone"]
    assert "does not exist in region us-east-2" in lines[0] and "'us-east-2a', 'us-east-2b', 'us-east-2c'" in lines[0]


def test_more_azs_than_the_region_has(tmp_path):
    lines = refused(tmp_path, {"network": {"max_azs": 4}})
    assert paths_of(lines) == ["network.max_azs"]
    assert "us-east-2 has 3" in lines[0] and "at most 3" in lines[0]


def test_unknown_region(tmp_path):
    lines = refused(tmp_path, {"region": "me-south-1", "gpu_availability_zone": "me-south-1a"})
    assert paths_of(lines) == ["region"]
    assert "config/instances.yaml" in lines[0] and "describe-availability-zones --region me-south-1" in lines[0]


def test_derived_bucket_name_over_63_characters(tmp_path):
    # 'a-cluster-name-of-forty-one-characters-xx' (41) + '-ckpt-' + 12 digits + '-ap-southeast-2' = 74.
    name = "a-cluster-name-of-forty-one-characters-xx"
    overrides = {"region": "ap-southeast-2", "gpu_availability_zone": "ap-southeast-2a", "cluster": {"name": name}}
    lines = refused(tmp_path, overrides)
    assert paths_of(lines) == ["cluster.name"]
    assert "74 characters, over S3's 63" in lines[0] and "at most 30 characters" in lines[0]
    assert "storage.bucket_name" in lines[0]
    # An explicit bucket name lifts the limit; 30 characters fit exactly.
    assert load_config(write_variant(tmp_path, merge(overrides, {"storage": {"bucket_name": "my-ckpt"}})))
    config = load_config(write_variant(tmp_path, merge(overrides, {"cluster": {"name": name[:30]}})))
    assert len(config.bucket_name("123456789012")) == 63


def test_kubernetes_version_without_an_installed_kubectl_layer(tmp_path):
    lines = refused(tmp_path, {"cluster": {"kubernetes_version": "1.35"}})
    # 1.35 has neither a kubectl layer nor a Cluster Autoscaler chart pinned: both are reported.
    assert paths_of(lines) == ["cluster.kubernetes_version"] * 2
    assert "pin aws-cdk.lambda-layer-kubectl-v35 in requirements.txt" in lines[0]
    assert "no Cluster Autoscaler chart is pinned for Kubernetes 1.35" in lines[1]


def test_kubectl_layer_rule_is_skipped_where_the_cdk_is_not_installed(tmp_path, monkeypatch):
    """Inside the Ray pods (no CDK in the image) the workload loads the same file; nothing there needs the layer."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "aws_cdk" else real(name, *a))
    assert load_config(write_variant(tmp_path, {"cluster": {"kubernetes_version": "1.35"}}))


def test_image_pinned_to_latest(tmp_path):
    lines = refused(tmp_path, {"ray": {"image": "rayproject/ray:latest"}})
    assert paths_of(lines) == ["ray.image"]
    assert "latest" in lines[0]


def test_image_untagged(tmp_path):
    lines = refused(tmp_path, {"ray": {"image": "public.ecr.aws/deep-learning-containers/ray"}})
    assert paths_of(lines) == ["ray.image"]
    assert "no tag" in lines[0]


def test_ray_version_not_matching_image(tmp_path):
    lines = refused(tmp_path, {"ray": {"ray_version": "2.50.0"}})
    assert paths_of(lines) == ["ray.ray_version"]
    assert "2.58.0" in lines[0]


@pytest.mark.parametrize("package", ["transformers==4.40.0", "torch>=2.0", "Ray[train]", "nvidia-nccl-cu13==2.20"])
def test_extra_pip_replacing_image_stack(tmp_path, package):
    lines = refused(tmp_path, {"ray": {"extra_pip_packages": ["peft==0.15.0", package]}})
    assert paths_of(lines) == ["ray.extra_pip_packages.1"]


def test_rdma_on_instance_without_it(tmp_path):
    lines = refused(tmp_path, group={"gpudirect_rdma": True})
    assert paths_of(lines) == ["cluster.worker_groups.0.gpudirect_rdma"]
    assert "FI_EFA_USE_DEVICE_RDMA" in lines[0]


def test_duplicate_worker_group_names(tmp_path):
    data = default_data()
    data["cluster"]["worker_groups"].append(dict(data["cluster"]["worker_groups"][0]))
    lines = refused(tmp_path, text=yaml.safe_dump(data))
    assert paths_of(lines) == ["cluster.worker_groups.1.name"]


def test_capacity_block_needs_reservation(tmp_path):
    lines = refused(tmp_path, group={"capacity": "capacity_block"})
    assert paths_of(lines) == ["cluster.worker_groups.0.capacity_reservation_id"]


def test_batch_not_splitting_across_ranks(tmp_path):
    lines = refused(tmp_path, {"job": {"global_batch_size": 60}})
    assert paths_of(lines) == ["job.global_batch_size"]
    assert "multiple of 32" in lines[0]


def test_malformed_yaml(tmp_path):
    lines = refused(tmp_path, text="region: us-east-2\ncluster: [\n")
    assert "malformed YAML" in lines[0] and "line " in paths_of(lines)[0]


def test_empty_file(tmp_path):
    lines = refused(tmp_path, text="")
    assert "empty" in lines[0]


def test_missing_file(tmp_path):
    code, _, err = check(tmp_path / "nope.yaml")
    assert code == 2 and "cannot read" in err


def test_top_level_not_a_mapping(tmp_path):
    lines = refused(tmp_path, text="- a\n- b\n")
    assert "mapping" in lines[0]


def test_wrong_type(tmp_path):
    lines = refused(tmp_path, {"job": {"seq_len": "long"}})
    assert paths_of(lines) == ["job.seq_len"]


def test_unknown_key_is_not_ignored(tmp_path):
    lines = refused(tmp_path, group={"gpus_per_node": 4})
    assert paths_of(lines) == ["cluster.worker_groups.0.gpus_per_node"]
    assert "unknown key" in lines[0]


def test_old_kubernetes_version(tmp_path):
    lines = refused(tmp_path, {"cluster": {"kubernetes_version": "1.29"}})
    assert paths_of(lines) == ["cluster.kubernetes_version"]


def test_all_problems_reported_at_once(tmp_path):
    lines = refused(tmp_path, {"gpu_availability_zone": "eu-west-1a", "ray": {"ray_version": "1.0.0"}},
                    group={"gpudirect_rdma": True})
    assert set(paths_of(lines)) == {"gpu_availability_zone", "ray.ray_version",
                                    "cluster.worker_groups.0.gpudirect_rdma"}


def test_load_config_raises_typed_error(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(write_variant(tmp_path, {"job": {"max_steps": 0}}))
    assert [p.path for p in info.value.problems] == ["job.max_steps"]


@pytest.mark.slow
def test_cli_subprocess_exit_code_and_no_traceback(tmp_path):
    path = write_variant(tmp_path, group={"instance_type": "x9.large"})
    proc = subprocess.run([sys.executable, "-m", "config", "check", str(path)], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"{path}: cluster.worker_groups.0.instance_type: unknown instance type 'x9.large'")
    assert "; config/instances.yaml lists GPU types " in line
    assert "g6.12xlarge" in line and "m7i.xlarge" not in line and "Traceback" not in proc.stderr


# ---- docs/reference.md ----------------------------------------------------------------------


def test_reference_page_table_is_current():
    from config.reference import TARGET, reference_table, table_in

    current = table_in(REPO / TARGET)
    assert current is not None, f"{TARGET} lacks the field reference markers"
    assert current == reference_table(), "stale: run `python -m config reference --write`"


@pytest.mark.parametrize("path", [REPO / "config" / "cluster.yaml", *EXAMPLE_FILES], ids=lambda p: p.stem)
def test_every_field_in_shipped_files_is_commented(path):
    import re

    bare = [line for line in path.read_text().splitlines()
            if re.match(r"^\s*(- )?[a-z_]+:\s*\S", line) and "#" not in line]
    assert bare == [], f"{path.name}: comment these fields: {bare}"


def test_kubernetes_minor_without_an_autoscaler_pin_is_refused(tmp_path, monkeypatch):
    import config.versions as versions

    monkeypatch.setattr(versions, "CLUSTER_AUTOSCALER_CHARTS", {"1.33": ("9.50.1", "v1.33.0")})
    lines = refused(tmp_path)
    assert paths_of(lines) == ["cluster.kubernetes_version"]
    assert "no Cluster Autoscaler chart is pinned for Kubernetes 1.34 (pinned: 1.33)" in lines[0]
    assert load_variant(tmp_path, {"autoscaling": {"enabled": False}}).autoscaling.enabled is False


def test_every_pinned_autoscaler_minor_has_a_chart_and_image():
    from stacks.versions import CLUSTER_AUTOSCALER_CHARTS, cluster_autoscaler

    assert load_config().cluster.kubernetes_version in CLUSTER_AUTOSCALER_CHARTS
    for minor, (chart, image) in CLUSTER_AUTOSCALER_CHARTS.items():
        pin, tag = cluster_autoscaler(minor)
        assert (pin.version, tag) == (chart, image) and tag.startswith(f"v{minor}.")
