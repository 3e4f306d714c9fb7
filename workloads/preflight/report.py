"""The preflight report: per-worker checks, probe figures, the NCCL network, and the verdict."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from workloads.preflight.checks import CheckResult
from workloads.preflight.nccl_log import NcclNetwork
from workloads.preflight.probe import FLOOR_MIN_SIZE, MIB, BandwidthRow

MARKER = "PREFLIGHT_RESULT"
"""Prefix of the one JSON line `run_preflight` writes to stderr; `python -m workloads.verify` reads it
from the job's logs."""


@dataclass(kw_only=True)
class WorkerReport:
    """One worker's checks and what its NCCL log said."""

    rank: int
    host: str
    node: str = ""
    """The Kubernetes node (K8S_NODE_NAME), or the hostname where that is unset (local runs)."""
    checks: list[CheckResult]
    nccl: NcclNetwork | None = None


@dataclass(kw_only=True)
class PreflightReport:
    """Everything one preflight run found; `ok` is the verdict, `render()` a table, `to_json()` for machines."""

    local: bool
    expect_transport: str | None
    world_size: int
    backend: str
    workers: list[WorkerReport] = field(default_factory=list)
    cluster_checks: list[CheckResult] = field(default_factory=list)
    """Checks over all workers together: the NCCL network and the bus-bandwidth floor."""
    probe: list[BandwidthRow] = field(default_factory=list)
    probe_note: str = ""
    network: NcclNetwork | None = None
    """All workers' NCCL logs parsed together (None with gloo)."""
    floor_gbs: float | None = None
    error: str | None = None
    """Set when the job itself failed (a worker raised, Ray could not place the workers)."""

    @property
    def hosts(self) -> int:
        """Distinct nodes the workers ran on: two pods on one node do not cross the network, so they count once."""
        return len({w.node or w.host for w in self.workers})

    @property
    def failures(self) -> list[tuple[str, CheckResult]]:
        """Every failed check as (where, check): `rank N`/`ranks a-b`, or `all` for cluster checks."""
        out: list[tuple[str, CheckResult]] = []
        for where, check in _grouped(self.workers):
            if not check.ok:
                out.append((where, check))
        out.extend(("all", c) for c in self.cluster_checks if not c.ok)
        return out

    @property
    def ok(self) -> bool:
        """True when the job ran, every worker reported, and no check failed."""
        return self.error is None and len(self.workers) == self.world_size and not self.failures

    def network_summary(self) -> str:
        """The NCCL network line, or the backend when NCCL was not used."""
        if self.network is None:
            return f"{self.backend} (no NCCL; local CPU run)" if self.backend == "gloo" else "unknown"
        return self.network.summary()

    def summary(self) -> dict:
        """The compact verdict written after `PREFLIGHT_RESULT` (ok, network, largest busbw, failures)."""
        top = max((r for r in self.probe if r.op == "all_reduce"), key=lambda r: r.size_bytes, default=None)
        return {
            "ok": self.ok,
            "network": self.network.kind if self.network else self.backend,
            "world_size": self.world_size,
            "hosts": self.hosts,
            "all_reduce_busbw_gbs": round(top.busbw_gbs, 3) if top else None,
            "size_bytes": top.size_bytes if top else None,
            "floor_gbs": self.floor_gbs,
            "failures": [f"{where}: {c.name}: {c.detail}" for where, c in self.failures]
            + ([f"error: {self.error}"] if self.error else []),
        }

    def to_dict(self) -> dict:
        """The full report as JSON-friendly data."""
        return {
            "ok": self.ok,
            "local": self.local,
            "expect_transport": self.expect_transport,
            "world_size": self.world_size,
            "hosts": self.hosts,
            "backend": self.backend,
            "network": self.network.to_dict() if self.network else None,
            "network_summary": self.network_summary(),
            "floor_gbs": self.floor_gbs,
            "error": self.error,
            "workers": [
                {"rank": w.rank, "host": w.host, "node": w.node or w.host,
                 "checks": [_check_dict(c) for c in w.checks], "nccl": w.nccl.to_dict() if w.nccl else None}
                for w in self.workers
            ],
            "cluster_checks": [_check_dict(c) for c in self.cluster_checks],
            "probe": [r.to_dict() for r in self.probe],
            "probe_note": self.probe_note,
            "failures": [{"where": where, **_check_dict(c)} for where, c in self.failures],
        }

    def to_json(self, indent: int | None = 2) -> str:
        """`to_dict()` as JSON text."""
        return json.dumps(self.to_dict(), indent=indent)

    def marker_line(self) -> str:
        """`PREFLIGHT_RESULT {...}`: one line `verify` can find in a job's logs."""
        return f"{MARKER} {json.dumps(self.summary(), separators=(',', ':'))}"

    def render(self) -> str:
        """A readable report: verdict, network, checks, failures with fixes, and the probe table."""
        where = "local" if self.local else "cluster"
        lines = [
            f"Preflight: {'PASS' if self.ok else 'FAIL'}  ({where}, world size {self.world_size}, "
            f"{self.hosts} node(s), backend {self.backend}, transport expected: {self.expect_transport or 'any'})",
            f"NCCL network: {self.network_summary()}",
        ]
        if self.error:
            lines.append(f"Error: {self.error}")
        rows = [(w, c.name, c.status, _short(c.detail)) for w, c in _grouped(self.workers)]
        rows += [("all", c.name, c.status, _short(c.detail)) for c in self.cluster_checks]
        lines += ["", "Checks"] + table(("where", "check", "status", "detail"), rows)
        if self.failures:
            lines += ["", "Failures (what is wrong -> fix)"]
            for where_, check in self.failures:
                lines.append(f"  [{where_}] {check.name}: {check.detail}")
                if check.fix:
                    lines.append(f"      fix: {check.fix}")
        lines += ["", "Collective probe" + (f" ({self.probe_note})" if self.probe_note else "")]
        if self.probe:
            lines += table(
                ("op", "size", "time (us)", "algbw (GB/s)", "busbw (GB/s)"),
                [(r.op, _size(r.size_bytes), f"{r.time_us:.1f}", f"{r.algbw_gbs:.3f}", f"{r.busbw_gbs:.3f}")
                 for r in self.probe],
                right=(1, 2, 3, 4),
            )
            if self.floor_gbs is not None:
                lines.append(f"  floor: all_reduce busbw >= {self.floor_gbs:.2f} GB/s at the largest size "
                             f"(EFA, >= 2 nodes, >= {FLOOR_MIN_SIZE // MIB} MiB)")
        else:
            lines.append("  (no measurements)")
        return "\n".join(lines)


def _check_dict(check: CheckResult) -> dict:
    return {"name": check.name, "status": check.status, "detail": check.detail, "fix": check.fix}


def _grouped(workers: list[WorkerReport]) -> list[tuple[str, CheckResult]]:
    """Each check once per distinct outcome, with the ranks that share it ('all' when every rank does)."""
    by_key: dict[tuple, list[int]] = {}
    order: list[tuple] = []
    for worker in sorted(workers, key=lambda w: w.rank):
        for check in worker.checks:
            key = (check.name, check.status, check.detail, check.fix)
            if key not in by_key:
                by_key[key] = []
                order.append(key)
            by_key[key].append(worker.rank)
    names = list(dict.fromkeys(k[0] for k in order))
    order.sort(key=lambda k: names.index(k[0]))
    out = []
    for key in order:
        ranks = by_key[key]
        where = "all" if len(ranks) == len(workers) and len(workers) > 1 else _ranks(ranks)
        out.append((where, CheckResult(name=key[0], status=key[1], detail=key[2], fix=key[3])))
    return out


def _short(text: str, width: int = 100) -> str:
    """Keep the checks table readable; the failures section below carries the full text."""
    return text if len(text) <= width else text[: width - 3] + "..."


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ",".join(map(str, ranks))


def _size(n: int) -> str:
    return f"{n / MIB:g} MiB" if n < 1024 * MIB else f"{n / (1024 * MIB):g} GiB"


def table(header: tuple[str, ...], rows: list[tuple], right: tuple[int, ...] = ()) -> list[str]:
    """Rows under a header and a dashed rule, columns padded (`right`: right-aligned column indexes), indented."""
    cells = [tuple(str(c) for c in header)] + [tuple(str(c) for c in row) for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    out = []
    for j, row in enumerate(cells):
        parts = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(row)]
        out.append("  " + "  ".join(parts).rstrip())
        if j == 0:
            out.append("  " + "  ".join("-" * w for w in widths))
    return out
