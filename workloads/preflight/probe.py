"""Collective bandwidth probe: all-reduce and all-gather timed like nccl-tests.

nccl-tests reports, per message size, the algorithm bandwidth (bytes / time) and the bus
bandwidth, which corrects for how much each rank must move so that it is comparable with the
link speed: all-reduce moves 2(n-1)/n of the buffer per rank, all-gather (n-1)/n of the output.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from workloads.preflight.checks import CheckResult, failed, passed, skipped

MIB = 1 << 20
GIB = 1 << 30
DEFAULT_MIN_SIZE = MIB
DEFAULT_MAX_SIZE = GIB
LOCAL_MAX_SIZE = 16 * MIB
# Share of the catalog's nominal network bandwidth the all-reduce bus bandwidth must reach at
# the largest size on a multi-node EFA run. EFA on g6.12xlarge (40 Gbit/s, one interface, no
# GPUDirect RDMA: data is staged through host memory) measures well above this; TCP sockets
# over the same ENA link usually do not, and a hang-prone misconfiguration lands far below.
FLOOR_FRACTION = 0.25
# Below this, collectives are latency-bound and say nothing about the link: no floor applied.
FLOOR_MIN_SIZE = 64 * MIB
OPS = ("all_reduce", "all_gather")


@dataclass(frozen=True, kw_only=True)
class BandwidthRow:
    """One probe measurement: op, message size (nccl-tests' `size`), mean time and bandwidths."""

    op: str
    size_bytes: int
    time_us: float
    algbw_gbs: float
    """Algorithm bandwidth, GB/s (10^9 bytes per second, as nccl-tests)."""
    busbw_gbs: float
    """Bus bandwidth, GB/s."""

    def to_dict(self) -> dict:
        """JSON-friendly form."""
        return asdict(self)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor for `op` over `n` ranks."""
    if n <= 1:
        return 0.0
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op == "all_gather":
        return (n - 1) / n
    raise ValueError(f"unknown collective {op!r}")


def bandwidth(op: str, size_bytes: int, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for `size_bytes` moved by `op` over `n` ranks in `seconds`."""
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * bus_factor(op, n)


def sizes(min_size: int = DEFAULT_MIN_SIZE, max_size: int = DEFAULT_MAX_SIZE, *, cap: int | None = None,
          multiple: int = 4) -> list[int]:
    """Message sizes doubling from `min_size` to `max_size` (capped by `cap`), each a multiple of `multiple`."""
    top = min(max_size, cap) if cap else max_size
    out: list[int] = []
    size = min_size
    while size <= top:
        out.append(size - size % multiple)
        size *= 2
    return out or [min_size - min_size % multiple]


def memory_cap(free_bytes: int, workers_sharing: int) -> int:
    """Largest message size that fits: an all-gather holds input plus output (about 2x size) per worker,
    with head-room for the allocator, so a quarter of the free memory per worker sharing it."""
    return max(MIB, free_bytes // (4 * max(1, workers_sharing)))


def floor_gbs(network_gbps: float) -> float:
    """All-reduce bus-bandwidth floor, GB/s, from the catalog's nominal network figure (Gbit/s)."""
    return network_gbps / 8 * FLOOR_FRACTION


def check_floor(rows: list[BandwidthRow], *, floor: float | None, hosts: int, expect: str | None) -> CheckResult:
    """With EFA expected across >= 2 nodes (`hosts` counts distinct nodes), all-reduce busbw at the largest size
    reaches the floor."""
    name = "busbw-floor"
    if expect != "efa" or floor is None:
        return skipped(name, "floor applies only when EFA is expected")
    if hosts < 2:
        return skipped(name, f"single node ({hosts}): the network is not crossed")
    reduce_rows = [r for r in rows if r.op == "all_reduce"]
    if not reduce_rows:
        return skipped(name, "no all-reduce measurement")
    top = max(reduce_rows, key=lambda r: r.size_bytes)
    if top.size_bytes < FLOOR_MIN_SIZE:
        return skipped(name, f"largest size {top.size_bytes // MIB} MiB < {FLOOR_MIN_SIZE // MIB} MiB (latency-bound)")
    if top.busbw_gbs >= floor:
        return passed(name, f"all_reduce busbw {top.busbw_gbs:.2f} GB/s at {top.size_bytes // MIB} MiB "
                      f">= floor {floor:.2f} GB/s")
    return failed(name, f"all_reduce busbw {top.busbw_gbs:.2f} GB/s at {top.size_bytes // MIB} MiB is below the "
                  f"floor {floor:.2f} GB/s ({FLOOR_FRACTION:.0%} of the instance's nominal network)",
                  "check the NCCL network line (sockets?), that all GPU nodes share the cluster placement group "
                  "(gpu_availability_zone), and FI_EFA_* / NCCL_* overrides in the worker env")


def run_collectives(size_list: list[int], *, device, warmup: int = 2, iters: int = 5) -> list[BandwidthRow]:
    """Time all-reduce and all-gather on the default process group; every rank must call this.

    Times are the slowest rank's mean over `iters` (after `warmup`), as a collective ends when its
    last rank does.
    """
    import torch
    import torch.distributed as dist

    n = dist.get_world_size()
    cuda = device.type == "cuda"
    # Newer torch (2.13 here) deprecates all_gather_into_tensor for all_gather_single; older images lack the latter.
    gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    rows: list[BandwidthRow] = []

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    for size in size_list:
        for op in OPS:
            numel = size // 4
            if op == "all_reduce":
                buf = torch.ones(numel, dtype=torch.float32, device=device)
                call = lambda buf=buf: dist.all_reduce(buf)  # noqa: E731
            else:
                numel -= numel % n
                shard = torch.ones(numel // n, dtype=torch.float32, device=device)
                out = torch.empty(numel, dtype=torch.float32, device=device)
                call = lambda out=out, shard=shard: gather_into(out, shard)  # noqa: E731
            for _ in range(warmup):
                call()
            sync()
            dist.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                call()
            sync()
            elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            seconds = float(elapsed.item())
            moved = numel * 4
            algbw, busbw = bandwidth(op, moved, seconds, n)
            rows.append(BandwidthRow(op=op, size_bytes=moved, time_us=seconds * 1e6, algbw_gbs=algbw,
                                     busbw_gbs=busbw))
            del call
            if cuda:
                torch.cuda.empty_cache()
    return rows
