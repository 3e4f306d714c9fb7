"""Run the preflight as a Ray Train job placed like the training workers, and build the report."""

from __future__ import annotations

import glob
import os
import sys
import tempfile
import time

from workloads.local_ray import LOCAL_WORKERS, start_local_ray
from workloads.preflight.checks import (
    CheckResult,
    Expectation,
    WorkerFacts,
    expectation,
    facts_dict,
    gather_facts,
    parse_meminfo,
    run_checks,
)
from workloads.preflight.nccl_log import check_network, parse_nccl_log
from workloads.preflight.probe import (
    DEFAULT_MAX_SIZE,
    DEFAULT_MIN_SIZE,
    LOCAL_MAX_SIZE,
    BandwidthRow,
    check_floor,
    floor_gbs,
    memory_cap,
    run_collectives,
)
from workloads.preflight.probe import sizes as doubling_sizes
from workloads.preflight.report import PreflightReport, WorkerReport

NCCL_LOG_PREFIX = "/tmp/nccl-preflight"
# Lines of the NCCL log that matter for the network decision; the rest stays on the worker.
_KEEP = ("NET/", "Using network", "NCCL version", "register", "fi_mr_reg", "ibv_reg_mr", "MEMLOCK", "fi_getinfo",
         "Failed to initialize")


def _collector():
    import ray

    @ray.remote(num_cpus=0)
    class Collector:
        """Holds rank 0's payload: Ray Train V2 keeps metrics only with a checkpoint, which needs shared storage."""

        def __init__(self):
            self.payload = None

        def put(self, payload):
            self.payload = payload

        def get(self):
            return self.payload

    return Collector.remote()


def _worker_loop(cfg: dict) -> None:
    """Runs on every Ray Train worker: gather facts, check, probe, gather the results on rank 0."""
    import ray.train
    import torch
    import torch.distributed as dist
    from ray.train.torch import get_device

    expect: Expectation = cfg["expect"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    nccl = dist.get_backend() == "nccl"
    if nccl:
        # Setting NCCL_* here, after init_process_group, still takes effect. Checked against torch 2.13:
        # Ray Train calls dist.init_process_group without device_id, so ProcessGroupNCCL initialises
        # lazily (distributed_c10d.init_process_group's device_id doc: bound device -> "ncclCommInit*
        # immediately rather than the normal lazy call"; ProcessGroupNCCL.hpp: eagerInit_ false,
        # getNCCLComm/initNCCLComm on first use). The gloo group below touches no NCCL, so the first NCCL
        # call that reads env (ncclGetUniqueId/ncclCommInitRank; NCCL's debug.cc reads NCCL_DEBUG and
        # NCCL_DEBUG_FILE lazily, on its first log line) comes with the first collective in the probe.
        # An image or launcher that binds device_id would break this: set these in the pod env instead.
        # The file is how we learn which network NCCL chose.
        os.environ["NCCL_DEBUG"] = "INFO"
        os.environ["NCCL_DEBUG_SUBSYS"] = "INIT,NET,ENV"
        os.environ["NCCL_DEBUG_FILE"] = f"{NCCL_LOG_PREFIX}.%h.%p.log"
    # Control traffic over gloo, so a broken NCCL/EFA setup cannot stop the check results reaching rank 0.
    ctrl = dist.new_group(backend="gloo")

    facts = gather_facts(efa=expect.efa)
    checks = run_checks(facts, expect, local=cfg["local"])
    everyone: list = [None] * world
    dist.all_gather_object(everyone, {"rank": rank, "facts": facts_dict(facts), "checks": checks}, group=ctrl)
    failing = sorted(w["rank"] for w in everyone if not all(c.ok for c in w["checks"]))

    rows: list[BandwidthRow] = []
    note = ""
    if failing:
        # A half-configured EFA path can hang NCCL rather than fail; stop at the checks.
        note = f"skipped: checks failed on rank(s) {', '.join(map(str, failing))}"
    else:
        device = get_device()
        if device.type == "cuda":
            free = torch.cuda.mem_get_info(device)[0]
            sharing = 1
        else:
            free = parse_meminfo(facts.meminfo).get("MemAvailable", 4 * 2**20) * 1024
            sharing = ctx.get_local_world_size()
        cap = torch.tensor([memory_cap(free, sharing)], dtype=torch.int64)
        dist.all_reduce(cap, op=dist.ReduceOp.MIN, group=ctrl)
        chosen = [s for s in cfg["sizes"] if s <= int(cap.item())] or cfg["sizes"][:1]
        if len(chosen) < len(cfg["sizes"]):
            note = f"sizes capped at {chosen[-1]} bytes by free memory"
        try:
            rows = run_collectives(chosen, device=device, warmup=cfg["warmup"], iters=cfg["iters"])
        except Exception as exc:  # noqa: BLE001 - a collective error is a finding, reported with the rest
            note = f"probe failed on rank {rank}: {type(exc).__name__}: {exc}"[:500]

    lines: list[str] = []
    if nccl:
        for path in glob.glob(f"{NCCL_LOG_PREFIX}.*.{os.getpid()}.log"):
            with open(path, errors="replace") as fh:
                lines += [line.rstrip() for line in fh if any(k in line for k in _KEEP)][:400]
    logs: list = [None] * world
    dist.all_gather_object(logs, {"rank": rank, "nccl": lines if nccl else None, "note": note}, group=ctrl)
    if rank == 0:
        cfg["collector"].put.remote({"workers": everyone, "logs": logs, "rows": rows, "note": note})


def _default_sizes(local: bool, max_size: int | None) -> list[int]:
    top = max_size or (LOCAL_MAX_SIZE if local else DEFAULT_MAX_SIZE)
    return doubling_sizes(DEFAULT_MIN_SIZE, max(top, DEFAULT_MIN_SIZE))


# Warm-up, then timed iterations per size (the default of `--iters`), as nccl-tests does.
WARMUP_ITERS = 2
TIMED_ITERS = 5


def run_preflight(config, *, local: bool, expect_transport: str | None = None,
                  max_size: int | None = None, iters: int = TIMED_ITERS) -> PreflightReport:
    """Run the per-worker checks and the collective probe as a Ray Train job; return the report.

    `local`: 2 CPU workers over gloo on the local (or already initialised) Ray cluster; otherwise
    `config.world_size` GPU workers over NCCL with the training workers' resources. `expect_transport`
    defaults to `config.nccl.transport` on a cluster and to none locally; with `efa` the EFA checks,
    the NCCL-network check and the bandwidth floor apply. Sizes double from 1 MiB to `max_size`
    (1 GiB, or 16 MiB locally). A `PREFLIGHT_RESULT {...}` line goes to stderr for
    `python -m workloads.verify`.
    """
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    expect = expect_transport if expect_transport is not None else (None if local else config.nccl.transport)
    efa = expect == "efa"
    world = LOCAL_WORKERS if local else config.world_size
    backend = "gloo" if local else "nccl"
    size_list = _default_sizes(local, max_size)
    if not ray.is_initialized():
        if local:
            start_local_ray()
        else:
            ray.init()
    scaling = (ScalingConfig(num_workers=world, use_gpu=False, resources_per_worker={"CPU": 1}) if local else
               ScalingConfig(num_workers=world, use_gpu=True,
                             resources_per_worker={"CPU": config.cpus_per_worker, "GPU": 1}))
    collector = _collector()
    trainer = TorchTrainer(
        _worker_loop,
        train_loop_config={"expect": expectation(config, local=local, efa=efa), "local": local, "sizes": size_list,
                           "warmup": WARMUP_ITERS, "iters": iters,
                           "collector": collector},
        scaling_config=scaling,
        torch_config=TorchConfig(backend=backend, timeout_s=600),
        run_config=RunConfig(name=_run_name(), storage_path=tempfile.gettempdir()),
    )
    report = PreflightReport(local=local, expect_transport=expect, world_size=world, backend=backend)
    try:
        trainer.fit()
    except Exception as exc:  # noqa: BLE001 - reported, and the report fails
        report.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
    payload = ray.get(collector.get.remote())
    ray.kill(collector)
    if payload is None:
        report.error = report.error or "no worker reported back"
    else:
        assemble_report(report, payload, config=config, efa=efa, local=local)
    print(report.marker_line(), file=sys.stderr, flush=True)
    return report


def _run_name() -> str:
    """A Ray Train run name of its own: two preflights started within one second (two tests, two users of one
    machine) under a name keyed on the second alone would share one run folder in the temp dir."""
    import uuid

    return f"preflight-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"


def assemble_report(report: PreflightReport, payload: dict, *, config, efa: bool, local: bool) -> None:
    """Fill `report` from rank 0's payload: per-worker checks, parsed NCCL logs, probe rows, cluster checks."""
    logs = {entry["rank"]: entry for entry in payload["logs"]}
    for entry in sorted(payload["workers"], key=lambda w: w["rank"]):
        facts = WorkerFacts(**{k: v for k, v in entry["facts"].items()})
        nccl_lines = logs.get(entry["rank"], {}).get("nccl")
        report.workers.append(WorkerReport(rank=entry["rank"], host=facts.host, node=facts.node,
                                           checks=list(entry["checks"]),
                                           nccl=parse_nccl_log("\n".join(nccl_lines)) if nccl_lines is not None
                                           else None))
    all_lines = [line for entry in payload["logs"] if entry.get("nccl") for line in entry["nccl"]]
    report.network = parse_nccl_log("\n".join(all_lines)) if report.backend == "nccl" else None
    report.probe = list(payload["rows"])
    notes = [entry["note"] for entry in payload["logs"] if entry.get("note")]
    report.probe_note = next((n for n in notes if n.startswith("probe failed")), notes[0] if notes else "")
    if report.probe_note.startswith("probe failed"):
        report.cluster_checks.append(CheckResult(name="probe", status="FAIL", detail=report.probe_note,
                                                 fix="read the NCCL WARN lines in the worker logs "
                                                     f"({NCCL_LOG_PREFIX}.*.log on the worker pods)"))
    # A probe that raised still leaves NCCL's log (e.g. "Failed to initialize any NET plugin"): judge it too.
    if report.probe or report.probe_note.startswith("probe failed"):
        report.cluster_checks.append(check_network(report.network, report.expect_transport))
        if efa and not local:
            report.floor_gbs = round(min(floor_gbs(config.instance(g).network_gbps)
                                         for g in config.cluster.worker_groups), 3)
        report.cluster_checks.append(check_floor(report.probe, floor=report.floor_gbs, hosts=report.hosts,
                                                 expect=report.expect_transport))
