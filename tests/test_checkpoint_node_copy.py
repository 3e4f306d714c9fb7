"""A resumed run's ranks on one node read one download of the checkpoint (`checkpoint.node_copy`).

Ray 2.58's `Checkpoint.as_directory` downloads again when a second rank of the node arrives after the first
download ended, rewriting the files the first rank is reading (the EC2 tier's resume failed so: DCP's `.metadata`
"Ran out of input"). Two real processes on a gloo process group, local ranks 0 and 1 of one node, the second a
second late; the checkpoint on a non-local pyarrow file system (a SubTreeFileSystem, so Ray downloads it)."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # two processes with a gloo process group

LATE_S = 1.0


def _rank(rank: int, port: int, checkpoint, how: str, out: str) -> None:
    import torch.distributed as dist

    from workloads.fsdp_finetune.checkpoint import node_copy

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    if rank == 1:
        time.sleep(LATE_S)  # arrives after local rank 0's download ended
    opened = node_copy(checkpoint, local_rank=rank) if how == "node_copy" else checkpoint.as_directory()
    with opened as folder:
        first = (Path(folder) / ".metadata").stat().st_mtime_ns
        if how != "node_copy":
            dist.barrier()  # rank 0 looks again once rank 1 is in too (node_copy has its own barrier)
        seen = {"folder": folder, "first": first, "again": (Path(folder) / ".metadata").stat().st_mtime_ns,
                "data": (Path(folder) / ".metadata").read_text()}
        if how != "node_copy":
            dist.barrier()
    seen["left"] = Path(folder).exists()
    Path(out, f"{rank}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()


def _run(tmp_path: Path, how: str) -> list[dict]:
    storage = tmp_path / "storage"
    (storage / "ckpt").mkdir(parents=True)
    (storage / "ckpt" / ".metadata").write_text("index")
    (storage / "ckpt" / "__0_0.distcp").write_bytes(os.urandom(4096))
    out = tmp_path / how
    out.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import pyarrow.fs
    from ray.train import Checkpoint

    # One object for both ranks, as Ray Train hands every worker the same checkpoint (one uuid, so one temp folder).
    checkpoint = Checkpoint("ckpt", filesystem=pyarrow.fs.SubTreeFileSystem(str(storage), pyarrow.fs.LocalFileSystem()))
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, port, checkpoint, how, str(out))) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0, f"rank process exited {p.exitcode}"
    return [json.loads((out / f"{r}.json").read_text()) for r in (0, 1)]


def test_ray_as_directory_downloads_again_under_a_reading_rank(tmp_path):
    """The upstream behaviour node_copy exists for: the late rank's download rewrites rank 0's open folder."""
    zero, one = _run(tmp_path, "as_directory")
    assert zero["folder"] == one["folder"]
    assert zero["again"] != zero["first"], "Ray no longer downloads twice: node_copy may go back to as_directory"


def test_node_copy_downloads_once_per_node_and_removes_it(tmp_path):
    zero, one = _run(tmp_path, "node_copy")
    assert zero["folder"] == one["folder"]
    assert zero["first"] == zero["again"] == one["first"], "the node's copy was written again while read"
    assert zero["data"] == one["data"] == "index"
    assert not zero["left"], "local rank 0 left the node's copy behind"


def test_a_checkpoint_on_a_local_file_system_is_read_in_place(tmp_path):
    import pyarrow.fs
    from ray.train import Checkpoint

    from workloads.fsdp_finetune.checkpoint import node_copy

    (tmp_path / "ckpt").mkdir()
    checkpoint = Checkpoint(str(tmp_path / "ckpt"), filesystem=pyarrow.fs.LocalFileSystem())
    with node_copy(checkpoint, local_rank=0) as folder:
        assert folder == str(tmp_path / "ckpt")
    assert (tmp_path / "ckpt").is_dir()
