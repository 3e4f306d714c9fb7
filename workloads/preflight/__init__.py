"""Preflight: per-worker GPU/EFA checks and a collective bandwidth probe, run before training.

`run_preflight(config, local=..., expect_transport=...)` returns a `PreflightReport`; training
aborts on `not report.ok` (printing `report.render()`). `python -m workloads.preflight` runs it
as its own job. The checks are pure functions in `checks`, NCCL log parsing in `nccl_log`, the
bandwidth arithmetic in `probe`.
"""

from workloads.preflight.checks import CheckResult
from workloads.preflight.nccl_log import NcclNetwork, parse_nccl_log
from workloads.preflight.probe import BandwidthRow
from workloads.preflight.report import MARKER, PreflightReport, WorkerReport


def __getattr__(name: str):
    # The runner pulls in Ray Train and the training launcher; `workloads.verify` needs neither.
    if name == "run_preflight":
        from workloads.preflight.runner import run_preflight

        return run_preflight
    raise AttributeError(name)


__all__ = [
    "MARKER",
    "BandwidthRow",
    "CheckResult",
    "NcclNetwork",
    "PreflightReport",
    "WorkerReport",
    "parse_nccl_log",
    "run_preflight",
]
