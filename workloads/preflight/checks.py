"""Per-worker preflight checks: pure decisions over gathered facts, and the thin layer that gathers them.

Every `check_*` function takes plain values (text, numbers, lists) so the tests can feed it output
written by hand; `gather_facts()` is the only code that touches the real system. Each failed check
says what is wrong and how to fix it (which manifest field, node label, add-on or variable-file field).
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import resource
import shutil
import socket
import subprocess
from dataclasses import asdict, dataclass, field

from config.k8s import (
    EFA_PRESENT_LABEL,
    EFA_RESOURCE,
    GPU_PRESENT_LABEL,
    GPU_RESOURCE,
    HUGEPAGES_RESOURCE,
    NODE_NAME_ENV,
)

# The pod's hugetlb cgroup limit for 2 MiB pages (bytes, or "max"): kubelet sets it from the
# container's hugepages-2Mi limit, and to 0 when the pod requests none, whatever the node has free.
HUGETLB_FILES = (
    "/sys/fs/cgroup/hugetlb.2MB.max",  # cgroup v2
    "/sys/fs/cgroup/hugetlb/hugetlb.2MB.limit_in_bytes",  # cgroup v1
)
UVERBS_GLOB = "/dev/infiniband/uverbs*"
LIBFABRIC = "libfabric.so.1"
# The EFA installer's prefix; used when the image does not put it on PATH / LD_LIBRARY_PATH.
EFA_PREFIX = "/opt/amazon/efa"
# Where the EFA installer and the DLC image put aws-ofi-nccl; NCCL itself looks up
# libnccl-net.so / libnccl-net-<NCCL_NET_PLUGIN>.so on the loader path, so LD_LIBRARY_PATH is searched too.
PLUGIN_DIRS = (
    "/opt/amazon/ofi-nccl/lib",
    "/opt/amazon/ofi-nccl/lib64",
    "/opt/amazon/aws-ofi-nccl/lib",
    "/opt/aws-ofi-nccl/lib",
    "/usr/local/lib",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
)
PLUGIN_GLOB = "libnccl-net*.so*"
# libfabric's EFA provider pins every registered buffer; a finite limit (docker's 64 KiB or 8 MiB
# default) makes fi_mr_reg fail with ENOMEM and NCCL quietly falls back to sockets or aborts.
MIN_MEMLOCK_BYTES = 1 << 40
# Bit of CAP_IPC_LOCK in a capability mask (linux/capability.h).
CAP_IPC_LOCK = 14


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    """The outcome of one check: `status` is PASS, FAIL or SKIP; a FAIL carries the fix."""

    name: str
    status: str
    detail: str
    fix: str = ""

    @property
    def ok(self) -> bool:
        """False only for a failed check (a skipped check is not a failure)."""
        return self.status != "FAIL"


def passed(name: str, detail: str) -> CheckResult:
    """A passed check."""
    return CheckResult(name=name, status="PASS", detail=detail)


def failed(name: str, detail: str, fix: str) -> CheckResult:
    """A failed check with what to do about it."""
    return CheckResult(name=name, status="FAIL", detail=detail, fix=fix)


def skipped(name: str, detail: str) -> CheckResult:
    """A check that does not apply here (e.g. EFA checks for socket transport)."""
    return CheckResult(name=name, status="SKIP", detail=detail)


@dataclass(frozen=True, kw_only=True)
class Expectation:
    """What one worker should see, derived from the variable file (see `expectation()`)."""

    gpus: tuple[int, ...]
    """Acceptable visible-GPU counts (one per worker group; Ray Train shares a pod's GPUs among its workers)."""
    efa: bool
    """EFA transport expected: EFA devices, libfabric and aws-ofi-nccl are required."""
    efa_devices: int
    """`vpc.amazonaws.com/efa` devices each pod requests (smallest over the worker groups)."""
    shm_gib: int
    """Minimum /dev/shm size, GiB."""
    hugepages_mib: int
    """Minimum free 2 MiB huge pages, MiB (0: not needed)."""
    gpudirect_rdma: bool
    """Whether every worker group's instance type has GPUDirect RDMA."""


@dataclass(kw_only=True)
class WorkerFacts:
    """Everything the checks need from one worker, gathered by `gather_facts()` (JSON-serialisable)."""

    host: str
    visible_gpus: int
    uverbs: list[str] = field(default_factory=list)
    fi_info: str | None = None
    """Output of `fi_info -p efa` (None when the tool is not installed)."""
    fi_info_error: str = ""
    libfabric_error: str | None = None
    """None when libfabric loaded, else the loader's message."""
    plugin_paths: list[str] = field(default_factory=list)
    plugin_error: str | None = None
    """None when an aws-ofi-nccl plugin loaded, else why not."""
    node: str = ""
    """The Kubernetes node (env K8S_NODE_NAME from the Downward API), else the hostname."""
    shm_total_bytes: int = 0
    meminfo: str = ""
    hugetlb_limit: str | None = None
    """Text of the first of `HUGETLB_FILES` that exists (None: no hugetlb cgroup controller visible)."""
    hugetlb_file: str = ""
    memlock_soft: int = 0
    cap_eff: int = 0
    """Effective capabilities of this process (/proc/self/status CapEff)."""
    device_rdma_env: str | None = None


# ---- pure checks --------------------------------------------------------------------------------


def check_gpus(visible: int, expected: tuple[int, ...], *, local: bool) -> CheckResult:
    """Visible GPUs equal what the pod requests (CPU-only local runs skip this)."""
    name = "gpus"
    if local:
        return skipped(name, f"local CPU run ({visible} GPU(s) visible)")
    want = " or ".join(str(n) for n in sorted(set(expected)))
    if visible in expected:
        return passed(name, f"{visible} visible")
    return failed(name, f"{visible} GPU(s) visible, expected {want}",
                  f"the worker pod must request {GPU_RESOURCE}: {want} (set from cluster.worker_groups[].gpus_per_pod) "
                  f"and the NVIDIA device plugin DaemonSet must run on the node (node label {GPU_PRESENT_LABEL}=true); "
                  "check `kubectl describe node` shows nvidia.com/gpu allocatable")


def check_efa_devices(uverbs: list[str], expected: int, *, efa: bool) -> CheckResult:
    """The pod sees at least the EFA devices it requests (`/dev/infiniband/uverbsN`)."""
    name = "efa-devices"
    if not efa:
        return skipped(name, "transport is not efa")
    need = max(expected, 1)
    if len(uverbs) >= need:
        return passed(name, f"{len(uverbs)} device(s): {', '.join(sorted(uverbs))}")
    missing = f"/dev/infiniband/uverbs{len(uverbs)}"
    return failed(name, f"EFA device {missing} missing ({len(uverbs)} of {need} present): the pod has no "
                  f"{EFA_RESOURCE} device",
                  f"the worker pod must request {EFA_RESOURCE}: {need} (resources.limits, with nccl.transport: efa) "
                  f"and the EFA device plugin DaemonSet (aws-efa-k8s-device-plugin) must run on the node "
                  f"(node label {EFA_PRESENT_LABEL}=true) and the node group must launch with EFA interfaces; "
                  "or set nccl.transport: socket")


def parse_fi_info(text: str) -> list[dict[str, str]]:
    """Parse `fi_info` output into one dict per listed endpoint (provider, fabric, domain, type, ...)."""
    entries: list[dict[str, str]] = []
    for line in text.splitlines():
        match = re.match(r"^\s*(provider|fabric|domain|version|type|protocol):\s*(\S.*?)\s*$", line)
        if not match:
            continue
        key, value = match.groups()
        if key == "provider":
            entries.append({})
        if entries:
            entries[-1][key] = value
    return entries


def check_fi_info(output: str | None, *, efa: bool, error: str = "") -> CheckResult:
    """`fi_info -p efa` offers a reliable-datagram (FI_EP_RDM) endpoint of the efa provider."""
    name = "fi_info-efa-rdm"
    if not efa:
        return skipped(name, "transport is not efa")
    fix = ("use an image with the EFA installer's libfabric (the DLC image has it under /opt/amazon/efa) and give "
           f"the pod the EFA device ({EFA_RESOURCE}); an empty list usually means no EFA device in the pod")
    if output is None:
        return failed(name, f"fi_info not found or failed{': ' + error if error else ''}", fix)
    rdm = [e for e in parse_fi_info(output) if e.get("provider") == "efa" and e.get("type") == "FI_EP_RDM"]
    if rdm:
        fabrics = sorted({e.get("fabric", "?") for e in rdm})
        domains = sorted({e.get("domain", "?") for e in rdm})
        return passed(name, f"{len(rdm)} RDM endpoint(s), fabric {'/'.join(fabrics)}, domain {', '.join(domains)}")
    return failed(name, "fi_info -p efa lists no FI_EP_RDM endpoint" + (f" ({error.strip()})" if error else ""), fix)


def check_library(name: str, error: str | None, *, efa: bool, fix: str) -> CheckResult:
    """A shared library the EFA path needs loads (`error` is None when it did)."""
    if not efa:
        return skipped(name, "transport is not efa")
    if error is None:
        return passed(name, "loadable")
    return failed(name, error, fix)


def check_shm(total_bytes: int, required_gib: int) -> CheckResult:
    """/dev/shm is at least the derived size (NCCL's intra-node buffers live there)."""
    name = "dev-shm"
    have = total_bytes / 2**30
    if required_gib <= 0:
        return passed(name, f"{have:.1f} GiB (no minimum locally)")
    if total_bytes >= required_gib * 2**30:
        return passed(name, f"{have:.1f} GiB (need {required_gib} GiB)")
    return failed(name, f"/dev/shm is {have:.2f} GiB, need {required_gib} GiB (the container default is 64 MiB)",
                  "mount a memory-backed emptyDir at /dev/shm with sizeLimit from the derived shm size "
                  "(worker pod template volumes; regenerate the manifests with cdk8s synth)")


def parse_meminfo(text: str) -> dict[str, int]:
    """`/proc/meminfo` as numbers (kB values stay in kB, page counts stay counts)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        match = re.match(r"^(\w+):\s+(\d+)", line)
        if match:
            out[match.group(1)] = int(match.group(2))
    return out


def parse_hugetlb_limit(text: str | None) -> int | None:
    """The hugetlb cgroup limit in bytes; None when unlimited ("max" in v2, or v1's near-2^63 default)."""
    if text is None:
        return None
    value = text.strip()
    if value == "max" or not value.isdigit():
        return None
    number = int(value)
    return None if number >= 1 << 62 else number


def check_hugepages(meminfo: str, required_mib: int, *, cgroup_limit: str | None = None,
                    cgroup_file: str = "") -> CheckResult:
    """Enough 2 MiB huge pages for libfabric's EFA bounce buffers, as this pod can use them.

    Usable = min(the pod's hugetlb cgroup limit, the node's free pages): `/proc/meminfo` is node-wide,
    so a pod without a `hugepages-2Mi` request sees the node's free pages but its cgroup limit is 0
    and libfabric's mmap fails. `cgroup_limit` is the text of `cgroup_file` (None: not readable, the
    node figure alone decides).
    """
    name = HUGEPAGES_RESOURCE
    if required_mib <= 0:
        return skipped(name, "not needed without EFA")
    info = parse_meminfo(meminfo)
    size_kb = info.get("Hugepagesize", 0)
    node_free_mib = info.get("HugePages_Free", 0) * size_kb // 1024
    limit = parse_hugetlb_limit(cgroup_limit)
    fix = (f"request {HUGEPAGES_RESOURCE}: {required_mib}Mi in the worker pod's resources.limits (the charts set it "
           "when nccl.transport: efa; regenerate the manifests) and reserve the pages on the node with "
           "vm.nr_hugepages (set by the node group's launch template user data)")
    if size_kb != 2048:
        return failed(name, f"huge page size is {size_kb} kB, libfabric's EFA provider uses 2048 kB pages", fix)
    if cgroup_limit is None:
        where = f"node {node_free_mib} MiB free (no hugetlb cgroup limit readable)"
        usable = node_free_mib
    else:
        limit_text = "unlimited" if limit is None else f"{limit // 2**20} MiB"
        where = f"pod limit {limit_text} ({cgroup_file or 'hugetlb cgroup'}), node {node_free_mib} MiB free"
        usable = node_free_mib if limit is None else min(limit // 2**20, node_free_mib)
    if usable >= required_mib:
        return passed(name, f"{usable} MiB usable: {where} (need {required_mib} MiB)")
    if limit is not None and limit // 2**20 < required_mib:
        cause = f"the pod may use {limit // 2**20} MiB of 2 MiB huge pages (no {HUGEPAGES_RESOURCE} request?)"
    else:
        cause = f"the node has {node_free_mib} MiB of 2 MiB huge pages free (vm.nr_hugepages too low or in use)"
    return failed(name, f"{cause}, need {required_mib} MiB: {where}", fix)


def cap_eff(status: str) -> int:
    """The effective capability mask from /proc/self/status text (`CapEff:` line, hex); 0 when absent."""
    match = re.search(r"^CapEff:\s*([0-9a-fA-F]+)\s*$", status, re.MULTILINE)
    return int(match.group(1), 16) if match else 0


def read_cap_eff() -> int:
    """This process's effective capabilities (0 where /proc is unreadable)."""
    try:
        with open("/proc/self/status") as fh:
            return cap_eff(fh.read())
    except OSError:
        return 0


def check_memlock(soft_limit: int, *, efa: bool, capabilities: int = 0) -> CheckResult:
    """libfabric may pin NCCL's buffers: RLIMIT_MEMLOCK unlimited (or >= 1 TiB), or CAP_IPC_LOCK effective.

    The kernel's memory registration (ib_umem_get, drivers/infiniband/core/umem.c, which the EFA driver's
    reg_mr calls) refuses a registration past RLIMIT_MEMLOCK only `!capable(CAP_IPC_LOCK)`. The capability
    counts only when effective: a container running as non-root loses added capabilities at exec (no
    ambient set), so the check reads CapEff, not the pod spec.
    """
    name = "memlock"
    if not efa:
        return skipped(name, "not needed without EFA")
    if soft_limit == resource.RLIM_INFINITY or soft_limit >= MIN_MEMLOCK_BYTES:
        return passed(name, "unlimited" if soft_limit == resource.RLIM_INFINITY else f"{soft_limit} bytes")
    if capabilities >> CAP_IPC_LOCK & 1:
        return passed(name, f"RLIMIT_MEMLOCK is {soft_limit} bytes, but CAP_IPC_LOCK is effective: "
                      "the kernel lets memory registration past the limit")
    return failed(name, f"RLIMIT_MEMLOCK is {soft_limit} bytes and CAP_IPC_LOCK is not effective; libfabric cannot "
                  "register NCCL's buffers (fi_mr_reg: Cannot allocate memory)",
                  "raise containers' memlock limit (this project's EFA launch templates set RLIMIT_MEMLOCK in "
                  "nodeadm's containerd baseRuntimeSpec; a custom AMI or launch template must keep it), or run the "
                  "worker as root with the IPC_LOCK capability added (the charts add it)")


def check_device_rdma(env_value: str | None, *, gpudirect_rdma: bool) -> CheckResult:
    """FI_EFA_USE_DEVICE_RDMA=1 only where the instance has GPUDirect RDMA (libfabric aborts otherwise)."""
    name = "device-rdma-env"
    if env_value == "1" and not gpudirect_rdma:
        return failed(name, "FI_EFA_USE_DEVICE_RDMA=1 but the instance type has no GPUDirect RDMA (g5/g6/g6e); "
                      "libfabric fails to register GPU memory",
                      "set cluster.worker_groups[].gpudirect_rdma: false (and remove FI_EFA_USE_DEVICE_RDMA from "
                      "the worker env / runtime env)")
    return passed(name, f"FI_EFA_USE_DEVICE_RDMA={env_value if env_value is not None else '(unset)'}")


def run_checks(facts: WorkerFacts, expect: Expectation, *, local: bool) -> list[CheckResult]:
    """All per-worker checks over gathered facts, in a stable order."""
    efa = expect.efa
    return [
        check_gpus(facts.visible_gpus, expect.gpus, local=local),
        check_efa_devices(facts.uverbs, expect.efa_devices, efa=efa),
        check_fi_info(facts.fi_info, efa=efa, error=facts.fi_info_error),
        check_library("libfabric", facts.libfabric_error, efa=efa,
                      fix="use an image with the EFA installer's libfabric on the loader path "
                          "(/opt/amazon/efa/lib; the DLC image has it) - do not pip-install another NCCL"),
        check_library("aws-ofi-nccl", facts.plugin_error, efa=efa,
                      fix="use an image with aws-ofi-nccl (libnccl-net-ofi.so under /opt/amazon/ofi-nccl/lib) on "
                          "LD_LIBRARY_PATH; without it NCCL falls back to TCP sockets"),
        check_shm(facts.shm_total_bytes, expect.shm_gib),
        check_hugepages(facts.meminfo, expect.hugepages_mib, cgroup_limit=facts.hugetlb_limit,
                        cgroup_file=facts.hugetlb_file),
        check_memlock(facts.memlock_soft, efa=efa, capabilities=facts.cap_eff),
        check_device_rdma(facts.device_rdma_env, gpudirect_rdma=expect.gpudirect_rdma),
    ]


def expectation(config, *, local: bool, efa: bool) -> Expectation:
    """What each worker should see, from the variable file; local runs need no GPUs and no /dev/shm size."""
    from config.model import EFA_HUGEPAGES_MIB_PER_POD

    groups = config.cluster.worker_groups
    resources = [config.pod_resources[g.name] for g in groups]
    return Expectation(
        gpus=tuple(sorted({r.gpus for r in resources})),
        efa=efa,
        # Locally the variable file's transport may be socket while EFA is asked for: require one device.
        efa_devices=max(1, min(r.efa_devices for r in resources)) if efa else 0,
        shm_gib=0 if local else min(r.shm_gib for r in resources),
        # libfabric's EFA provider wants its 2 MiB pages whatever the variable file's transport says.
        hugepages_mib=EFA_HUGEPAGES_MIB_PER_POD if efa else 0,
        gpudirect_rdma=all(config.instance(g).gpudirect_rdma for g in groups),
    )


# ---- gathering (the only code here that reads the system) ----------------------------------------


def _try_load(path: str, *fallbacks: str) -> str | None:
    """None when `path` (or, failing that, a fallback path) loads; else the loader's first message."""
    first = None
    for candidate in (path, *fallbacks):
        try:
            ctypes.CDLL(candidate)
        except OSError as exc:
            first = first or str(exc)
            continue
        return None
    return first


def find_plugins(extra_dirs: tuple[str, ...] = ()) -> list[str]:
    """aws-ofi-nccl plugin libraries in the usual install dirs and on LD_LIBRARY_PATH."""
    dirs = list(PLUGIN_DIRS) + [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d] + list(extra_dirs)
    found: list[str] = []
    for directory in dict.fromkeys(dirs):
        for path in sorted(glob.glob(os.path.join(directory, PLUGIN_GLOB))):
            if os.path.realpath(path) not in {os.path.realpath(p) for p in found}:
                found.append(path)
    return found


def node_name(hostname: str) -> str:
    """The node this pod runs on: env K8S_NODE_NAME (the charts set it from spec.nodeName), else `hostname`."""
    return os.environ.get(NODE_NAME_ENV) or hostname


def read_hugetlb_limit(files: tuple[str, ...] = HUGETLB_FILES) -> tuple[str | None, str]:
    """(text, path) of the first hugetlb 2 MiB limit file that can be read; (None, "") when none can."""
    for path in files:
        try:
            with open(path) as fh:
                return fh.read().strip(), path
        except OSError:
            continue
    return None, ""


def gather_facts(*, efa: bool) -> WorkerFacts:
    """Read this worker's system: GPUs, EFA devices, fi_info, libraries, /dev/shm, huge pages, memlock, env."""
    import torch

    host = socket.gethostname()
    facts = WorkerFacts(host=host, node=node_name(host),
                        visible_gpus=torch.cuda.device_count() if torch.cuda.is_available() else 0)
    facts.uverbs = sorted(glob.glob(UVERBS_GLOB))
    if efa:
        try:
            tool = shutil.which("fi_info") or os.path.join(EFA_PREFIX, "bin", "fi_info")
            proc = subprocess.run([tool, "-p", "efa"], capture_output=True, text=True, timeout=30)
            facts.fi_info = proc.stdout if proc.returncode == 0 else ""
            facts.fi_info_error = proc.stderr.strip()[-300:] if proc.returncode else ""
        except FileNotFoundError:
            facts.fi_info, facts.fi_info_error = None, "fi_info is not on PATH (no EFA installer in the image)"
        except subprocess.TimeoutExpired:
            facts.fi_info, facts.fi_info_error = None, "fi_info timed out"
        facts.libfabric_error = _try_load(LIBFABRIC, f"{EFA_PREFIX}/lib/{LIBFABRIC}", f"{EFA_PREFIX}/lib64/{LIBFABRIC}")
        facts.plugin_paths = find_plugins()
        if not facts.plugin_paths:
            facts.plugin_error = f"no {PLUGIN_GLOB} in {', '.join(PLUGIN_DIRS)} or LD_LIBRARY_PATH"
        else:
            errors = [e for e in (_try_load(p) for p in facts.plugin_paths) if e]
            facts.plugin_error = errors[0] if len(errors) == len(facts.plugin_paths) else None
    try:
        st = os.statvfs("/dev/shm")
        facts.shm_total_bytes = st.f_blocks * st.f_frsize
    except OSError:
        facts.shm_total_bytes = 0
    try:
        with open("/proc/meminfo") as fh:
            facts.meminfo = fh.read()
    except OSError:
        facts.meminfo = ""
    facts.hugetlb_limit, facts.hugetlb_file = read_hugetlb_limit()
    facts.memlock_soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    facts.cap_eff = read_cap_eff()
    facts.device_rdma_env = os.environ.get("FI_EFA_USE_DEVICE_RDMA")
    return facts


def facts_dict(facts: WorkerFacts) -> dict:
    """Facts as a JSON-friendly dict (meminfo trimmed to the huge-page lines)."""
    data = asdict(facts)
    data["meminfo"] = "\n".join(line for line in facts.meminfo.splitlines() if "Huge" in line or "MemAvail" in line)
    return data
