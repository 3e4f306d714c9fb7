"""Bad job settings are refused in the driver, naming the field, before Ray or any worker starts."""

from __future__ import annotations

import pytest

from config.errors import run_cli
from tests.helpers import write_variant
from workloads.fsdp_finetune.launch import main
from workloads.fsdp_finetune.local_assets import prepare_local_assets
from workloads.fsdp_finetune.run_plan import local_job
from workloads.fsdp_finetune.settings import LOCAL_SOURCE, validate_job


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return prepare_local_assets(tmp_path_factory.mktemp("assets"))


def _refused(tmp_path, capsys, overrides: dict, *extra: str) -> str:
    import ray

    path = write_variant(tmp_path, {"job": overrides})
    with pytest.raises(SystemExit) as exc:
        run_cli(main, ["--config", str(path), "--storage-path", str(tmp_path / "storage"), *extra])
    assert exc.value.code == 2
    assert not ray.is_initialized()  # refused before any cluster (and so any worker) started
    assert not (tmp_path / "storage").exists()
    return capsys.readouterr().err


@pytest.mark.parametrize("field", ["micro_batch_size", "seq_len", "global_batch_size", "max_steps"])
@pytest.mark.parametrize("value", [0, -4])
def test_zero_or_negative_sizes(tmp_path, capsys, field, value):
    err = _refused(tmp_path, capsys, {field: value})
    assert f"cluster.yaml: job.{field}:" in err


def test_missing_dataset_path(tmp_path, capsys):
    err = _refused(tmp_path, capsys, {"dataset": str(tmp_path / "missing" / "train.jsonl")})
    assert "job.dataset:" in err and "does not exist" in err


def test_field_missing_from_dataset(tmp_path, capsys, assets):
    err = _refused(tmp_path, capsys, {"dataset": str(assets.dataset_path), "instruction_field": "question"})
    assert "job.instruction_field:" in err and "question" in err
    err = _refused(tmp_path, capsys, {"dataset": str(assets.dataset_path), "instruction_field": "instruction",
                                      "response_field": "output"})
    assert "job.response_field:" in err


def test_batch_that_cannot_be_split_across_cluster_ranks(tmp_path, capsys):
    # Default file: 8 workers; 8 x 4 = 32 does not divide 48.
    err = _refused(tmp_path, capsys, {"global_batch_size": 48})
    assert "job.global_batch_size:" in err and "32" in err


def test_bad_max_steps_flag(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        run_cli(main, ["--local", "--output-dir", str(tmp_path / "out"), "--max-steps", "0"])
    assert exc.value.code == 2
    assert "job.max_steps" in capsys.readouterr().err


def test_local_world_size_is_rechecked(assets):
    """The loader checks the split for the cluster's world size; locally there are 2 workers."""
    good = local_job(assets)
    assert validate_job(good, world_size=2, source=LOCAL_SOURCE) == []
    bad = local_job(assets, micro_batch_size=4, global_batch_size=12)
    problems = validate_job(bad, world_size=2, source=LOCAL_SOURCE)
    assert [p.field for p in problems] == ["global_batch_size"]
    assert str(problems[0]).startswith("local job: job.global_batch_size: 12 is not a multiple of")
    # The same batch splits fine on one worker of 4 x 3: the check is per world size.
    assert validate_job(bad, world_size=3, source=LOCAL_SOURCE) == []


@pytest.mark.slow
def test_collective_timeout_and_tracking_reach_the_trainer(assets, tmp_path):
    """job.collective_timeout_minutes becomes TorchConfig's timeout; a cluster run's folder is by its checkpoints."""
    from config import load_config
    from workloads.fsdp_finetune.run_plan import cluster_plan, local_plan
    from workloads.fsdp_finetune.trainer import build_trainer

    plan, _ = local_plan(tmp_path / "out", assets_dir=assets.model_dir.parent, collective_timeout_minutes=2.5)
    trainer = build_trainer(plan)
    assert trainer.backend_config.timeout_s == 150
    loop = trainer.train_loop_config
    assert loop["run_dir"] == str((tmp_path / "out").resolve()) and loop["driver_progress"] is True
    assert loop["eval_records"] == plan.eval_records and loop["eval_records"]
    config = load_config(write_variant(tmp_path, {"job": {"run_name": "r1"}}))
    cluster = cluster_plan(config, storage_path="s3://bucket/prefix/checkpoints")
    assert cluster.run_dir == "s3://bucket/prefix/checkpoints/r1"
    trainer = build_trainer(cluster)
    assert trainer.backend_config.timeout_s == 600  # the default, 10 minutes
    # Ray's storage is pyarrow's S3 filesystem in the file's region, built without asking S3 where the bucket is.
    assert trainer.run_config.storage_filesystem.region == config.region
    assert trainer.run_config.storage_path == "bucket/prefix/checkpoints"
