"""Count the bytes of every collective a piece of code really issues, by process group.

`CollectiveCounter` is a `TorchDispatchMode`: every `torch.distributed` collective (FSDP2's
all-gathers and reduce-scatters, the all-reduces of `train_step`, DTensor's functional
collectives) goes through the dispatcher as a `c10d` or `_c10d_functional` op, so the mode sees
each call with its tensors and its process group, and lets it run unchanged. Each call is
recorded with the group's global ranks, its payload (the full, gathered or unreduced, tensor) and
the bytes one rank sends in a ring implementation (`topology.ring_bytes`), and classed by whether
the group spans nodes (`node_of(rank)`). Used by `bench/comm_volume.py` and its tests.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from workloads.fsdp_finetune.topology import ring_bytes


@dataclass(frozen=True, kw_only=True)
class Collective:
    """One collective call as this rank issued it."""

    op: str
    kind: str
    """all_gather, reduce_scatter, all_reduce, broadcast or other."""
    ranks: tuple[int, ...]
    """Global ranks of its process group."""
    payload_bytes: int
    """The full tensor: gathered output, unreduced input, or the all-reduced tensor."""
    ring_bytes: int
    """Bytes this rank sends under a ring algorithm."""
    cross_node: bool


def _nbytes(tensors) -> int:
    if isinstance(tensors, torch.Tensor):
        return tensors.numel() * tensors.element_size()
    return sum(_nbytes(t) for t in tensors)


# op name -> (kind, index of the argument whose size is the payload, multiplier argument index or None)
_C10D_OPS = {
    "_allgather_base_": ("all_gather", 0),
    "allgather_": ("all_gather", 0),
    "allgather_coalesced_": ("all_gather", 0),
    "allgather_into_tensor_coalesced_": ("all_gather", 0),
    "_reduce_scatter_base_": ("reduce_scatter", 1),
    "reduce_scatter_": ("reduce_scatter", 1),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
    "allreduce_": ("all_reduce", 0),
    "allreduce_coalesced_": ("all_reduce", 0),
    "broadcast_": ("broadcast", 0),
}
_FUNCOL_OPS = {
    "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_reduce_coalesced_": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast": "broadcast",
    "broadcast_": "broadcast",
}


def _group_ranks(group) -> tuple[int, ...]:
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    if isinstance(group, str):
        group = _resolve_process_group(group)
    elif isinstance(group, torch.ScriptObject):
        group = dist.ProcessGroup.unbox(group)
    return tuple(dist.get_process_group_ranks(group))


class CollectiveCounter(TorchDispatchMode):
    """Records every collective issued under it (`with CollectiveCounter(node_of) as counter: ...`)."""

    def __init__(self, node_of: Callable[[int], object]):
        super().__init__()
        self.node_of = node_of
        self.calls: list[Collective] = []
        self.enabled = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.enabled and func.namespace in ("c10d", "_c10d_functional", "c10d_functional"):
            self._record(func, args)
        return func(*args, **kwargs)

    def _record(self, func, args) -> None:
        name = func._schema.name.split("::")[-1]
        if func.namespace == "c10d" and name in _C10D_OPS:
            kind, index = _C10D_OPS[name]
            payload = _nbytes(args[index][0] if name == "reduce_scatter_" else args[index])
            group = next(a for a in args if isinstance(a, torch.ScriptObject))
        elif func.namespace != "c10d" and name in _FUNCOL_OPS:
            kind = _FUNCOL_OPS[name]
            payload = _nbytes(args[0])
            if kind == "all_gather":
                payload *= int(args[1])  # (input, group_size, group_name)
            group = args[-1]
        else:
            return  # barriers, point-to-point and waits carry no payload of their own
        ranks = _group_ranks(group)
        cross = len({self.node_of(r) for r in ranks}) > 1
        self.calls.append(Collective(op=name, kind=kind, ranks=ranks, payload_bytes=payload,
                                     ring_bytes=ring_bytes(kind, size_bytes=payload, group_size=len(ranks)),
                                     cross_node=cross))

    def table(self) -> list[dict]:
        """One row per (kind, group): calls, payload and ring bytes, whether the group spans nodes."""
        rows: dict[tuple, dict] = defaultdict(lambda: {"calls": 0, "payload_bytes": 0, "ring_bytes": 0})
        for call in self.calls:
            row = rows[(call.kind, call.ranks, call.cross_node)]
            row["calls"] += 1
            row["payload_bytes"] += call.payload_bytes
            row["ring_bytes"] += call.ring_bytes
        return [{"kind": kind, "ranks": list(ranks), "cross_node": cross, **row}
                for (kind, ranks, cross), row in sorted(rows.items(), key=lambda kv: (not kv[0][2], kv[0][0]))]
