"""NCCL / aws-ofi-nccl / libfabric log parsing on log text in the NCCL 2.29 and aws-ofi-nccl 1.20 formats.

The samples follow the real line shapes (`host:pid:tid [cudaDev] NCCL INFO ...`, `NET/OFI ...` from the
plugin, `libfabric:pid:time:prov:subsys:func():line<level> ...` from libfabric); versions and addresses
are illustrative.
"""

from __future__ import annotations

from workloads.preflight.nccl_log import check_network, parse_nccl_log

EFA_SELECTED = """\
ray-gpu-worker-7xk2p:812:812 [0] NCCL INFO Bootstrap: Using eth0:10.0.1.23<0>
ray-gpu-worker-7xk2p:812:812 [0] NCCL INFO cudaDriverVersion 13000
ray-gpu-worker-7xk2p:812:812 [0] NCCL INFO NCCL version 2.29.2+cuda13.0
ray-gpu-worker-7xk2p:812:901 [0] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v10)
ray-gpu-worker-7xk2p:812:901 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.20.0
ray-gpu-worker-7xk2p:812:901 [0] NCCL INFO NET/OFI Using Libfabric version 2.3
ray-gpu-worker-7xk2p:812:901 [0] NCCL INFO NET/OFI Using CUDA driver version 13000 with runtime 13000
ray-gpu-worker-7xk2p:812:901 [0] NCCL INFO NET/OFI Configuring AWS-specific options
ray-gpu-worker-7xk2p:812:901 [0] NCCL INFO NET/OFI Setting provider_filter to efa
ray-gpu-worker-7xk2p:812:901 [0] NCCL INFO NET/OFI Internode latency set at 75.0 us
ray-gpu-worker-7xk2p:812:901 [0] NCCL INFO NET/OFI Using transport protocol SENDRECV
ray-gpu-worker-7xk2p:812:901 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 1 nics)
ray-gpu-worker-7xk2p:812:901 [0] NCCL INFO NET/OFI Creating one domain per process
ray-gpu-worker-7xk2p:812:901 [0] NCCL INFO Initialized NET plugin Libfabric
ray-gpu-worker-7xk2p:812:901 [0] NCCL INFO Assigned NET plugin Libfabric to comm
ray-gpu-worker-7xk2p:812:901 [0] NCCL INFO Using network Libfabric
ray-gpu-worker-7xk2p:812:901 [0] NCCL INFO ncclCommInitRankConfig comm 0x55d0c8 rank 0 nranks 8 cudaDev 0 \
nvmlDev 0 busId 38000 commId 0x8f1c2d3e4f5a6b7c - Init START
ray-gpu-worker-7xk2p:812:905 [0] NCCL INFO Channel 00/0 : 3[3] -> 4[0] [send] via NET/Libfabric/0
ray-gpu-worker-7xk2p:812:901 [0] NCCL INFO ncclCommInitRankConfig comm 0x55d0c8 rank 0 nranks 8 - Init COMPLETE
"""

# No vpc.amazonaws.com/efa in the pod: the plugin loads, libfabric finds no efa device, NCCL uses TCP.
SOCKET_FALLBACK = """\
ray-gpu-worker-9q4lm:77:77 [0] NCCL INFO NCCL version 2.29.2+cuda13.0
ray-gpu-worker-9q4lm:77:95 [0] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v10)
ray-gpu-worker-9q4lm:77:95 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.20.0
ray-gpu-worker-9q4lm:77:95 [0] NCCL INFO NET/OFI Using Libfabric version 2.3
libfabric:77:1764672000::core:core:fi_getinfo_():1392<warn> fi_getinfo: provider efa output empty list
ray-gpu-worker-9q4lm:77:95 [0] nccl_net_ofi_create_plugin:260 NCCL WARN NET/OFI Unable to find a protocol that \
worked.  Failing initialization.
ray-gpu-worker-9q4lm:77:95 [0] NCCL WARN NET/OFI aws-ofi-nccl initialization failed
ray-gpu-worker-9q4lm:77:95 [0] NCCL INFO NET/IB : No device found.
ray-gpu-worker-9q4lm:77:95 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.1.57<0>
ray-gpu-worker-9q4lm:77:95 [0] NCCL INFO Initialized NET plugin Socket
ray-gpu-worker-9q4lm:77:95 [0] NCCL INFO Using network Socket
ray-gpu-worker-9q4lm:77:99 [0] NCCL INFO Channel 00/0 : 3[3] -> 4[0] [send] via NET/Socket/0
"""

# The image lacks aws-ofi-nccl and NCCL_NET=Libfabric forces the plugin: NCCL cannot start at all.
PLUGIN_NOT_LOADED = """\
ray-gpu-worker-2b8vn:64:64 [0] NCCL INFO NCCL version 2.29.2+cuda13.0
ray-gpu-worker-2b8vn:64:81 [0] NCCL INFO NET/Plugin: Plugin load returned 2 : libnccl-net-ofi.so: cannot open \
shared object file: No such file or directory : when loading libnccl-net-ofi.so
ray-gpu-worker-2b8vn:64:81 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net-ofi.so.
ray-gpu-worker-2b8vn:64:81 [0] init.cc:231 NCCL WARN Failed to initialize any NET plugin
ray-gpu-worker-2b8vn:64:81 [0] NCCL INFO init.cc:1824 -> 2
"""

# Container memlock limit at docker's 8 MiB default: libfabric cannot pin NCCL's buffers.
MEMLOCK_ERROR = """\
ray-gpu-worker-5m3cd:812:812 [0] NCCL INFO NCCL version 2.29.2+cuda13.0
ray-gpu-worker-5m3cd:812:901 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.20.0
ray-gpu-worker-5m3cd:812:901 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 1 nics)
ray-gpu-worker-5m3cd:812:901 [0] NCCL INFO Using network Libfabric
libfabric:812:1764672010:efa:mr:efa_mr_reg_impl():1021<warn> Unable to register MR: Cannot allocate memory
ray-gpu-worker-5m3cd:812:905 [0] register_rail_mr_buffer:584 NCCL WARN NET/OFI Unable to register memory (type = 2) \
for device 0. RC: -12, Error: Cannot allocate memory
ray-gpu-worker-5m3cd:812:905 [0] NCCL INFO transport/net.cc:712 -> 2
"""

# aws-ofi-nccl before 1.14 and NCCL before 2.24 printed these shapes.
OLDER_FORMAT = """\
ip-10-0-1-23:6310:6318 [0] NCCL INFO NET/OFI Selected Provider is efa (found 4 nics)
ip-10-0-1-23:6310:6318 [0] NCCL INFO Using network AWS Libfabric
"""


def test_efa_selected():
    net = parse_nccl_log(EFA_SELECTED)
    assert net.kind == "efa"
    assert (net.network, net.provider, net.fabric, net.nics) == ("Libfabric", "efa", "efa-direct", 1)
    assert net.ofi_version == "1.20.0"
    assert net.nccl_version == "2.29.2+cuda13.0"
    assert net.plugin_errors == [] and net.memlock_errors == []
    assert "efa-direct" in net.summary() and "1.20.0" in net.summary()
    assert check_network(net, "efa").status == "PASS"


def test_socket_fallback_fails_when_efa_expected():
    net = parse_nccl_log(SOCKET_FALLBACK)
    assert net.kind == "socket"
    assert net.socket_ifaces == "[0]eth0:10.0.1.57<0>"
    assert "output empty list" in net.plugin_errors
    result = check_network(net, "efa")
    assert result.status == "FAIL"
    assert "Socket" in result.detail and "eth0" in result.detail
    assert "vpc.amazonaws.com/efa" in result.fix
    # The same log is fine when sockets are what the variable file asks for.
    assert check_network(net, "socket").status == "PASS"


def test_plugin_failed_to_load():
    net = parse_nccl_log(PLUGIN_NOT_LOADED)
    assert net.kind == "unknown"
    assert any("cannot open shared object file" in e for e in net.plugin_errors)
    assert "Failed to initialize any NET plugin" in net.plugin_errors
    result = check_network(net, "efa")
    assert result.status == "FAIL" and "did not load" in result.detail


def test_memlock_error_fails_even_with_efa_selected():
    net = parse_nccl_log(MEMLOCK_ERROR)
    assert net.kind == "efa"
    assert len(net.memlock_errors) == 2
    assert net.memlock_errors[1].startswith("register_rail_mr_buffer:584 NCCL WARN NET/OFI Unable to register memory")
    result = check_network(net, "efa")
    assert result.status == "FAIL"
    assert "memlock" in result.fix


def test_ibv_reg_mr_enomem_is_a_memlock_error():
    line = ("host:1:2 [0] misc/ibvwrap.cc:278 NCCL WARN Call to ibv_reg_mr_iova2 failed with error "
            "Cannot allocate memory")
    assert parse_nccl_log(line).memlock_errors


def test_older_format_and_mixed_communicators():
    net = parse_nccl_log(OLDER_FORMAT)
    assert (net.kind, net.network, net.provider, net.fabric, net.nics) == ("efa", "AWS Libfabric", "efa", None, 4)
    # One communicator on EFA and another on sockets is a socket result: the slow path exists.
    assert parse_nccl_log(EFA_SELECTED + SOCKET_FALLBACK).kind == "socket"


def test_no_nccl_lines():
    net = parse_nccl_log("some unrelated output\n")
    assert net.kind == "unknown"
    assert check_network(net, "efa").status == "FAIL"
    assert check_network(None, "efa").status == "SKIP"
