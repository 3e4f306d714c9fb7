"""What could work instead, when the job does not fit: each change planned the same way, with its peak and cost.

In the order a user would try them, cheapest to the job first: full sharding (same hardware, state spread
over every GPU), more nodes (twice the GPUs, fully sharded), LoRA instead of a full fine-tune (same hardware,
the file's job.lora; with full sharding too when the file shards hybrid; offered when the persistent state is
at least half the limit), a bigger GPU from the catalog (the cheapest
per GPU-hour among those with more memory), then a smaller micro-batch or
sequence (which changes the job itself). Each candidate is a whole variable file that the loader accepts
(a change it would refuse is not offered), planned without counting FLOPs again where they cannot change.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator

from config.catalog import load_catalog
from config.model import ClusterConfig


def _load(data: dict) -> ClusterConfig | None:
    """`data` as a variable file the loader accepts, else None."""
    try:
        config = ClusterConfig.model_validate(data)
    except ValueError:
        return None
    return None if config.cross_field_problems() else config


def _fit_batch(data: dict, world: int) -> None:
    """Raise `job.global_batch_size` to the next multiple of micro-batch x world size (the loader's rule)."""
    job = data["job"]
    unit = job["micro_batch_size"] * world
    job["global_batch_size"] = max(unit, math.ceil(job["global_batch_size"] / unit) * unit)


def candidates(config: ClusterConfig, plan: dict) -> Iterator[tuple[str, ClusterConfig, bool]]:
    """(what to change, the changed file, whether the per-micro-batch FLOPs still hold) in the order to try."""
    base = config.model_dump(mode="json", exclude_none=False)
    groups = base["cluster"]["worker_groups"]
    if plan["sharding"] == "hybrid":
        data = copy.deepcopy(base)
        data["job"]["sharding"] = "full"
        if (changed := _load(data)) is not None:
            yield "job.sharding: full", changed, True

    # More nodes help memory only as far as the state is sharded over them: with full sharding, as tried above.
    data = copy.deepcopy(base)
    if plan["sharding"] == "hybrid":
        data["job"]["sharding"] = "full"
    for group in data["cluster"]["worker_groups"]:
        group["nodes"] *= 2
        if group.get("max_nodes") is not None:
            group["max_nodes"] = max(group["max_nodes"], group["nodes"])
    _fit_batch(data, 2 * config.world_size)
    if (changed := _load(data)) is not None:
        nodes = ", ".join(f"{g['name']}: {g['nodes']}" for g in data["cluster"]["worker_groups"])
        full = ", job.sharding: full" if plan["sharding"] == "hybrid" else ""
        yield f"nodes ({nodes}){full}; job.global_batch_size: {data['job']['global_batch_size']}", changed, True

    # LoRA on the same hardware (`job.method: lora`): the base frozen in bf16 and only adapters trained, which is
    # what puts a model whose full fine-tune needs twice the GPUs on these ones. Its FLOPs differ (no weight
    # gradients for the frozen base), so they are counted again.
    # Offered when the persistent state is what does not fit (at least half the limit): where activations are the
    # problem, frozen weights barely help, and each LoRA candidate costs simulated steps of its own.
    if plan.get("method", "full") == "full" and plan.get("state_gib_per_gpu", 0) * 2 >= plan.get("limit_gib", 0):
        rank = base["job"]["lora"]["rank"]
        tries = [("", {})] + ([(", job.sharding: full", {"sharding": "full"})] if plan["sharding"] == "hybrid" else [])
        for extra, update in tries:
            data = copy.deepcopy(base)
            data["job"].update(method="lora", **update)
            if (changed := _load(data)) is not None:
                yield f"job.method: lora (job.lora.rank: {rank}){extra}", changed, False

    catalog = load_catalog()
    current = min(config.instance(g).gpu_visible_memory_mib for g in config.cluster.worker_groups)
    efa = config.nccl.transport == "efa"
    # The cheapest GPU-hour among GPUs with more memory (not the next size up: an A100-40GB node costs more per
    # GPU than an L40S one with more memory).
    bigger = sorted((t.usd_per_hour / t.gpus, t.gpu_visible_memory_mib, name) for name, t in catalog.instances.items()
                    if t.gpus and t.gpu_visible_memory_mib > current and (t.efa_interfaces > 0 or not efa))
    for _, _, name in bigger:
        itype = catalog.instances[name]
        data = copy.deepcopy(base)
        data["cluster"]["worker_groups"] = [copy.deepcopy(groups[0])]
        group = data["cluster"]["worker_groups"][0]
        group.update(instance_type=name, gpus_per_pod=itype.gpus, gpudirect_rdma=itype.gpudirect_rdma,
                     nodes=max(1, math.ceil(config.world_size / itype.gpus)))
        group["max_nodes"] = None if group.get("max_nodes") is None else max(group["max_nodes"], group["nodes"])
        _fit_batch(data, group["nodes"] * itype.gpus)
        if (changed := _load(data)) is not None:
            yield (f"instance_type: {name} ({itype.gpus} x {itype.gpu_model}, {itype.gpu_visible_memory_mib / 1024:.0f}"
                   f" GiB), {group['nodes']} node(s); job.global_batch_size: {data['job']['global_batch_size']}"),\
                changed, True
            break

    best, seq = plan.get("largest_micro_batch", 0), plan.get("largest_seq_len", 0)
    data = copy.deepcopy(base)
    if best:
        data["job"]["micro_batch_size"] = best
    elif seq:
        data["job"].update(micro_batch_size=1, seq_len=seq)
    else:
        return
    _fit_batch(data, config.world_size)
    if (changed := _load(data)) is not None:
        what = (f"job.micro_batch_size: {best}" if best else f"job.micro_batch_size: 1, job.seq_len: {seq}")
        yield f"{what}; job.global_batch_size: {data['job']['global_batch_size']}", changed, False


def suggest(config: ClusterConfig, plan: dict, **plan_kwargs) -> list[dict]:
    """Each candidate's change, predicted peak against its limit, and cost (`make_plan` figures)."""
    from workloads.plan import PlanRefusal, make_plan

    out = []
    lora_flops = None  # LoRA's FLOPs per micro-batch depend on the model and micro-batch, not on the sharding
    for change, changed, same_flops in candidates(config, plan):
        flops = tuple(plan["flops_per_micro_batch"]) if same_flops and "flops_per_micro_batch" in plan else None
        lora = change.startswith("job.method: lora")
        if lora:
            flops = lora_flops
        try:
            # LoRA is the one change that may fit only with a smaller micro-batch too: that is searched for
            # (not shorter sequences, which change the data).
            result = make_plan(changed, flops=flops, search_smaller="micro_batch" if lora else False, **plan_kwargs)
        except PlanRefusal as refusal:
            result = refusal.plan
            if lora and not result.get("state_exceeds_limit"):
                lora_flops = tuple(result["flops_per_micro_batch"])
            if lora and result.get("largest_micro_batch", 0):
                change, result = _lora_smaller_batch(changed, change, result, **plan_kwargs)
        else:
            if lora:
                lora_flops = tuple(result["flops_per_micro_batch"])
        out.append({"change": change, "fits": result["fits"], "peak_gib_per_gpu": result["peak_gib_per_gpu"],
                    "limit_gib": result["limit_gib"], "cost_per_hour_usd": result["cost_per_hour_usd"],
                    "run_hours": result["run_hours"], "run_cost_usd": result["run_cost_usd"]})
    return out


def render(suggestions: list[dict]) -> str:
    """The suggestions as lines under the plan, best-first as tried."""
    if not suggestions:
        return "  nothing in the catalog makes this job fit; use a smaller model"
    lines = ["  what would fit instead (each planned the same way; first that fits is the least change):"]
    for s in suggestions:
        verdict = "fits" if s["fits"] else "does not fit"
        lines.append(f"    {s['change']}: peak {s['peak_gib_per_gpu']:.1f} of {s['limit_gib']:.1f} GiB, {verdict}; "
                     f"{s['run_hours']:.2f} h, ${s['run_cost_usd']:,.2f} (${s['cost_per_hour_usd']:.2f}/h)")
    return "\n".join(lines)


def _lora_smaller_batch(config: ClusterConfig, change: str, refused: dict, **plan_kwargs) -> tuple[str, dict]:
    """A LoRA candidate at the largest micro-batch its plan found to fit, planned again (the global batch rounded
    up as the loader requires). FLOPs per sequence do not depend on the micro-batch, so they are scaled, not
    counted again."""
    from workloads.plan import PlanRefusal, make_plan

    best = refused["largest_micro_batch"]
    data = config.model_dump(mode="json", exclude_none=False)
    data["job"]["micro_batch_size"] = best
    _fit_batch(data, config.world_size)
    changed = _load(data)
    if changed is None:
        return change, refused
    scale = best / refused["micro_batch_size"]
    flops = tuple(f * scale for f in refused["flops_per_micro_batch"])
    try:
        result = make_plan(changed, flops=flops, search_smaller=False, **plan_kwargs)
    except PlanRefusal as refusal:
        result = refusal.plan
    return (f"{change}, job.micro_batch_size: {best}; job.global_batch_size: {data['job']['global_batch_size']}",
            result)
