"""Tokens/s of full vs hybrid sharding when two "nodes" are joined by a slow link, as EFA joins the real ones.

The bench makes two network namespaces (root needed), joins them with a veth pair whose both ends
`tc` (token bucket) limits to `--link-mbit`, and runs 4 gloo ranks of the real `train_step`, 2 in
each namespace (`harness.mesh_steps`; ranks of one namespace talk over its local route,
unlimited, like PCIe within a node). The link is chosen slow enough that it, not the CPUs, bounds
the step, as the 40 Gbit/s EFA link does for Qwen2.5-1.5B on 2 x g6.12xlarge: the tiny model
moves ~6 MB per rank per step across nodes under full sharding. Both shardings run in one
invocation, same model, same batches; the first step of each is warm-up.

    sudo python bench/two_node.py [--link-mbit 50] [--steps 4]

Bounded: a fixed number of steps and a timeout per run; traffic only between the bench's own
namespaces; the namespaces (and with them the veth pair) are removed on exit, Ctrl-C and
SIGTERM included. Where namespaces cannot be made (not root, no `ip`/`tc`, no CAP_NET_ADMIN) it
prints a JSON line with "skipped" and the reason and exits 0. Not part of `make test`.

The last line is JSON. Target: speedup >= 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

WORLD, RANKS_PER_NODE = 4, 2
SUBNET = "10.231.{}.{}"
RUN_TIMEOUT_S = 300


class Namespaces:
    """Two namespaces joined by a rate-limited veth pair; removed by `close()` (idempotent)."""

    def __init__(self, link_mbit: float):
        tag = f"i10b{os.getpid()}"
        self.names = [f"{tag}a", f"{tag}b"]
        self.ifaces = [f"{tag}va"[:15], f"{tag}vb"[:15]]
        self.addrs = [SUBNET.format(0, 1), SUBNET.format(0, 2)]
        self.link_mbit = link_mbit
        self.created: list[str] = []

    def _ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)

    def _in(self, ns: str, *cmd: str) -> None:
        subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True, capture_output=True, text=True, timeout=30)

    def open(self) -> None:
        for ns in self.names:
            self._ip("netns", "add", ns)
            self.created.append(ns)
        a, b = self.names
        va, vb = self.ifaces
        self._ip("link", "add", va, "netns", a, "type", "veth", "peer", "name", vb, "netns", b)
        # A token bucket on each end's egress: burst of ~4 ms at the rate (at least 32 kB), a queue of
        # 100 ms; TCP (gloo) backs off to the rate.
        burst = max(32_000, int(self.link_mbit * 1e6 / 8 * 0.004))
        for ns, iface, addr in zip(self.names, self.ifaces, self.addrs, strict=True):
            self._in(ns, "ip", "link", "set", "lo", "up")
            self._in(ns, "ip", "addr", "add", f"{addr}/30", "dev", iface)
            self._in(ns, "ip", "link", "set", iface, "up")
            self._in(ns, "tc", "qdisc", "add", "dev", iface, "root", "tbf", "rate", f"{self.link_mbit}mbit",
                     "burst", str(burst), "latency", "100ms")

    def close(self) -> None:
        while self.created:
            ns = self.created.pop()
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)

    def node_of(self, rank: int) -> int:
        return rank // RANKS_PER_NODE


def skip(reason: str) -> None:
    print(json.dumps({"skipped": reason}))
    raise SystemExit(0)


def measure(namespaces: Namespaces, root: Path, *, steps: int, accum: int, seq: int) -> dict:
    """Tokens/s of each sharding across the two namespaces."""
    from harness.mesh_steps import launch, read
    from workloads.fsdp_finetune.local_assets import prepare_local_assets

    assets = prepare_local_assets(root / "assets")
    spec = {"model_dir": str(assets.model_dir), "ranks_per_node": RANKS_PER_NODE, "global_rows": WORLD * accum,
            "seq": seq, "accum": accum, "seed": 11, "lr": 1e-3, "out_dir": str(root / "out"), "timeout_s": 120,
            "phases": [{"name": s, "sharding": s, "steps": steps + 1, "warmup_steps": 1} for s in ("full", "hybrid")]}

    def prefix(rank: int) -> list[str]:
        return ["ip", "netns", "exec", namespaces.names[namespaces.node_of(rank)]]

    def env(rank: int) -> dict:
        node = namespaces.node_of(rank)
        # gloo binds to the namespace's veth address; K8S_NODE_NAME feeds the placement check.
        return {"GLOO_SOCKET_IFNAME": namespaces.ifaces[node], "K8S_NODE_NAME": namespaces.names[node]}

    launch(spec, world=WORLD, prefix=prefix, env=env, master_addr=namespaces.addrs[0], port=29_531,
           timeout_s=RUN_TIMEOUT_S)
    return {s: read(root / "out", s) for s in ("full", "hybrid")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--link-mbit", type=float, default=20.0, help="veth rate each way, Mbit/s")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per sharding (after 1 warm-up)")
    parser.add_argument("--accum", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    args = parser.parse_args()
    if os.geteuid() != 0:
        skip("needs root to create network namespaces")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            skip(f"'{tool}' not found (iproute2)")

    namespaces = Namespaces(args.link_mbit)

    def on_signal(signum, _frame):
        namespaces.close()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        try:
            namespaces.open()
        except (subprocess.CalledProcessError, OSError, subprocess.TimeoutExpired) as exc:
            detail = getattr(exc, "stderr", None) or str(exc)
            skip(f"cannot create network namespaces: {str(detail).strip()}")
        with tempfile.TemporaryDirectory() as tmp:
            reports = measure(namespaces, Path(tmp), steps=args.steps, accum=args.accum, seq=args.seq)
    finally:
        namespaces.close()

    full, hybrid = (reports[s]["tokens_per_s"] for s in ("full", "hybrid"))
    cross = {s: reports[s]["per_step"][-1]["cross_node_bytes"] for s in ("full", "hybrid")}
    print(f"tiny Qwen2, 4 gloo ranks in 2 namespaces x 2, veth limited to {args.link_mbit:g} Mbit/s each way, "
          f"{args.steps} timed steps of {WORLD * args.accum} x {args.seq} tokens")
    for s in ("full", "hybrid"):
        r = reports[s]
        print(f"{s:7} {r['tokens_per_s']:9.1f} tokens/s  {r['seconds_per_step']:.3f} s/step  "
              f"cross-node {cross[s]} B per rank per step")
    print(f"speedup hybrid/full {hybrid / full:.2f} (target >= 2)")
    print(json.dumps({"tokens_per_s": {"full": round(full, 1), "hybrid": round(hybrid, 1)},
                      "speedup": round(hybrid / full, 3), "link_mbit": args.link_mbit,
                      "seconds_per_step": {s: round(reports[s]["seconds_per_step"], 4) for s in ("full", "hybrid")},
                      "cross_node_bytes_per_step": cross, "steps": args.steps}))


if __name__ == "__main__":
    main()
