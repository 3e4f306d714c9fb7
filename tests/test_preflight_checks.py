"""Per-worker preflight checks on facts written here: each failure names the problem and the fix."""

from __future__ import annotations

import resource

import pytest

from config.model import EFA_HUGEPAGES_MIB_PER_POD
from tests.helpers import EXAMPLES, load_variant
from workloads.preflight.checks import (
    WorkerFacts,
    cap_eff,
    check_device_rdma,
    check_efa_devices,
    check_fi_info,
    check_gpus,
    check_hugepages,
    check_library,
    check_memlock,
    check_shm,
    expectation,
    node_name,
    parse_fi_info,
    parse_hugetlb_limit,
    read_cap_eff,
    read_hugetlb_limit,
    run_checks,
)


def fi_info(*endpoints: tuple[str, str, str]) -> str:
    """`fi_info -p efa` text with one block per (fabric, domain suffix, endpoint type)."""
    return "".join(f"provider: efa\n    fabric: {fabric}\n    domain: rdmap0s26-{suffix}\n    version: 201.0\n"
                   f"    type: {ep_type}\n    protocol: FI_PROTO_EFA\n" for fabric, suffix, ep_type in endpoints)


# `fi_info -p efa` on a g6.12xlarge with libfabric 2.x: the efa-direct and efa RDM fabrics, plus DGRAM.
FI_INFO_EFA = fi_info(("efa-direct", "rdm", "FI_EP_RDM"), ("efa", "rdm", "FI_EP_RDM"), ("efa", "dgrm", "FI_EP_DGRAM"))
FI_INFO_DGRAM_ONLY = fi_info(("efa", "dgrm", "FI_EP_DGRAM"))

MEMINFO = """\
MemTotal:       195881088 kB
MemAvailable:   181000000 kB
HugePages_Total:    5120
HugePages_Free:     {free}
HugePages_Rsvd:        0
Hugepagesize:       2048 kB
"""


def test_parse_fi_info():
    entries = parse_fi_info(FI_INFO_EFA)
    assert [(e["fabric"], e["domain"], e["type"]) for e in entries] == [
        ("efa-direct", "rdmap0s26-rdm", "FI_EP_RDM"), ("efa", "rdmap0s26-rdm", "FI_EP_RDM"),
        ("efa", "rdmap0s26-dgrm", "FI_EP_DGRAM")]
    assert FI_INFO_EFA.startswith("provider: efa\n    fabric: efa-direct\n")


def test_fi_info_rdm_required():
    assert check_fi_info(FI_INFO_EFA, efa=True).status == "PASS"
    dgram = check_fi_info(FI_INFO_DGRAM_ONLY, efa=True)
    assert dgram.status == "FAIL" and "FI_EP_RDM" in dgram.detail
    missing = check_fi_info(None, efa=True, error="fi_info is not on PATH")
    assert missing.status == "FAIL" and "not on PATH" in missing.detail and "vpc.amazonaws.com/efa" in missing.fix
    assert check_fi_info(None, efa=False).status == "SKIP"


def test_efa_devices_missing_names_device_and_resource():
    result = check_efa_devices([], 1, efa=True)
    assert result.status == "FAIL"
    assert "/dev/infiniband/uverbs0" in result.detail
    assert "vpc.amazonaws.com/efa" in result.detail
    assert "aws-efa-k8s-device-plugin" in result.fix and "vpc.amazonaws.com/efa.present=true" in result.fix
    # p5: 32 interfaces requested, only 4 mounted; the next missing device is named.
    assert "/dev/infiniband/uverbs4" in check_efa_devices([f"/dev/infiniband/uverbs{i}" for i in range(4)], 32,
                                                          efa=True).detail
    assert check_efa_devices(["/dev/infiniband/uverbs0"], 1, efa=True).status == "PASS"
    assert check_efa_devices([], 0, efa=False).status == "SKIP"


def test_gpus():
    assert check_gpus(4, (4,), local=False).status == "PASS"
    wrong = check_gpus(0, (4,), local=False)
    assert wrong.status == "FAIL" and "nvidia.com/gpu: 4" in wrong.fix and "nvidia.com/gpu.present=true" in wrong.fix
    assert check_gpus(0, (4,), local=True).status == "SKIP"


def test_shm():
    assert check_shm(64 * 2**20, 11).status == "FAIL"
    assert "64 MiB" in check_shm(64 * 2**20, 11).detail
    assert check_shm(12 * 2**30, 11).status == "PASS"
    assert "emptyDir" in check_shm(0, 1).fix


def test_hugepages_node_figures():
    assert check_hugepages(MEMINFO.format(free=5120), EFA_HUGEPAGES_MIB_PER_POD).status == "PASS"
    short = check_hugepages(MEMINFO.format(free=100), EFA_HUGEPAGES_MIB_PER_POD)
    assert short.status == "FAIL" and "200 MiB" in short.detail and "hugepages-2Mi" in short.fix
    assert "vm.nr_hugepages" in short.detail and "vm.nr_hugepages" in short.fix
    big_pages = MEMINFO.format(free=5120).replace("2048 kB", "1048576 kB")
    assert "2048 kB" in check_hugepages(big_pages, 5120).detail
    assert check_hugepages("", 0).status == "SKIP"


V2 = "/sys/fs/cgroup/hugetlb.2MB.max"
V1 = "/sys/fs/cgroup/hugetlb/hugetlb.2MB.limit_in_bytes"


# node_free and usable in MiB; the limit is the cgroup file's text (bytes or "max").
@pytest.mark.parametrize(("limit", "path", "node_free", "status", "usable"), [
    # A pod that requested no hugepages-2Mi: kubelet sets its limit to 0 while the node has 10 GiB free.
    ("0", V2, 10240, "FAIL", 0),
    ("0", V1, 10240, "FAIL", 0),
    # Requested 5Gi, as the charts do for nccl.transport: efa.
    (str(5 * 2**30), V2, 10240, "PASS", 5120),
    (str(5 * 2**30), V1, 10240, "PASS", 5120),
    # A smaller request than needed.
    (str(2**30), V2, 10240, "FAIL", 1024),
    # Unlimited cgroup (v2 "max", v1's default near 2^63): the node's free pages decide.
    ("max", V2, 10240, "PASS", 10240),
    ("9223372036854771712", V1, 10240, "PASS", 10240),
    ("max", V2, 200, "FAIL", 200),
    # The pod may use 5 GiB, but the node has only 200 MiB free: min() of the two.
    (str(5 * 2**30), V2, 200, "FAIL", 200),
])
def test_hugepages_pod_cgroup_limit(limit, path, node_free, status, usable):
    result = check_hugepages(MEMINFO.format(free=node_free // 2), EFA_HUGEPAGES_MIB_PER_POD, cgroup_limit=limit + "\n",
                             cgroup_file=path)
    assert result.status == status, result
    assert path in result.detail
    if status == "PASS":
        assert f"{usable} MiB usable" in result.detail
    else:
        assert f"need {EFA_HUGEPAGES_MIB_PER_POD} MiB" in result.detail
        assert "hugepages-2Mi: 5120Mi" in result.fix and "nccl.transport: efa" in result.fix
        assert "vm.nr_hugepages" in result.fix and "user data" in result.fix
        if limit == "0" or limit == str(2**30):
            assert f"the pod may use {usable} MiB" in result.detail and "no hugepages-2Mi request" in result.detail
        else:
            assert f"the node has {usable} MiB" in result.detail


def test_parse_hugetlb_limit():
    assert parse_hugetlb_limit("max\n") is None
    assert parse_hugetlb_limit("9223372036854771712") is None
    assert parse_hugetlb_limit(None) is None
    assert parse_hugetlb_limit("0\n") == 0
    assert parse_hugetlb_limit("5368709120") == 5 * 2**30


def test_read_hugetlb_limit_first_readable_file(tmp_path):
    v2, v1 = tmp_path / "hugetlb.2MB.max", tmp_path / "hugetlb.2MB.limit_in_bytes"
    v1.write_text("0\n")
    assert read_hugetlb_limit((str(v2), str(v1))) == ("0", str(v1))
    v2.write_text("max\n")
    assert read_hugetlb_limit((str(v2), str(v1))) == ("max", str(v2))
    assert read_hugetlb_limit((str(tmp_path / "absent"),)) == (None, "")


def test_node_name_from_downward_api(monkeypatch):
    monkeypatch.setenv("K8S_NODE_NAME", "ip-10-0-1-23.ec2.internal")
    assert node_name("finetune-gpu-worker-1") == "ip-10-0-1-23.ec2.internal"
    monkeypatch.delenv("K8S_NODE_NAME")
    assert node_name("laptop") == "laptop"


def test_memlock():
    assert check_memlock(resource.RLIM_INFINITY, efa=True).status == "PASS"
    low = check_memlock(8 * 2**20, efa=True)
    assert low.status == "FAIL" and "8388608" in low.detail and "baseRuntimeSpec" in low.fix
    assert check_memlock(64 * 1024, efa=False).status == "SKIP"


# /proc/self/status of a root container with docker's default set plus IPC_LOCK (bit 14), and without it.
STATUS_IPC_LOCK = "Name:\tpython\nCapInh:\t0000000000000000\nCapPrm:\t00000000a80465fb\nCapEff:\t00000000a80465fb\n"
STATUS_DEFAULT = "Name:\tpython\nCapPrm:\t00000000a80425fb\nCapEff:\t00000000a80425fb\n"
# A non-root process: IPC_LOCK is in the bounding set, but exec cleared the effective set.
STATUS_NON_ROOT = "Name:\tpython\nCapEff:\t0000000000000000\nCapBnd:\t00000000a80465fb\n"


def test_memlock_passes_on_the_launch_templates_finite_limit():
    # stacks/launch_template.py sets 2**53 bytes (float64-exact through nodeadm's merge).
    assert check_memlock(2**53, efa=True).status == "PASS"


def test_memlock_passes_below_the_limit_with_effective_ipc_lock():
    result = check_memlock(8 * 2**20, efa=True, capabilities=cap_eff(STATUS_IPC_LOCK))
    assert result.status == "PASS" and "CAP_IPC_LOCK is effective" in result.detail


def test_memlock_fails_below_the_limit_without_ipc_lock():
    result = check_memlock(8 * 2**20, efa=True, capabilities=cap_eff(STATUS_DEFAULT))
    assert result.status == "FAIL" and "CAP_IPC_LOCK is not effective" in result.detail


def test_memlock_ignores_ipc_lock_that_is_only_bounding():
    assert check_memlock(8 * 2**20, efa=True, capabilities=cap_eff(STATUS_NON_ROOT)).status == "FAIL"


def test_cap_eff_reads_the_hex_mask_and_is_zero_when_missing():
    assert cap_eff(STATUS_IPC_LOCK) == 0xA80465FB
    assert cap_eff("Name:\tpython\n") == 0


def test_gather_reads_this_process_cap_eff():
    with open("/proc/self/status") as fh:
        assert read_cap_eff() == cap_eff(fh.read())


def test_device_rdma_only_with_gpudirect():
    bad = check_device_rdma("1", gpudirect_rdma=False)
    assert bad.status == "FAIL" and "gpudirect_rdma: false" in bad.fix
    assert check_device_rdma("1", gpudirect_rdma=True).status == "PASS"
    assert check_device_rdma(None, gpudirect_rdma=False).status == "PASS"
    assert check_device_rdma("0", gpudirect_rdma=False).status == "PASS"


def test_library():
    assert check_library("libfabric", None, efa=True, fix="x").status == "PASS"
    result = check_library("libfabric", "libfabric.so.1: cannot open shared object file", efa=True, fix="install")
    assert result.status == "FAIL" and result.fix == "install"


def test_expectation_from_variable_file(tmp_path):
    default = load_variant(tmp_path)
    expect = expectation(default, local=False, efa=default.nccl.transport == "efa")
    res = default.pod_resources["gpu"]
    assert expect.gpus == (res.gpus,) == (4,)
    assert expect.efa and expect.efa_devices == res.efa_devices == 1
    assert expect.shm_gib == res.shm_gib > 0
    assert expect.hugepages_mib == res.hugepages_2mi_mib
    assert expect.gpudirect_rdma is False
    p5 = load_variant(tmp_path, base=EXAMPLES / "p5.yaml", name="p5.yaml")
    assert expectation(p5, local=False, efa=True).gpudirect_rdma is True
    local = expectation(default, local=True, efa=False)
    assert (local.efa, local.shm_gib, local.hugepages_mib) == (False, 0, 0)


@pytest.mark.parametrize("efa", [True, False])
def test_run_checks_healthy_g6_worker(tmp_path, efa):
    config = load_variant(tmp_path)
    facts = WorkerFacts(host="ray-gpu-worker-0", visible_gpus=4, uverbs=["/dev/infiniband/uverbs0"],
                        fi_info=FI_INFO_EFA, shm_total_bytes=64 * 2**30, meminfo=MEMINFO.format(free=5120),
                        hugetlb_limit=str(5 * 2**30), hugetlb_file=V2, memlock_soft=resource.RLIM_INFINITY,
                        device_rdma_env=None)
    results = run_checks(facts, expectation(config, local=False, efa=efa), local=False)
    assert all(r.ok for r in results), [r for r in results if not r.ok]
    assert len(results) == 9
    # The node has free huge pages, but this pod requested none: its hugetlb cgroup limit is 0.
    broken = WorkerFacts(**{**facts.__dict__, "uverbs": [], "device_rdma_env": "1", "hugetlb_limit": "0"})
    failed = {r.name for r in run_checks(broken, expectation(config, local=False, efa=efa), local=False)
              if not r.ok}
    assert failed == ({"efa-devices", "device-rdma-env", "hugepages-2Mi"} if efa else {"device-rdma-env"})
