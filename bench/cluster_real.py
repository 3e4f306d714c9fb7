"""The real-node tier's time and memory: `make cluster-real`'s pytest run, cold and then warm.

    python bench/cluster_real.py [--warm-only]

Cold: the tier's cache (.cache/cluster-real: the debootstrap root file system, the image archive, the node's
containerd with the imported image, the lab's unpacked binaries) removed first; warm: the same run again. Prints
each run's wall time, its set-up line (image, lab up, node up, image import, synth, assets), the per-test times
pytest reports, and the machine's peak memory in use above the figure before the run (sampled every 0.5 s from
/proc/meminfo: the tier's processes are many, in containers, so a whole-machine figure is the honest one; other
work on the machine adds to it). Needs what the tier needs (root, ../shared, docs/cluster-tier.md).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache" / "cluster-real"


def used_mib() -> float:
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    kib = lambda k: int(info[k].split()[0])  # noqa: E731
    return (kib("MemTotal") - kib("MemAvailable")) / 1024


def run(label: str) -> None:
    base = used_mib()
    peak = [base]
    done = threading.Event()

    def sample():
        while not done.wait(0.5):
            peak[0] = max(peak[0], used_mib())

    threading.Thread(target=sample, daemon=True).start()
    t0 = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "pytest", "tests/cluster_real", "-m", "cluster_real", "-p",
                             "no:cacheprovider", "-s", "--durations=0"], cwd=REPO, capture_output=True, text=True,
                            env={**__import__("os").environ, "CLUSTER_TIER_REQUIRED": "1"})
    wall = time.monotonic() - t0
    done.set()
    out = result.stdout + result.stderr
    setup = re.search(r"^set-up: .*$", out, re.M)
    print(f"{label}: {wall:.1f} s wall, exit {result.returncode}, "
          f"peak memory in use +{(peak[0] - base) / 1024:.2f} GiB "
          f"(machine peak {peak[0] / 1024:.2f} GiB)")
    if setup:
        print(f"  {setup.group(0)}")
    for line in re.findall(r"^\s*[\d.]+s (?:call|setup|teardown)\s+\S+$", out, re.M):
        print(f"  {line.strip()}")
    if result.returncode != 0:
        print(out[-3000:])


def main() -> int:
    sys.path.insert(0, str(REPO))
    from harness.cluster_real import available

    why = available()
    if why:
        print(f"cluster-real bench: not run here ({why})")
        return 0
    if "--warm-only" not in sys.argv:
        shutil.rmtree(CACHE, ignore_errors=True)
        run("cold")
    run("warm")
    return 0


if __name__ == "__main__":
    sys.exit(main())
