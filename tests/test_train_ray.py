"""The workload end to end on a real local Ray cluster: 2 CPU workers, FSDP2 over gloo, real checkpoints.

Runs are shared across assertions to keep the module to a few minutes on two cores:

* `reference`: uninterrupted (conftest `reference_run`, the session's one unbroken run of `harness.driver_run.JOB`,
  the reference of every failure path); learning, metrics, export and logits are checked on it here.
* `fault`: the last worker kills itself once mid-run; FailureConfig restarts the group, which
  resumes from the latest checkpoint; the final weights must equal the reference's bit for bit.
* `abort`: the same kill with no restarts allowed makes `fit()` fail; a second `fit()` with the same
  name and storage resumes from the checkpoint and must also end with the reference's weights.
"""

from __future__ import annotations

import os

import pytest
import torch

ray = pytest.importorskip("ray")

from harness.driver_run import JOB  # noqa: E402
from workloads.fsdp_finetune.local_demo import evaluate_dir  # noqa: E402
from workloads.fsdp_finetune.metrics import read_metrics  # noqa: E402
from workloads.fsdp_finetune.run_plan import local_plan  # noqa: E402
from workloads.fsdp_finetune.train import checkpoint_staging_dir  # noqa: E402
from workloads.fsdp_finetune.train_hooks import KillOnceAt  # noqa: E402
from workloads.fsdp_finetune.trainer import run_training  # noqa: E402

pytestmark = pytest.mark.slow  # `make check` leaves this module out (pyproject.toml markers)



@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("train")


def _plan(root, assets_dir, name, **overrides):
    """The reference's job under another name, on the reference's model and data (`driver_assets`)."""
    plan, assets = local_plan(root / name, assets_dir=assets_dir, run_name=name, **{**JOB, **overrides})
    return plan, assets


def _weights(model_dir) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(os.path.join(model_dir, "model.safetensors"))


def _assert_same_weights(a: dict, b: dict):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"


@pytest.fixture(scope="module")
def reference(local_ray, reference_run):
    return reference_run


def test_loss_falls_and_held_out_score_improves(reference):
    plan, assets, _ = reference
    rows = read_metrics(plan.metrics_path)
    # The untrained model's held-out loss at step 0 (no training figures), then reports every 2 steps, with the
    # held-out loss every 4 and at the end.
    assert [r["step"] for r in rows] == [0, 2, 4, 6, 8, 10, 12]
    assert "loss" not in rows[0] and "eval_loss" in rows[0]
    records = rows[1:]
    assert [r["step"] for r in rows if "eval_loss" in r] == [0, 4, 8, 12]
    held_out = [r["eval_loss"] for r in rows if "eval_loss" in r]
    assert held_out[-1] < held_out[1] < held_out[0]
    assert all(r["eval_tokens"] == records[-1]["eval_tokens"] > 0 for r in rows if "eval_loss" in r)
    assert records[-1]["loss"] < 0.7 * records[0]["loss"]
    for key in ("lr", "grad_norm", "tokens_per_s", "tokens_per_s_per_gpu", "step_time_s"):
        assert records[-1][key] > 0, key
    assert records[-1]["mfu"] is None  # no meaningful peak on CPU
    before = evaluate_dir(assets.model_dir, assets.eval_records[:20], plan.job)
    after = evaluate_dir(plan.export_uri, assets.eval_records[:20], plan.job)
    assert after["loss"] < 0.7 * before["loss"]
    assert os.path.isfile(os.path.join(plan.export_uri, "model.safetensors"))


def test_run_folder_has_tensorboard_events_and_the_plot(reference):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    plan, _, _ = reference
    acc = EventAccumulator(plan.run_dir)
    acc.Reload()
    assert [e.step for e in acc.Scalars("eval/loss")] == [0, 4, 8, 12]  # the untrained model's at step 0
    assert [e.step for e in acc.Scalars("train/loss")] == [2, 4, 6, 8, 10, 12]
    assert os.path.isfile(os.path.join(plan.run_dir, "loss.png"))


def test_checkpoints_were_uploaded_in_the_background_and_their_local_copies_deleted(reference):
    import tempfile

    plan, _, result = reference
    run = os.path.join(plan.storage_path, plan.job.run_name)
    kept = sorted(d for d in os.listdir(run) if d.startswith("checkpoint_step_"))
    assert kept == ["checkpoint_step_0000008", "checkpoint_step_0000012"]  # keep_checkpoints=2
    for rank in range(2):
        staging = checkpoint_staging_dir(plan.job.run_name, plan.storage_path, rank)
        assert str(staging).startswith(tempfile.gettempdir())
        assert os.listdir(staging) == []  # every staged checkpoint was deleted once uploaded
    assert result.metrics["step"] == 12 and "eval_loss" in result.metrics  # the last report's figures


def test_export_reloads_with_the_trained_weights(reference):
    """The exported HF model gives the same logits as the final sharded checkpoint loaded into the model."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workloads.fsdp_finetune.checkpoint import tied_aliases

    plan, assets, result = reference
    exported = AutoModelForCausalLM.from_pretrained(plan.export_uri, dtype=torch.float32).eval()
    AutoTokenizer.from_pretrained(plan.export_uri)  # the tokenizer travels with the model
    trained = AutoModelForCausalLM.from_pretrained(assets.model_dir, dtype=torch.float32).eval()
    aliases = tied_aliases(trained)
    assert aliases == {"lm_head.weight": "model.embed_tokens.weight"}
    state = {"model": {k: v for k, v in trained.state_dict().items() if k not in aliases}}
    # The checkpoint's DCP shards, read without a process group (single-process load). The tied
    # weight is stored once: asking for its alias too would fail.
    dcp.load(state, checkpoint_id=result.checkpoint.path)
    assert trained.load_state_dict(state["model"], strict=False).missing_keys == ["lm_head.weight"]
    stored = dcp.FileSystemReader(result.checkpoint.path).read_metadata().state_dict_metadata
    assert "model.model.embed_tokens.weight" in stored and "model.lm_head.weight" not in stored
    # The export, too, holds the tied weight once, and reloads tied.
    assert "lm_head.weight" not in _weights(plan.export_uri)
    assert exported.lm_head.weight is exported.model.embed_tokens.weight
    assert result.checkpoint.path.endswith("checkpoint_step_0000012")
    ids = torch.randint(0, exported.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(exported(ids).logits, trained(ids).logits)
    # Training moved the weights away from the initial model.
    initial = AutoModelForCausalLM.from_pretrained(assets.model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        assert not torch.allclose(initial(ids).logits, trained(ids).logits)


def test_worker_killed_mid_run_is_restarted_and_resumes_exactly(reference, root, driver_assets):
    """Reports every step (faster than the controller polls): the restart still starts from the last checkpoint.

    Before checkpoints alone were reported to Ray, ten queued per-step reports kept checkpoint 8
    unregistered when the worker died at step 10, and the group restarted from step 4.
    """
    ref_plan, _, _ = reference
    marker = root / "fault.killed"
    plan, _ = _plan(root, driver_assets, "fault", max_failures=1, report_every=1)
    result = run_training(plan, hooks=KillOnceAt(10, str(marker)))
    assert result.error is None
    assert marker.read_text().startswith("killed at step 10")
    records = read_metrics(plan.metrics_path)
    assert [r["step"] for r in records] == list(range(13))  # step 0: held-out only; replayed steps not twice
    assert {r["resumed_from_step"] for r in records if r["step"] > 8} == {8}
    _assert_same_weights(_weights(plan.export_uri), _weights(ref_plan.export_uri))


def test_aborted_fit_rerun_with_same_name_resumes_exactly(reference, root, driver_assets):
    ref_plan, _, _ = reference
    marker = root / "abort.killed"
    plan, _ = _plan(root, driver_assets, "abort", max_failures=0)
    with pytest.raises(Exception):  # noqa: B017 - Ray's TrainingFailedError, whatever its module
        result = run_training(plan, hooks=KillOnceAt(10, str(marker)))
        if result.error:
            raise result.error
    assert marker.exists()
    assert not os.path.exists(plan.export_uri)
    # Same name, same storage: Ray finds the run's checkpoints and the workers resume from the last one
    # (step 8: only checkpoints are reported, so none waits in a queue behind metric reports).
    result = run_training(plan, hooks=KillOnceAt(10, str(marker)))
    assert result.error is None
    records = read_metrics(plan.metrics_path)
    assert [r["step"] for r in records] == [0, 2, 4, 6, 8, 10, 12]
    assert {r["resumed_from_step"] for r in records if r["step"] > 8} == {8}
    _assert_same_weights(_weights(plan.export_uri), _weights(ref_plan.export_uri))


def test_rerun_with_fewer_steps_is_refused_before_workers_start(reference):
    """The finished 12-step run has checkpoint_step_0000012 in storage: max_steps=8 under its name is refused."""
    from workloads.fsdp_finetune.settings import LOCAL_SOURCE, latest_checkpoint_step, resume_problem

    plan, _, _ = reference
    assert latest_checkpoint_step(plan.storage_path, plan.job.run_name) == 12
    assert resume_problem(plan, source=LOCAL_SOURCE) is None  # same max_steps: a rerun resumes and re-exports
    shorter = plan.job.model_copy(update={"max_steps": 8})
    problem = resume_problem(type(plan)(**{**plan.__dict__, "job": shorter}), source=LOCAL_SOURCE)
    assert problem is not None and problem.field == "max_steps"
    assert "step 12" in problem.message and "run_name" in problem.message
    # Another run name in the same storage has no checkpoint to conflict with.
    other = plan.job.model_copy(update={"max_steps": 8, "run_name": "fresh"})
    assert resume_problem(type(plan)(**{**plan.__dict__, "job": other}), source=LOCAL_SOURCE) is None
