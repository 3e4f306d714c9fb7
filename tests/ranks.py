"""Run a function on N local gloo ranks (torch.multiprocessing.spawn), with no port and a clean end.

* Rendezvous through a FileStore in a fresh folder (`init_method="file://..."`), not a TCP port picked
  by binding port 0 and releasing it: another process (a parallel test, another checkout's suite) can
  take a released port before rank 0 binds it, and a rank can then join the wrong group. gloo's own
  pair sockets bind port 0 and keep it.
* The ranks meet at a barrier before the group is destroyed, so no rank tears down its connections
  while a peer still has a collective in flight.
* A rank then leaves with `os._exit(0)`, skipping interpreter finalization. torch 2.13 keeps the
  gloo ProcessGroup alive after `destroy_process_group()` (FSDP's `FSDPMeshInfo` holds it, and a
  reference remains after the model is freed), so its C++ worker threads would otherwise be torn
  down by a finalizing interpreter; a thread that needs the GIL then ends in std::terminate
  ("terminate called without an active exception", SIGABRT), as pytorch/pytorch#179291 describes.
  What a rank returns must go to a file (as the tests do) before the function returns.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable
from pathlib import Path


def _entry(rank: int, fn: Callable, world: int, store: str, args: tuple) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    gc.collect()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn_gloo(fn: Callable, world: int, workdir: Path, *args) -> None:
    """Run `fn(rank, world, *args)` on `world` spawned processes in one gloo group; raise if a rank fails.

    `workdir` holds the FileStore; it must be fresh (a pytest tmp folder): a store file left by an
    earlier group would be read as this group's.
    """
    import torch.multiprocessing as mp

    store = Path(workdir) / "gloo-store"
    if store.exists():
        raise FileExistsError(f"{store} exists: spawn_gloo needs a fresh folder")
    mp.spawn(_entry, args=(fn, world, str(store), args), nprocs=world, join=True)
