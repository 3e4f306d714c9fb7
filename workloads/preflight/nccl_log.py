"""Which network NCCL selected, read from its own INFO output (NCCL_DEBUG=INFO).

NCCL prints one `Using network <name>` line per communicator: `Libfabric` / `AWS Libfabric` when
the aws-ofi-nccl plugin loaded, `Socket` when it fell back to TCP. aws-ofi-nccl adds `NET/OFI`
lines naming the libfabric provider and fabric (`efa` / `efa-direct`). A plugin that failed to
load, or libfabric failing to pin memory (memlock), leaves its own lines; all are collected here.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from workloads.preflight.checks import CheckResult, failed, passed, skipped

_USING_NETWORK = re.compile(r"NCCL INFO Using network (?P<name>.+?)\s*$")
_OFI_VERSION = re.compile(r"NET/OFI Initializing aws-ofi-nccl (?P<version>\S+)")
# aws-ofi-nccl >= 1.14: "Selected provider is efa, fabric is efa-direct (found 1 nics)";
# older: "Selected Provider is efa (found 4 nics)".
_OFI_PROVIDER = re.compile(
    r"NET/OFI Selected [Pp]rovider is (?P<provider>[\w;-]+)(?:, fabric is (?P<fabric>[\w-]+))?"
    r"(?: \(found (?P<nics>\d+) nics?\))?"
)
_SOCKET = re.compile(r"NET/Socket : Using (?P<ifaces>.+?)\s*$")
_NCCL_VERSION = re.compile(r"NCCL version (?P<version>\S+)")
_PLUGIN_FAILED = (
    re.compile(r"NET/Plugin: Could not find: (?P<what>\S+)"),
    re.compile(r"NET/Plugin: Plugin load returned \d+ : (?P<what>.+)"),
    re.compile(r"(?P<what>Failed to initialize any NET plugin)"),
    re.compile(r"NET/OFI (?P<what>(?:aws-ofi-nccl initialization failed|Failed to initialize \S+ protocol).*)"),
    re.compile(r"fi_getinfo: provider efa (?P<what>output empty list)"),
)
_MEMLOCK = (
    re.compile(r"Unable to register (memory|MR)", re.I),
    re.compile(r"fi_mr_reg\w* failed", re.I),
    re.compile(r"ibv_reg_mr\w* failed.*Cannot allocate memory", re.I),
    re.compile(r"RLIMIT_MEMLOCK"),
    re.compile(r"Failed to register mr \[-12\]"),
)


@dataclass(kw_only=True)
class NcclNetwork:
    """What one or more NCCL logs say about the inter-node network."""

    network: str | None = None
    """The `Using network` name as printed (e.g. `Libfabric`, `AWS Libfabric`, `Socket`), None if absent."""
    nccl_version: str | None = None
    ofi_version: str | None = None
    """aws-ofi-nccl version, when the plugin initialised."""
    provider: str | None = None
    """libfabric provider aws-ofi-nccl selected (`efa` on EFA)."""
    fabric: str | None = None
    nics: int | None = None
    socket_ifaces: str | None = None
    plugin_errors: list[str] = field(default_factory=list)
    memlock_errors: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        """`efa` (aws-ofi-nccl over the efa provider), `ofi` (another provider), `socket`, or `unknown`."""
        name = (self.network or "").lower()
        if "libfabric" in name or "ofi" in name:
            return "efa" if (self.provider or "").startswith("efa") else "ofi"
        if name == "socket":
            return "socket"
        if name == "ib":
            return "ib"
        if self.provider and self.provider.startswith("efa"):
            return "efa"
        if self.socket_ifaces:
            return "socket"
        return "unknown"

    def summary(self) -> str:
        """One line: the network and how it was chosen."""
        kind = self.kind
        if kind in ("efa", "ofi"):
            nics = f", {self.nics} nic(s)" if self.nics is not None else ""
            text = (f"aws-ofi-nccl {self.ofi_version or '?'} provider {self.provider or '?'}, fabric "
                    f"{self.fabric or '?'}{nics} (Using network {self.network or '?'})")
        elif kind == "socket":
            text = f"NET/Socket on {self.socket_ifaces or '?'} (Using network {self.network or 'Socket'})"
        else:
            text = f"unknown (Using network {self.network})" if self.network else "unknown (no NCCL INFO lines)"
        if self.plugin_errors:
            text += f"; plugin: {self.plugin_errors[0]}"
        if self.memlock_errors:
            text += f"; memlock: {self.memlock_errors[0]}"
        return text

    def to_dict(self) -> dict:
        """JSON-friendly form, with the derived `kind`."""
        return {**asdict(self), "kind": self.kind}


def parse_nccl_log(text: str) -> NcclNetwork:
    """Parse NCCL (2.x) and aws-ofi-nccl INFO/WARN lines and libfabric warnings from one or more logs."""
    net = NcclNetwork()
    for raw in text.splitlines():
        line = raw.rstrip()
        if match := _USING_NETWORK.search(line):
            name = match.group("name")
            # A Socket line after a Libfabric one (another communicator) is the worse news: keep it.
            if net.network is None or name.lower() == "socket":
                net.network = name
        elif match := _OFI_VERSION.search(line):
            net.ofi_version = match.group("version")
        elif match := _OFI_PROVIDER.search(line):
            net.provider = match.group("provider")
            net.fabric = match.group("fabric") or net.fabric
            net.nics = int(match.group("nics")) if match.group("nics") else net.nics
        elif match := _SOCKET.search(line):
            net.socket_ifaces = match.group("ifaces")
        elif (match := _NCCL_VERSION.search(line)) and net.nccl_version is None:
            net.nccl_version = match.group("version")
        for pattern in _PLUGIN_FAILED:
            if match := pattern.search(line):
                net.plugin_errors.append(match.group("what").strip())
                break
        if any(p.search(line) for p in _MEMLOCK):
            net.memlock_errors.append(_trim(line))
    return net


def _trim(line: str) -> str:
    """Drop the `host:pid:tid [dev]` prefix NCCL puts on each line."""
    return re.sub(r"^\S+:\d+:\d+ \[\d+\] ", "", line).strip()[:200]


def check_network(net: NcclNetwork | None, expect: str | None) -> CheckResult:
    """NCCL used the expected transport: with EFA expected, aws-ofi-nccl over the efa provider, not sockets."""
    name = "nccl-network"
    if net is None:
        return skipped(name, "no NCCL communicator (gloo backend)")
    if net.memlock_errors:
        return failed(name, f"libfabric could not pin memory: {net.memlock_errors[0]}",
                      "raise containers' memlock limit (RLIMIT_MEMLOCK in nodeadm's containerd baseRuntimeSpec, as "
                      "this project's EFA launch templates set it) or keep IPC_LOCK effective (root), and give the "
                      "pod its hugepages-2Mi request")
    if expect != "efa":
        return passed(name, net.summary())
    if net.kind == "efa":
        return passed(name, net.summary())
    why = ""
    if net.plugin_errors:
        why = f" (aws-ofi-nccl did not load: {net.plugin_errors[0]})"
    return failed(name, f"EFA expected but NCCL selected {net.summary()}{why}",
                  "give the worker pod vpc.amazonaws.com/efa (nccl.transport: efa), keep aws-ofi-nccl on "
                  "LD_LIBRARY_PATH, do not set NCCL_NET=Socket, and check NCCL_SOCKET_IFNAME names the pod's "
                  "interface (eth0); or set nccl.transport: socket if EFA is not wanted")
