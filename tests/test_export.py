"""The end-of-run export: rank 0 writes, the other ranks do not wait for it in a collective.

Every collective of the run's process group fails after `job.collective_timeout_minutes` (gloo's and NCCL's
timeout, `TorchConfig(timeout_s=...)`). A barrier after rank 0's write would fail a finished run whose export
(gather to CPU, safetensors, upload to S3) takes longer than that, and the retry would resume at `max_steps`,
export again and fail again. Nothing collective follows the export, and Ray Train ends the run only once every
worker's function has returned (ray 2.58.0 train/v2 controller), so rank 0's write is never cut short.

Shown deterministically: rank 0's copy to the destination waits until rank 1 has returned from
`export_hf_model`; a barrier there would leave both waiting until rank 0's bounded wait gives up.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from tests.ranks import spawn_gloo
from workloads.fsdp_finetune.local_assets import prepare_local_assets

pytestmark = pytest.mark.slow  # spawns ranks: `make check` leaves it out

WAIT_S = 60.0


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    # Same place and arguments as test_data: one build per session, reused (idempotent).
    return prepare_local_assets(tmp_path_factory.getbasetemp() / "local-assets", seed=0, n_train=400, n_eval=16)


def _export_rank(rank: int, world: int, model_dir: str, out: str) -> None:
    from transformers import AutoTokenizer

    from workloads.fsdp_finetune import checkpoint
    from workloads.fsdp_finetune.model import build_model

    returned = Path(out) / "rank1-returned"
    if rank == 0:
        copy = checkpoint.copy_tree

        def slow_copy(local_dir: str, destination: str) -> None:
            deadline = time.monotonic() + WAIT_S
            while not returned.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            (Path(out) / "rank0-saw-rank1-return").write_text(str(returned.exists()))
            copy(local_dir, destination)

        checkpoint.copy_tree = slow_copy
    model = build_model(model_dir, attn_implementation="sdpa", device=torch.device("cpu"))
    checkpoint.export_hf_model(model, AutoTokenizer.from_pretrained(model_dir), os.path.join(out, "export"))
    if rank == 1:
        returned.touch()


def test_other_ranks_return_while_rank_0_still_writes_the_export(assets, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    spawn_gloo(_export_rank, 2, tmp_path, str(assets.model_dir), str(out))
    assert (out / "rank0-saw-rank1-return").read_text() == "True"
    assert (out / "export" / "model.safetensors").is_file()
