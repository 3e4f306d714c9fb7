"""`python bench/gpu_throughput.py --dcgm`: what only a GPU can show about dcgm-exporter with no added capabilities.

The stack runs dcgm-exporter with every capability dropped (stacks/observability.py `dcgm_exporter_values`): the
chart's default adds SYS_ADMIN "for profiling metrics (DCGM_FI_PROF_*)" (dcgm-exporter chart 4.8.2 values.yaml
`securityContext`), but here the exporter only asks a host engine over TCP (`-r HOST:PORT`), the node monitoring
agent's `nv-hostengine`, and it is the host engine that holds the GPUs. Whether the profiling fields still arrive that
way is what this check shows (docs/observability.md, "To check on a GPU", point 1):

1. a host engine: `--dcgm-hostengine HOST:PORT` names a running one (on an EKS GPU node the agent's, `$HOST_IP:5555`);
   without it this starts `nv-hostengine -n -b 127.0.0.1 --port P` (its pid file in /tmp) as the agent's dcgm-server
   DaemonSet does (`nv-hostengine -n -b ALL`, eks-node-monitoring-agent chart 1.7.0 templates/dcgm-daemonset.yaml),
   and stops it at the end;
2. a client with no capabilities at all: `setpriv --bounding-set=-all --inh-caps=-all` (util-linux) empties the
   bounding set before exec, so even root's process gets CapEff 0 (capabilities(7), "Transformation of capabilities
   during execve()": P'(permitted) is limited by the bounding set), which is printed as read from /proc/self/status;
3. that client asks for every field the exporter's counters list names (EXPORTER_COUNTERS, the chart's
   default-counters.csv) with `dcgmi dmon --host HOST:PORT -e IDS -c N` while this process keeps the tensor pipe busy
   (bf16 matmuls, when torch and CUDA are here), and prints, field by field, whether a value arrived or N/A;
4. where the `dcgm-exporter` binary is on PATH, the exporter itself under the same `setpriv`, `-r HOST:PORT` and the
   same counters, and which of them its /metrics serves.

Without an NVIDIA GPU (`nvidia-smi -L` lists none) or without DCGM (`dcgmi`, `nv-hostengine`) it exits 2 and says
which; the figures are printed, never asserted (bench/). Last line is JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass

# The fields dcgm-exporter 4.8.2 exports by default: the uncommented lines of the chart's default-counters.csv
# (templates/metrics-configmap.yaml, the ConfigMap the stack's `-f /etc/dcgm-exporter/default-counters.csv` reads),
# in its order, with their Prometheus type. tests/test_gpu_dcgm.py compares this with the vendored chart.
EXPORTER_COUNTERS: tuple[tuple[str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge"), ("DCGM_FI_DEV_MEM_CLOCK", "gauge"),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge"), ("DCGM_FI_DEV_GPU_TEMP", "gauge"),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge"), ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter"),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter"),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge"), ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge"),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge"), ("DCGM_FI_DEV_DEC_UTIL", "gauge"),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge"),
    ("DCGM_FI_DEV_FB_FREE", "gauge"), ("DCGM_FI_DEV_FB_USED", "gauge"),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter"),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter"), ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge"), ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge"),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge"), ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge"),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge"),
)

# Field ids, as `dcgmi dmon -e` takes them (NVIDIA/DCGM dcgmlib/dcgm_fields.h `#define DCGM_FI_...`; DCGM 4 keeps the
# names above as aliases of renamed fields with the same ids, e.g. DCGM_FI_PROF_PIPE_TENSOR_ACTIVE = 1004).
FIELD_IDS: dict[str, int] = {
    "DCGM_FI_DEV_SM_CLOCK": 100, "DCGM_FI_DEV_MEM_CLOCK": 101, "DCGM_FI_DEV_MEMORY_TEMP": 140,
    "DCGM_FI_DEV_GPU_TEMP": 150, "DCGM_FI_DEV_POWER_USAGE": 155, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 156,
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 202, "DCGM_FI_DEV_GPU_UTIL": 203, "DCGM_FI_DEV_MEM_COPY_UTIL": 204,
    "DCGM_FI_DEV_ENC_UTIL": 206, "DCGM_FI_DEV_DEC_UTIL": 207, "DCGM_FI_DEV_XID_ERRORS": 230,
    "DCGM_FI_DEV_FB_FREE": 251, "DCGM_FI_DEV_FB_USED": 252, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 393,
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 394, "DCGM_FI_DEV_ROW_REMAP_FAILURE": 395,
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 449, "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 526,
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 1001, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 1004, "DCGM_FI_PROF_DRAM_ACTIVE": 1005,
    "DCGM_FI_PROF_PCIE_TX_BYTES": 1009, "DCGM_FI_PROF_PCIE_RX_BYTES": 1010,
}

# The overview dashboard's GPU panels (docs/observability.md "What is scraped": GPU utilisation and memory).
DASHBOARD_FIELDS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED")
HOSTENGINE_START_S = 30.0
DROP_ALL_CAPS = ("setpriv", "--bounding-set=-all", "--inh-caps=-all", "--")
INSTALL_HINT = ("install NVIDIA DCGM 4 (the datacenter-gpu-manager-4-core package from NVIDIA's CUDA repository), "
                "or run on an EKS GPU node with --dcgm-hostengine $HOST_IP:5555")


def is_profiling(field: str) -> bool:
    """A DCP field: the ones the chart's SYS_ADMIN is for ("Required for profiling metrics (DCGM_FI_PROF_*)")."""
    return field.startswith("DCGM_FI_PROF_")


def chart_counters(configmap_text: str) -> list[tuple[str, str]]:
    """The (field, type) pairs a dcgm-exporter counters CSV enables: every line that is not a comment."""
    pairs = []
    for line in configmap_text.splitlines():
        match = re.match(r"^\s*(DCGM_FI_[A-Z0-9_]+)\s*,\s*(\w+)\s*,", line)
        if match:
            pairs.append((match.group(1), match.group(2)))
    return pairs


def hostengine_address(value: str) -> str:
    """argparse type of `--dcgm-hostengine`: HOST:PORT, the form of dcgm-exporter's `-r` and `dcgmi --host`."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"'{value}' is not HOST:PORT (e.g. 10.0.1.23:5555, the node monitoring "
                                         "agent's nv-hostengine on an EKS GPU node)")
    return value


def samples(value: str) -> int:
    """argparse type of `--dcgm-samples`: 1 to 60 (one a second; dmon's run stays under the check's timeout)."""
    if not value.isdigit() or not 1 <= int(value) <= 60:
        raise argparse.ArgumentTypeError(f"'{value}' is not a whole number from 1 to 60")
    return int(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `--dcgm` flags of bench/gpu_throughput.py."""
    group = parser.add_argument_group("--dcgm", "dcgm-exporter without SYS_ADMIN: which fields a capability-less "
                                      "client gets from a DCGM host engine (harness/dcgm.py)")
    group.add_argument("--dcgm", action="store_true",
                       help="run the DCGM check instead of the throughput benchmark (needs a GPU and DCGM)")
    group.add_argument("--dcgm-hostengine", type=hostengine_address, default=None, metavar="HOST:PORT",
                       help="a running nv-hostengine (default: start one on 127.0.0.1 for the check)")
    group.add_argument("--dcgm-samples", type=samples, default=5, metavar="N",
                       help="dmon samples, one a second (1-60, default 5)")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse `--dcgm-*` without `--dcgm`, and `--dcgm` beside the throughput flags it would ignore."""
    if not args.dcgm and (args.dcgm_hostengine is not None or args.dcgm_samples != 5):
        parser.error("--dcgm-hostengine and --dcgm-samples go with --dcgm")
    if args.dcgm and (args.tiny or args.lora):
        parser.error("--dcgm is a check of its own: drop --tiny/--lora")


def capabilities(status_text: str) -> int:
    """CapEff from a /proc/PID/status text."""
    match = re.search(r"^CapEff:\s*([0-9a-fA-F]+)$", status_text, re.MULTILINE)
    if not match:
        raise ValueError("no CapEff line in /proc/self/status")
    return int(match.group(1), 16)


def parse_dmon(stdout: str, fields: list[str]) -> dict[str, list[str]]:
    """`dcgmi dmon` rows (`GPU 0  0.123  N/A ...`, one column per `-e` field in order) as {field: [values]}."""
    values: dict[str, list[str]] = {f: [] for f in fields}
    for line in stdout.splitlines():
        tokens = line.split()
        if len(tokens) == len(fields) + 2 and tokens[0] == "GPU" and tokens[1].isdigit():
            for field, value in zip(fields, tokens[2:], strict=True):
                values[field].append(value)
    return values


def arrived(samples: list[str]) -> bool:
    """A field is served when at least one sample is a number (dmon prints N/A for a field it cannot read)."""
    for value in samples:
        with contextlib.suppress(ValueError):
            float(value)
            return True
    return False


def gpus() -> list[str]:
    """`nvidia-smi -L` lines ("GPU 0: NVIDIA H200 (UUID: ...)"); empty without a driver or a GPU."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line for line in out.splitlines() if line.startswith("GPU ")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(host: str, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            return True
        time.sleep(0.3)
    return False


@dataclass
class Load:
    """bf16 matmuls on GPU 0 in a thread while the samples are taken, so the tensor pipe's field has work to see."""

    note: str = ""
    stop: threading.Event | None = None
    thread: threading.Thread | None = None

    def start(self) -> None:
        try:
            import torch
        except ImportError:
            self.note = "no torch here: no GPU load while sampling (the PROF_* values are idle ones)"
            return
        if not torch.cuda.is_available():
            self.note = "torch sees no CUDA device: no GPU load while sampling"
            return
        self.stop = threading.Event()

        def work():
            a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
            while not self.stop.is_set():
                for _ in range(20):
                    a = (a @ a).clamp_(-1, 1)
                torch.cuda.synchronize()

        self.thread = threading.Thread(target=work, daemon=True)
        self.thread.start()
        self.note = "bf16 8192x8192 matmuls on GPU 0 while sampling"

    def end(self) -> None:
        if self.stop:
            self.stop.set()
            self.thread.join(timeout=30)


def _exporter_metrics(hostengine: str, counters: list[tuple[str, str]]) -> dict:
    """dcgm-exporter itself, capability-less, against the host engine: which counters its /metrics serves."""
    exe = shutil.which("dcgm-exporter")
    if not exe:
        return {"ran": False, "note": "dcgm-exporter binary not on PATH: the dcgmi client above stands in for it "
                                      "(the same host-engine API over TCP)"}
    port = _free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as csv:
        csv.writelines(f"{name}, {kind}, {name}\n" for name, kind in counters)
    proc = subprocess.Popen([*DROP_ALL_CAPS, exe, "-r", hostengine, "-f", csv.name, "-a", f"127.0.0.1:{port}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        text, deadline = "", time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:  # noqa: S310
                    text = answer.read().decode()
                if any(name in text for name, _ in counters):
                    break
            time.sleep(2)
        served = sorted({name for name, _ in counters if re.search(rf"^{name}\{{", text, re.MULTILINE)})
        return {"ran": True, "served": served, "missing": [n for n, _ in counters if n not in served],
                "exited": proc.poll()}
    finally:
        proc.terminate()
        try:
            out = proc.communicate(timeout=10)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0]
        if out:
            print("dcgm-exporter said (last lines):\n  " + "\n  ".join(out.strip().splitlines()[-8:]))


def run(args: argparse.Namespace) -> int:
    """The check; 0 when it ran (whatever it found), 2 when it could not run here."""
    found = gpus()
    if not found:
        print("error: --dcgm needs an NVIDIA GPU: `nvidia-smi -L` lists none here (no driver, or no GPU). Run it on a "
              "GPU node (the first run on AWS: docs/observability.md, 'To check on a GPU')", flush=True)
        return 2
    missing = [tool for tool in ("dcgmi", "setpriv", *(() if args.dcgm_hostengine else ("nv-hostengine",)))
               if not shutil.which(tool)]
    if missing:
        print(f"error: --dcgm needs {', '.join(missing)} on PATH: {INSTALL_HINT}", flush=True)
        return 2
    print("GPUs: " + "; ".join(found))
    counters = list(EXPORTER_COUNTERS)
    fields = [name for name, _ in counters]
    engine, hostengine = None, args.dcgm_hostengine
    if hostengine is None:
        port = _free_port()
        hostengine = f"127.0.0.1:{port}"
        pid_file = tempfile.NamedTemporaryFile(suffix=".pid", delete=False).name  # not /var/run: any user
        engine = subprocess.Popen(["nv-hostengine", "-n", "-b", "127.0.0.1", "--port", str(port), "--pid", pid_file],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if not _wait_listening("127.0.0.1", port, HOSTENGINE_START_S):
            engine.kill()
            print(f"error: nv-hostengine did not listen on {hostengine} within {HOSTENGINE_START_S:g} s:\n"
                  + (engine.communicate()[0] or "")[-2000:], flush=True)
            return 2
        with open(f"/proc/{engine.pid}/status") as status:
            print(f"host engine: started nv-hostengine on {hostengine} (pid {engine.pid}, CapEff "
                  f"{capabilities(status.read()):#x}: it holds the GPUs, as the node monitoring agent's does)")
    else:
        print(f"host engine: {hostengine} (given)")
    load = Load()
    try:
        client_caps = capabilities(subprocess.run([*DROP_ALL_CAPS, "cat", "/proc/self/status"], capture_output=True,
                                                  text=True, timeout=30, check=True).stdout)
        print(f"client: dcgmi under `{' '.join(DROP_ALL_CAPS[:-1])}`: CapEff {client_caps:#x}"
              + (" (no capabilities, SYS_ADMIN included)" if client_caps == 0 else " (NOT empty)"))
        load.start()
        time.sleep(2 if load.stop else 0)  # let the load reach the GPU before the first sample
        ids = ",".join(str(FIELD_IDS[f]) for f in fields)
        dmon = subprocess.run([*DROP_ALL_CAPS, "dcgmi", "dmon", "--host", hostengine, "-e", ids,
                               "-c", str(args.dcgm_samples), "-d", "1000"],
                              capture_output=True, text=True, timeout=60 + 2 * args.dcgm_samples)
        load.end()
        if load.note:
            print(f"load: {load.note}")
        values = parse_dmon(dmon.stdout, fields)
        if not any(values.values()):
            print(f"error: dcgmi dmon gave no rows (exit {dmon.returncode}):\n{dmon.stdout[-2000:]}"
                  f"{dmon.stderr[-2000:]}", flush=True)
            return 2
        served = [f for f in fields if arrived(values[f])]
        for field in fields:
            kind = "profiling" if is_profiling(field) else "device"
            state = "served" if field in served else "N/A"
            print(f"  {field:42s} {FIELD_IDS[field]:5d} {kind:9s} {state:6s} {' '.join(values[field][-3:])}")
        profiling = [f for f in fields if is_profiling(f)]
        got = [f for f in profiling if f in served]
        print(f"without SYS_ADMIN (client CapEff {client_caps:#x}): {len(served)} of {len(fields)} exporter fields "
              f"served; profiling (DCGM_FI_PROF_*) {len(got)} of {len(profiling)}; dashboard fields "
              + ", ".join(f"{f} {'served' if f in served else 'N/A'}" for f in DASHBOARD_FIELDS))
        exporter = _exporter_metrics(hostengine, counters)
        if exporter["ran"]:
            print(f"dcgm-exporter (no capabilities, -r {hostengine}): serves {len(exporter['served'])} of "
                  f"{len(counters)}; missing: {', '.join(exporter['missing']) or 'none'}")
        else:
            print(f"dcgm-exporter: {exporter['note']}")
        print(json.dumps({
            "gpus": found, "hostengine": hostengine, "hostengine_started": engine is not None,
            "client_cap_eff": client_caps, "samples": args.dcgm_samples, "load": load.note,
            "served": served, "not_served": [f for f in fields if f not in served],
            "profiling_served": got, "profiling_not_served": [f for f in profiling if f not in served],
            "exporter": exporter,
        }))
        return 0
    finally:
        load.end()
        if engine is not None:
            engine.terminate()
            try:
                engine.wait(timeout=15)
            except subprocess.TimeoutExpired:
                engine.kill()
                engine.wait()
