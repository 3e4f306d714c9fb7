"""Logical GPUs (`WorkerGroup.logical_gpus`): a lab's CPU nodes counted as GPU nodes, and nothing else.

The lab variable file of `make cluster-real` (tests/fixtures/cluster-real.yaml) puts two Ray Train workers on two
CPU "GPU nodes"; the same setting on a GPU instance type is refused, naming the file, the field and the fix."""

from __future__ import annotations

import subprocess
import sys

import pytest

from config import ConfigError, load_config
from config.topology import LOGICAL_GPU_RESOURCE
from tests.helpers import DEFAULT_FILE, REPO

LAB_FILE = REPO / "tests" / "fixtures" / "cluster-real.yaml"


def test_the_lab_file_has_two_workers_on_logical_gpus():
    config = load_config(LAB_FILE)
    group = config.cluster.worker_groups[0]
    assert config.uses_logical_gpus
    assert config.instance(group).gpus == group.logical_gpus == 1
    assert config.world_size == 2 and config.pods(group) == 2
    assert config.pod_resources[group.name].gpus == 1  # the pods ask the node for nvidia.com/gpu: 1


def test_logical_gpus_train_on_cpu_with_gloo_pinned_to_the_worker_pods():
    from workloads.fsdp_finetune.run_plan import cluster_plan
    from workloads.fsdp_finetune.trainer import build_trainer

    config = load_config(LAB_FILE)
    plan = cluster_plan(config, bucket="b")
    assert plan.use_gpu is False and plan.logical_gpus and plan.gpu_peak_tflops is None
    trainer = build_trainer(plan)
    assert trainer.backend_config.backend == "gloo"
    assert trainer.scaling_config.resources_per_worker == {"CPU": config.cpus_per_worker, LOGICAL_GPU_RESOURCE: 1}


def test_the_worker_pods_hold_the_logical_gpu_resource():
    from charts import bundle
    from charts.ray import worker_group

    config = load_config(LAB_FILE)
    code = bundle.collect(LAB_FILE, runtime_env_json="{}", config=config)
    spec = worker_group(config, config.cluster.worker_groups[0], code)
    assert spec.ray_start_params["resources"] == "'{\"logical_gpu\": 1}'"


def test_a_gpu_instance_type_refuses_logical_gpus(tmp_path):
    text = DEFAULT_FILE.read_text().replace("      gpus_per_pod: 4", "      gpus_per_pod: 4\n      logical_gpus: 4", 1)
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert str(path) in message
    assert ("cluster.worker_groups.0.logical_gpus: g6.12xlarge has 4 real GPU(s); logical GPUs stand in for GPUs "
            "only on a CPU instance type") in message
    assert "remove logical_gpus" in message


def test_config_check_refuses_it_with_a_non_zero_exit(tmp_path):
    text = DEFAULT_FILE.read_text().replace("      gpus_per_pod: 4", "      gpus_per_pod: 4\n      logical_gpus: 4", 1)
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    result = subprocess.run([sys.executable, "-m", "config", "check", str(path)], capture_output=True, text=True,
                            cwd=REPO, timeout=60)
    assert result.returncode != 0
    assert "logical_gpus" in result.stderr and "remove logical_gpus" in result.stderr


def test_without_logical_gpus_a_cpu_instance_type_is_still_refused(tmp_path):
    text = LAB_FILE.read_text().replace("      logical_gpus: 1", "", 1)
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "m7i.xlarge has no GPU" in str(info.value)
