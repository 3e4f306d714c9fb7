"""EFA bytes as Prometheus series (issue 23): node exporter's EFA sidecar script against a fake sysfs tree, served
by Debian's real node exporter and scraped by Debian's real Prometheus, against which the overview's EFA panel is
evaluated; and what node exporter's own infiniband collector makes of the same EFA device.

The tree copies the layout the kernel gives an EFA device: /sys/class/infiniband/<dev> links to the device under
its PCI function, whose `driver` link names the `efa` driver; the port's byte counters are only in
`ports/<n>/hw_counters/` (amzn-drivers efa_linux_3.1.0 kernel/linux/efa/src/efa_verbs.c EFA_DEFINE_PORT_STATS),
and there is no `counters/` (drivers/infiniband/core/sysfs.c creates it only for a device with `process_mad`,
which efa_main.c's efa_dev_ops does not set). The script run is stacks/efa_counters.sh, the same file the
sidecar's command carries. Without `prometheus-node-exporter` (or `prometheus`) the scrape tests skip and say how
to install them (`make setup` does).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from charts import dashboards
from config.observability import EFA_METRIC
from harness.loopback import NodeExporter, PrometheusServer, node_exporter_missing, prometheus_missing
from harness.waiting import wait_for
from stacks.observability import EFA_SCRIPT

pytestmark = pytest.mark.slow  # runs the sidecar script, node-exporter and Prometheus: `make check` leaves it out

EFA_DEVICE = "rdmap0s6"
OTHER_DEVICE = "mlx5_0"
# A few of the EFA port's hw_counters (efa_verbs.c EFA_DEFINE_PORT_STATS names), bytes and packets.
FIRST = {"tx_bytes": 1_000, "rx_bytes": 2_000, "tx_pkts": 10, "rx_pkts": 20, "rdma_read_bytes": 300,
         "rdma_write_bytes": 400, "retrans_bytes": 0}
# What the port has counted one scrape later: 8 MB sent, 4 MB received.
SECOND = {**FIRST, "tx_bytes": 8_001_000, "rx_bytes": 4_002_000}
SCRIPT_TIMEOUT_S = 30
SCRAPE_WAIT_S = 60


# ---- the fake sysfs tree ---------------------------------------------------------------------------------------


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _rdma_device(sysfs: Path, name: str, pci: str, driver: str, port_counters: dict[str, int]) -> Path:
    """An RDMA device as the kernel lays it out; returns its hw_counters folder of port 1."""
    function = sysfs / "devices" / "pci0000:00" / pci
    (sysfs / "bus" / "pci" / "drivers" / driver).mkdir(parents=True, exist_ok=True)
    function.mkdir(parents=True)
    os.symlink(f"../../../bus/pci/drivers/{driver}", function / "driver")
    device = function / "infiniband" / name
    device.mkdir(parents=True)
    os.symlink(f"../../../{pci}", device / "device")
    (sysfs / "class" / "infiniband").mkdir(parents=True, exist_ok=True)
    os.symlink(f"../../devices/pci0000:00/{pci}/infiniband/{name}", sysfs / "class" / "infiniband" / name)
    _write(device / "node_type", "1: CA\n")
    _write(device / "node_guid", "0000:0000:0000:0000\n")
    # Device-wide admin counters (efa_verbs.c EFA_DEFINE_DEVICE_STATS): not per port, not read by the script.
    _write(device / "hw_counters" / "submitted_cmds", "7\n")
    port = device / "ports" / "1"
    _write(port / "state", "4: ACTIVE\n")
    _write(port / "phys_state", "5: LinkUp\n")
    _write(port / "rate", "100 Gb/sec (4X EDR)\n")
    _write(port / "link_layer", "Unspecified\n")
    hw = port / "hw_counters"
    _write(hw / "lifespan", "10\n")  # the counters' cache time, ms: not a counter
    set_counters(hw, port_counters)
    return hw


def set_counters(hw_counters: Path, values: dict[str, int]) -> None:
    for name, value in values.items():
        _write(hw_counters / name, f"{value}\n")


@pytest.fixture
def tree(tmp_path) -> tuple[Path, Path, Path]:
    """(sysfs, textfile folder, the EFA port's hw_counters folder): one EFA device and one mlx5 device."""
    sysfs = tmp_path / "sys"
    hw = _rdma_device(sysfs, EFA_DEVICE, "0000:00:06.0", "efa", FIRST)
    _rdma_device(sysfs, OTHER_DEVICE, "0000:00:07.0", "mlx5_core", {"out_of_buffer": 5, "tx_bytes": 99})
    out = tmp_path / "textfile"
    out.mkdir()
    return sysfs, out, hw


def run_script(sysfs: Path, out: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {"PATH": os.environ["PATH"], "EFA_SYSFS": str(sysfs), "EFA_TEXTFILE_DIR": str(out), **env}
    return subprocess.run(["sh", str(EFA_SCRIPT), *args], env=environ, capture_output=True, text=True,
                          timeout=SCRIPT_TIMEOUT_S)


SERIES = re.compile(rf"^{EFA_METRIC}\{{([^}}]*)\}} (\S+)$", re.M)


def series_of(text: str) -> dict[tuple[str, str, str], int]:
    """(device, port, counter): value of the EFA series in exposition text (labels in any order)."""
    found = {}
    for labels, value in SERIES.findall(text):
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        found[pairs["device"], pairs["port"], pairs["counter"]] = int(float(value))
    return found


# ---- the script -------------------------------------------------------------------------------------------------


def test_script_writes_every_counter_of_the_efa_port_as_one_series(tree):
    sysfs, out, _ = tree
    result = run_script(sysfs, out, "--once")
    assert result.returncode == 0, result.stderr
    assert series_of((out / "efa.prom").read_text()) == {(EFA_DEVICE, "1", k): v for k, v in FIRST.items()}


def test_script_skips_rdma_devices_of_other_drivers(tree):
    sysfs, out, _ = tree
    run_script(sysfs, out, "--once")
    assert OTHER_DEVICE in os.listdir(sysfs / "class" / "infiniband")
    assert OTHER_DEVICE not in (out / "efa.prom").read_text()


def test_script_leaves_only_the_finished_prom_file(tree):
    """Written under a temporary name, then renamed: node exporter reads only names ending in .prom
    (node_exporter v1.12.1 collector/textfile.go), so it never sees half a file."""
    sysfs, out, _ = tree
    run_script(sysfs, out, "--once")
    assert os.listdir(out) == ["efa.prom"]


def test_script_on_a_node_without_efa_writes_the_family_with_no_series(tmp_path):
    out = tmp_path / "textfile"
    out.mkdir()
    result = run_script(tmp_path / "sys", out, "--once")
    assert result.returncode == 0, result.stderr
    text = (out / "efa.prom").read_text()
    assert f"# TYPE {EFA_METRIC} counter" in text and not series_of(text)


@pytest.mark.parametrize("interval", ["0", "3601", "15s", ""])
def test_script_refuses_an_interval_outside_1_to_3600_seconds(tree, interval):
    sysfs, out, _ = tree
    result = run_script(sysfs, out, "--once", EFA_INTERVAL_S=interval)
    assert result.returncode == 2
    assert "EFA_INTERVAL_S" in result.stderr and "3600" in result.stderr
    assert not os.listdir(out)


def test_script_refuses_a_missing_textfile_dir(tree):
    sysfs, out, _ = tree
    result = run_script(sysfs, out / "absent", "--once")
    assert result.returncode == 2
    assert f"EFA_TEXTFILE_DIR={out / 'absent'} is not a writable directory" in result.stderr


def test_script_loop_exits_0_on_sigterm(tree):
    """As the pod's sidecar (the container's PID 1) it must stop on SIGTERM, not wait out the grace period."""
    sysfs, out, _ = tree
    environ = {"PATH": os.environ["PATH"], "EFA_SYSFS": str(sysfs), "EFA_TEXTFILE_DIR": str(out),
               "EFA_INTERVAL_S": "3600"}
    proc = subprocess.Popen(["sh", str(EFA_SCRIPT)], env=environ, start_new_session=True)
    try:
        wait_for(lambda: (out / "efa.prom").exists(), SCRIPT_TIMEOUT_S, "the first write")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=SCRIPT_TIMEOUT_S) == 0
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=SCRIPT_TIMEOUT_S)


# ---- served by the real node exporter, scraped by the real Prometheus ------------------------------------------


def _scraped(server: PrometheusServer, value: int) -> bool:
    query = f'{EFA_METRIC}{{device="{EFA_DEVICE}",counter="tx_bytes"}}'
    return any(float(s["value"][1]) == value for s in server.api("query", query=query)["result"])


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    """The sidecar's file for the fake tree, served by node exporter (textfile and infiniband collectors on) and
    scraped every second by Prometheus: once with FIRST, once with SECOND. Yields (server, exporter, start, end)."""
    for reason in (node_exporter_missing(), prometheus_missing()):
        if reason:
            pytest.skip(reason)
    root = tmp_path_factory.mktemp("efa")
    sysfs = root / "sys"
    hw = _rdma_device(sysfs, EFA_DEVICE, "0000:00:06.0", "efa", FIRST)
    out = root / "textfile"
    out.mkdir()
    assert run_script(sysfs, out, "--once").returncode == 0
    with NodeExporter(sysfs=sysfs, textfile_dir=out) as exporter:
        job = {"job_name": "node-exporter", "scrape_interval": "1s",
               "static_configs": [{"targets": [exporter.address]}]}
        with PrometheusServer([job]) as server:
            start = time.time()
            wait_for(lambda: _scraped(server, FIRST["tx_bytes"]), SCRAPE_WAIT_S, "the first counters scraped")
            set_counters(hw, SECOND)
            assert run_script(sysfs, out, "--once").returncode == 0
            wait_for(lambda: _scraped(server, SECOND["tx_bytes"]), SCRAPE_WAIT_S, "the second counters scraped")
            yield server, exporter, start, time.time()


def _efa_targets():
    return [(p.title, t) for p in dashboards.OVERVIEW_PANELS for t in p.targets if t.source == "efa"]


@pytest.mark.parametrize("title,target", _efa_targets(), ids=[t.legend for _, t in _efa_targets()])
def test_overview_efa_query_returns_the_nodes_bytes_per_second(scraped, title, target):
    server, exporter, start, end = scraped
    expr = target.expr.replace("$__rate_interval", "1m")
    # A range query evaluates at start, start + step, ...: the window ends exactly at `end`, after the last scrape.
    (series,) = server.query_range(expr, start=end - 60, end=end)
    assert series["metric"] == {"instance": exporter.address}, title
    assert max(float(v) for _, v in series["values"]) > 0, f"{title}: {expr} saw no bytes"


def test_node_exporters_infiniband_collector_exports_no_efa_bytes(scraped):
    """Of node exporter's series for the EFA device, only the sidecar's carry its bytes. Its infiniband collector
    reads `counters/` (port_rcv_data, port_xmit_data), which an EFA port lacks, and of `hw_counters/` only mlx5's
    names (prometheus/procfs v0.21.1 sysfs/class_infiniband.go, node exporter v1.12.1); Debian's 1.5.0 (procfs
    v0.8.0) requires `counters/` and returns no data at all for the device."""
    _, exporter, _, _ = scraped
    text = exporter.metrics()
    infiniband = [line for line in text.splitlines() if line.startswith("node_infiniband_") and EFA_DEVICE in line]
    assert not [line for line in infiniband if "bytes" in line or "data" in line], infiniband
    assert series_of(text)[(EFA_DEVICE, "1", "tx_bytes")] == SECOND["tx_bytes"]
