"""The real local preflight: 2 CPU Ray Train workers, torch.distributed over gloo, the CLI end to end.

One Ray instance serves both runs (starting Ray dominates the time on a small machine)."""

from __future__ import annotations

import glob
import json
import os

import pytest

from workloads.preflight.__main__ import main
from workloads.preflight.probe import MIB, bus_factor
from workloads.verify import parse_preflight_marker

pytestmark = pytest.mark.slow  # `make check` leaves this module out (pyproject.toml markers)


@pytest.fixture(scope="module")
def local_ray():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    from workloads.local_ray import loopback_only

    loopback_only()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_local_probe_passes_with_figures(local_ray, capsys):
    assert main(["--local", "--json", "--max-size", str(4 * MIB), "--iters", "3"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["ok"] and report["local"] and report["backend"] == "gloo"
    assert report["world_size"] == 2 and [w["rank"] for w in report["workers"]] == [0, 1]
    assert report["network"] is None and report["failures"] == []
    # Locally there is no K8S_NODE_NAME: the hostname stands in, and both workers share it.
    assert {w["node"] for w in report["workers"]} == {w["host"] for w in report["workers"]}
    assert report["hosts"] == 1
    probe = report["probe"]
    assert [(r["op"], r["size_bytes"]) for r in probe] == [
        (op, size) for size in (MIB, 2 * MIB, 4 * MIB) for op in ("all_reduce", "all_gather")]
    for row in probe:
        assert row["time_us"] > 0 and row["algbw_gbs"] > 0
        assert row["algbw_gbs"] == pytest.approx(row["size_bytes"] / (row["time_us"] * 1e-6) / 1e9, rel=1e-6)
        assert row["busbw_gbs"] == pytest.approx(row["algbw_gbs"] * bus_factor(row["op"], 2))
    statuses = {c["name"]: c["status"] for w in report["workers"] for c in w["checks"]}
    assert statuses["efa-devices"] == "SKIP" and statuses["dev-shm"] == "PASS"
    marker = parse_preflight_marker(err)
    assert marker["ok"] and marker["network"] == "gloo" and marker["size_bytes"] == 4 * MIB


@pytest.mark.skipif(bool(glob.glob("/dev/infiniband/uverbs*")), reason="this machine has EFA devices")
def test_efa_expected_without_efa_fails(local_ray, capsys):
    assert main(["--local", "--expect-transport", "efa"]) == 1
    out, err = capsys.readouterr()
    assert out.startswith("Preflight: FAIL")
    assert "EFA device /dev/infiniband/uverbs0 missing" in out
    assert "vpc.amazonaws.com/efa" in out
    assert "fix: the worker pod must request vpc.amazonaws.com/efa: 1" in out
    # A broken EFA path can hang NCCL, so the probe does not run after failed checks.
    assert "skipped: checks failed" in out
    assert '"ok":false' in err
