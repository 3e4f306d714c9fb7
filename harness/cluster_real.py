"""Whether the real-node tier (tests/cluster_real, `make cluster-real`) can run on this machine: what its test
skips on and what bench/cluster_real.py checks before timing it, in one place."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("CLUSTER_REAL_SHARED", REPO.parent / "shared"))
LAB_SCRIPT = SHARED / "k8s" / "lab"
NODE_SCRIPT = SHARED / "k8s-node" / "node"
HOW_TO_GET = (
    "make cluster-real needs ../shared/k8s (the control plane + KubeRay 1.7.0 lab) and ../shared/k8s-node (kubelet "
    "v1.34.9, kube-proxy, kubectl and the pause image), as root, with Debian's docker.io containernetworking-plugins "
    "dnsmasq-base iptables debootstrap xz-utils (docs/cluster-tier.md)")


def available() -> str | None:
    """Why the tier cannot run here (None: it can)."""
    if not (LAB_SCRIPT.is_file() and NODE_SCRIPT.is_file()):
        return f"no {LAB_SCRIPT} or {NODE_SCRIPT}: {HOW_TO_GET}"
    if os.geteuid() != 0:
        return f"not root: {HOW_TO_GET}"
    missing = [p for p in ("containerd", "runc", "ctr", "dnsmasq", "iptables", "debootstrap")
               if not any((Path(d) / p).exists() for d in os.environ.get("PATH", "").split(":") + ["/usr/sbin"])]
    if missing or not Path("/usr/lib/cni/bridge").exists():
        return f"missing {', '.join(missing) or 'CNI plugins'}: {HOW_TO_GET}"
    return None
