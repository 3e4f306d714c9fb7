"""Per-worker preflight checks on facts written here: each failure names the problem and the fix."""

from __future__ import annotations

import resource

import pytest

from config.model import EFA_HUGEPAGES_MIB_PER_POD
from tests.helpers import EXAMPLES, load_variant
from workloads.preflight.checks import (
    WorkerFacts,
    check_device_rdma,
    check_efa_devices,
    check_fi_info,
    check_gpus,
    check_hugepages,
    check_library,
    check_memlock,
    check_shm,
    expectation,
    parse_fi_info,
    run_checks,
)

# `fi_info -p efa` on a g6.12xlarge with libfabric 2.x: the efa-direct and efa RDM fabrics, plus DGRAM.
FI_INFO_EFA = """\
provider: efa
    fabric: efa-direct
    domain: rdmap0s26-rdm
    version: 201.0
    type: FI_EP_RDM
    protocol: FI_PROTO_EFA
provider: efa
    fabric: efa
    domain: rdmap0s26-rdm
    version: 201.0
    type: FI_EP_RDM
    protocol: FI_PROTO_EFA
provider: efa
    fabric: efa
    domain: rdmap0s26-dgrm
    version: 201.0
    type: FI_EP_DGRAM
    protocol: FI_PROTO_EFA
"""

FI_INFO_DGRAM_ONLY = FI_INFO_EFA.split("provider: efa\n    fabric: efa\n    domain: rdmap0s26-dgrm")[1]
FI_INFO_DGRAM_ONLY = "provider: efa\n    fabric: efa\n    domain: rdmap0s26-dgrm" + FI_INFO_DGRAM_ONLY

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
    assert [(e["fabric"], e["type"]) for e in entries] == [
        ("efa-direct", "FI_EP_RDM"), ("efa", "FI_EP_RDM"), ("efa", "FI_EP_DGRAM")]


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


def test_hugepages():
    assert check_hugepages(MEMINFO.format(free=5120), EFA_HUGEPAGES_MIB_PER_POD).status == "PASS"
    short = check_hugepages(MEMINFO.format(free=100), EFA_HUGEPAGES_MIB_PER_POD)
    assert short.status == "FAIL" and "200 MiB" in short.detail and "hugepages-2Mi" in short.fix
    big_pages = MEMINFO.format(free=5120).replace("2048 kB", "1048576 kB")
    assert "2048 kB" in check_hugepages(big_pages, 5120).detail
    assert check_hugepages("", 0).status == "SKIP"


def test_memlock():
    assert check_memlock(resource.RLIM_INFINITY, efa=True).status == "PASS"
    low = check_memlock(8 * 2**20, efa=True)
    assert low.status == "FAIL" and "8388608" in low.detail and "LimitMEMLOCK=infinity" in low.fix
    assert check_memlock(64 * 1024, efa=False).status == "SKIP"


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
                        memlock_soft=resource.RLIM_INFINITY, device_rdma_env=None)
    results = run_checks(facts, expectation(config, local=False, efa=efa), local=False)
    assert all(r.ok for r in results), [r for r in results if not r.ok]
    assert len(results) == 9
    broken = WorkerFacts(**{**facts.__dict__, "uverbs": [], "device_rdma_env": "1"})
    failed = {r.name for r in run_checks(broken, expectation(config, local=False, efa=efa), local=False)
              if not r.ok}
    assert failed == ({"efa-devices", "device-rdma-env"} if efa else {"device-rdma-env"})
