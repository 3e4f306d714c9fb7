"""`bench/gpu_throughput.py --dcgm` (harness/dcgm.py) without a GPU: its field list is the one the deployed
dcgm-exporter reads, its arguments are checked, and without a GPU it stops with exit 2 and says why.

The check itself (which fields a capability-less client gets from a DCGM host engine) needs a GPU and DCGM: it is
for the first GPU run (docs/observability.md, "To check on a GPU").
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.helpers import REPO

BENCH = REPO / "bench" / "gpu_throughput.py"


def _bench_module():
    spec = importlib.util.spec_from_file_location("gpu_throughput_under_test", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _main(monkeypatch, *argv: str) -> int:
    """bench/gpu_throughput.py's own `main` with `argv`; its exit status (argparse and `--dcgm` both exit)."""
    module = _bench_module()
    monkeypatch.setattr(sys, "argv", [str(BENCH), *argv])
    with pytest.raises(SystemExit) as stopped:
        module.main()
    return stopped.value.code


def test_the_field_list_is_the_vendored_charts_default_counters():
    # What the stack's dcgm-exporter reads (`-f /etc/dcgm-exporter/default-counters.csv`, the chart's ConfigMap).
    from harness.dcgm import EXPORTER_COUNTERS, chart_counters
    from tools import pins

    chart = pins.fetch("dcgm-exporter-4.8.2")[0]
    assert list(EXPORTER_COUNTERS) == chart_counters((chart / "templates" / "metrics-configmap.yaml").read_text())


def test_every_field_has_an_id_and_the_profiling_ones_are_the_dcp_ids():
    from harness.dcgm import DASHBOARD_FIELDS, EXPORTER_COUNTERS, FIELD_IDS, is_profiling

    names = [name for name, _ in EXPORTER_COUNTERS]
    assert set(FIELD_IDS) == set(names) and len(set(FIELD_IDS.values())) == len(FIELD_IDS)
    # DCP (profiling) fields are 1001 and up in dcgm_fields.h; the SYS_ADMIN question is about exactly these.
    assert {n for n in names if is_profiling(n)} == {n for n in names if FIELD_IDS[n] > 1000} == {
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"}
    assert set(DASHBOARD_FIELDS) <= set(names)


def test_the_dashboards_dcgm_metrics_are_in_the_field_list():
    # Every DCGM series a panel of dist/dashboards.k8s.yaml queries is one the check asks about.
    import re

    from harness.dcgm import FIELD_IDS

    # The panels' queries: charts/dashboards.py's own, and the dashboards it ships from charts/dashboards/.
    sources = [REPO / "charts" / "dashboards.py", *(REPO / "charts" / "dashboards").glob("*.json")]
    text = "".join(path.read_text() for path in sources)
    used = set(re.findall(r"DCGM_FI_[A-Z0-9_]+", text))
    assert used and used <= set(FIELD_IDS)


def test_dmon_rows_are_read_per_field_and_na_is_not_served():
    from harness.dcgm import arrived, parse_dmon

    fields = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"]
    out = ("#Entity   GPUTL  TENSO  DRAMA\nID\nGPU 0     97     0.812  N/A\nGPU 1     0      0.000  N/A\n"
           "GPU 0     98     0.830  N/A\n")
    values = parse_dmon(out, fields)
    assert values == {"DCGM_FI_DEV_GPU_UTIL": ["97", "0", "98"],
                      "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ["0.812", "0.000", "0.830"],
                      "DCGM_FI_PROF_DRAM_ACTIVE": ["N/A", "N/A", "N/A"]}
    assert [arrived(values[f]) for f in fields] == [True, True, False]
    assert parse_dmon("Error: unable to connect to host engine\n", fields) == {f: [] for f in fields}


def test_cap_eff_is_read_from_proc_status():
    from harness.dcgm import capabilities

    assert capabilities("Name:\tcat\nCapInh:\t0000000000000000\nCapEff:\t0000000000000000\n") == 0
    assert capabilities("CapEff:\t000001ffffffffff\n") & (1 << 21)  # CAP_SYS_ADMIN is bit 21
    with open("/proc/self/status") as status:
        assert capabilities(status.read()) >= 0


@pytest.mark.parametrize(("argv", "says"), [
    (["--dcgm-hostengine", "10.0.0.1:5555"], "--dcgm-hostengine and --dcgm-samples go with --dcgm"),
    (["--dcgm", "--dcgm-hostengine", "10.0.0.1"], "'10.0.0.1' is not HOST:PORT"),
    (["--dcgm", "--dcgm-hostengine", "node:99999"], "'node:99999' is not HOST:PORT"),
    (["--dcgm", "--dcgm-samples", "0"], "'0' is not a whole number from 1 to 60"),
    (["--dcgm", "--tiny"], "--dcgm is a check of its own: drop --tiny/--lora"),
])
def test_bad_dcgm_arguments_are_refused_with_the_reason(monkeypatch, capsys, argv, says):
    assert _main(monkeypatch, *argv) == 2
    assert says in capsys.readouterr().err


def test_dcgm_without_a_gpu_stops_and_says_so(monkeypatch, capsys, tmp_path):
    # No nvidia-smi on PATH (as on this CPU machine): exit 2 before any torch import or DCGM call.
    monkeypatch.setenv("PATH", str(tmp_path))
    assert _main(monkeypatch, "--dcgm", "--dcgm-hostengine", "10.0.1.23:5555", "--dcgm-samples", "3") == 2
    out = capsys.readouterr().out
    assert "error: --dcgm needs an NVIDIA GPU: `nvidia-smi -L` lists none here" in out


def test_dcgm_with_a_gpu_but_no_dcgm_names_what_is_missing(monkeypatch, capsys, tmp_path):
    # An `nvidia-smi` that lists a GPU, and no dcgmi or nv-hostengine: exit 2 naming them and how to get them.
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)'\n")
    fake.chmod(0o755)
    (tmp_path / "sh").symlink_to("/bin/sh")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert _main(monkeypatch, "--dcgm") == 2
    out = capsys.readouterr().out
    assert "error: --dcgm needs dcgmi, setpriv, nv-hostengine on PATH: install NVIDIA DCGM 4" in out
