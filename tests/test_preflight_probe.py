"""Bandwidth arithmetic like nccl-tests, message sizes, memory cap, the floor, and the report."""

from __future__ import annotations

import json

import pytest

from workloads.preflight.checks import failed, passed
from workloads.preflight.nccl_log import parse_nccl_log
from workloads.preflight.probe import (
    GIB,
    MIB,
    BandwidthRow,
    bandwidth,
    bus_factor,
    check_floor,
    floor_gbs,
    memory_cap,
    sizes,
)
from workloads.preflight.report import PreflightReport, WorkerReport
from workloads.verify import parse_preflight_marker


def test_bus_factors_match_nccl_tests():
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("all_gather", 8) == pytest.approx(0.875)
    assert bus_factor("all_reduce", 2) == pytest.approx(1.0)
    assert bus_factor("all_gather", 2) == pytest.approx(0.5)
    assert bus_factor("all_reduce", 1) == 0.0
    with pytest.raises(ValueError):
        bus_factor("broadcast", 8)


def test_bandwidth_known_inputs():
    # 1 GiB all-reduce across 8 ranks in 0.5 s: algbw 2.147 GB/s, busbw x 1.75.
    algbw, busbw = bandwidth("all_reduce", GIB, 0.5, 8)
    assert algbw == pytest.approx(2.147483648)
    assert busbw == pytest.approx(2.147483648 * 1.75)
    algbw, busbw = bandwidth("all_gather", 256 * MIB, 0.1, 4)
    assert algbw == pytest.approx(2.68435456)
    assert busbw == pytest.approx(2.68435456 * 0.75)


def test_sizes_and_cap():
    assert sizes(MIB, GIB) == [MIB << i for i in range(11)]
    assert sizes(MIB, 16 * MIB) == [MIB, 2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB]
    assert sizes(MIB, GIB, cap=100 * MIB)[-1] == 64 * MIB
    assert memory_cap(24 * GIB, 1) == 6 * GIB
    assert memory_cap(8 * GIB, 2) == GIB
    assert memory_cap(0, 1) == MIB


def _rows(busbw: float, size: int = GIB) -> list[BandwidthRow]:
    return [BandwidthRow(op="all_reduce", size_bytes=size, time_us=1.0, algbw_gbs=busbw / 1.75, busbw_gbs=busbw)]


def test_floor_from_catalog_figure():
    floor = floor_gbs(40)  # g6.12xlarge: 40 Gbit/s -> 5 GB/s, a quarter of it
    assert floor == pytest.approx(1.25)
    assert check_floor(_rows(3.1), floor=floor, hosts=2, expect="efa").status == "PASS"
    low = check_floor(_rows(0.9), floor=floor, hosts=2, expect="efa")
    assert low.status == "FAIL" and "0.90 GB/s" in low.detail and "1.25 GB/s" in low.detail
    assert check_floor(_rows(0.9), floor=floor, hosts=1, expect="efa").status == "SKIP"
    assert check_floor(_rows(0.9), floor=None, hosts=2, expect="socket").status == "SKIP"
    assert check_floor(_rows(0.01, size=16 * MIB), floor=floor, hosts=2, expect="efa").status == "SKIP"


def _report(checks_rank1, *, log: str | None = None) -> PreflightReport:
    ok_checks = [passed("efa-devices", "1 device(s): /dev/infiniband/uverbs0"), passed("memlock", "unlimited")]
    report = PreflightReport(local=False, expect_transport="efa", world_size=2, backend="nccl")
    report.workers = [WorkerReport(rank=0, host="a", checks=ok_checks),
                      WorkerReport(rank=1, host="b", checks=checks_rank1)]
    report.network = parse_nccl_log(log) if log is not None else None
    report.probe = _rows(3.2) + [BandwidthRow(op="all_gather", size_bytes=GIB, time_us=9.0, algbw_gbs=4.0,
                                              busbw_gbs=2.0)]
    report.floor_gbs = 1.25
    return report


def test_report_ok_render_json_and_marker():
    report = _report([passed("efa-devices", "1 device(s): /dev/infiniband/uverbs0"), passed("memlock", "unlimited")],
                     log="h:1:2 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 1 nics)\n"
                         "h:1:2 [0] NCCL INFO Using network Libfabric\n")
    assert report.ok and report.hosts == 2
    text = report.render()
    assert text.startswith("Preflight: PASS")
    assert "all    efa-devices" in text and "1 GiB" in text and "3.200" in text
    data = json.loads(report.to_json())
    assert data["ok"] and data["network"]["kind"] == "efa" and len(data["probe"]) == 2
    marker = parse_preflight_marker("noise\n" + report.marker_line() + "\nmore noise")
    assert marker["ok"] and marker["network"] == "efa" and marker["all_reduce_busbw_gbs"] == 3.2


def test_report_failure_lists_rank_and_fix():
    bad = failed("efa-devices", "EFA device /dev/infiniband/uverbs0 missing", "request vpc.amazonaws.com/efa")
    report = _report([bad, passed("memlock", "unlimited")])
    assert not report.ok
    assert [(where, c.name) for where, c in report.failures] == [("rank 1", "efa-devices")]
    text = report.render()
    assert text.startswith("Preflight: FAIL")
    assert "[rank 1] efa-devices: EFA device /dev/infiniband/uverbs0 missing" in text
    assert "fix: request vpc.amazonaws.com/efa" in text
    assert not parse_preflight_marker(report.marker_line())["ok"]


def test_two_pods_on_one_node_are_one_host_for_the_floor(tmp_path):
    """Distinct nodes (K8S_NODE_NAME), not pod hostnames, decide whether the network was crossed."""
    report = _report([passed("memlock", "unlimited")])
    report.workers = [WorkerReport(rank=r, host=f"finetune-gpu-worker-{r}", node="ip-10-0-1-23", checks=[])
                      for r in range(2)]
    assert report.hosts == 1
    assert check_floor(_rows(0.1), floor=1.25, hosts=report.hosts, expect="efa").status == "SKIP"
    report.workers[1].node = "ip-10-0-1-57"
    assert report.hosts == 2
    # Without a node name (local runs), the hostname stands in.
    report.workers = [WorkerReport(rank=r, host=f"h{r}", checks=[]) for r in range(2)]
    assert report.hosts == 2
    assert [w["node"] for w in json.loads(report.to_json())["workers"]] == ["h0", "h1"]

    from tests.helpers import load_variant
    from workloads.preflight.runner import assemble_report

    config = load_variant(tmp_path)
    efa_lines = ["h:7:9 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 1 nics)",
                 "h:7:9 [0] NCCL INFO Using network Libfabric"]
    payload = _payload([efa_lines, efa_lines], _rows(0.6), node="ip-10-0-1-23")
    report = PreflightReport(local=False, expect_transport="efa", world_size=2, backend="nccl")
    assemble_report(report, payload, config=config, efa=True, local=False)
    assert report.hosts == 1 and report.ok
    floor = next(c for c in report.cluster_checks if c.name == "busbw-floor")
    assert floor.status == "SKIP" and "single node" in floor.detail
    assert "1 node(s)" in report.render()


def test_report_missing_workers_is_not_ok():
    report = _report([passed("memlock", "unlimited")])
    report.world_size = 8
    assert not report.ok


def _payload(lines_per_rank, rows, node: str = ""):
    from workloads.preflight.checks import WorkerFacts, facts_dict

    workers = [{"rank": r, "facts": facts_dict(WorkerFacts(host=f"ray-gpu-worker-{r}", node=node, visible_gpus=4)),
                "checks": [passed("gpus", "4 visible")]} for r in range(2)]
    logs = [{"rank": r, "nccl": lines, "note": ""} for r, lines in enumerate(lines_per_rank)]
    return {"workers": workers, "logs": logs, "rows": rows, "note": ""}


def test_assemble_report_cluster_socket_fallback_fails(tmp_path):
    from tests.helpers import load_variant
    from workloads.preflight.runner import assemble_report

    config = load_variant(tmp_path)
    socket_lines = ["h:7:9 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.1.57<0>",
                    "h:7:9 [0] NCCL INFO Using network Socket"]
    report = PreflightReport(local=False, expect_transport="efa", world_size=2, backend="nccl")
    assemble_report(report, _payload([socket_lines, socket_lines], _rows(2.0)), config=config, efa=True, local=False)
    assert report.hosts == 2 and report.floor_gbs == 1.25
    assert report.network.kind == "socket"
    assert [(w, c.name) for w, c in report.failures] == [("all", "nccl-network")]
    assert "NET/Socket" in report.render()

    efa_lines = ["h:7:9 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 1 nics)",
                 "h:7:9 [0] NCCL INFO Using network Libfabric"]
    report = PreflightReport(local=False, expect_transport="efa", world_size=2, backend="nccl")
    assemble_report(report, _payload([efa_lines, efa_lines], _rows(0.6)), config=config, efa=True, local=False)
    assert [(w, c.name) for w, c in report.failures] == [("all", "busbw-floor")]
    assert "0.60 GB/s" in report.failures[0][1].detail


def test_preflights_started_within_one_second_get_their_own_ray_train_runs(monkeypatch):
    """The run name was keyed on the whole second: two preflights in one second shared one run folder."""
    import time

    from workloads.preflight import runner

    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.25)
    monkeypatch.setattr(time, "strftime", lambda fmt, *args: "20231114-221320")
    assert runner._run_name() != runner._run_name()
