"""How long `python -m workloads.plan` takes for a variable file (default: config/cluster.yaml).

Target: the default Qwen2.5-1.5B plan in under a minute on a 2-core machine. Wall time depends on
what else the machine runs, so the CPU time the plan's process used (user + system, from
`getrusage(RUSAGE_CHILDREN)`) is printed beside it; on an idle 2-core machine the plan is
single-threaded enough that wall time is close to CPU time. Last line is JSON.

    python bench/plan_speed.py [FILE]
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 60.0


def main() -> None:
    file = sys.argv[1] if len(sys.argv) > 1 else str(REPO / "config" / "cluster.yaml")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "workloads.plan", file, "--json"], cwd=REPO,
                            capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if result.returncode not in (0, 2):
        sys.exit(f"plan failed ({result.returncode}):\n{result.stderr[-3000:]}")
    plan = json.loads(result.stdout)
    load = os.getloadavg()[0]
    print(f"{file}: plan in {wall:.1f} s wall, {cpu:.1f} s CPU (load average {load:.1f} on {os.cpu_count()} cores); "
          f"target < {TARGET_S:g} s on 2 cores")
    print(json.dumps({"file": file, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "cpus": os.cpu_count(),
                      "load_average": round(load, 2), "target_s": TARGET_S, "cpu_target_met": cpu < TARGET_S,
                      "wall_target_met": wall < TARGET_S, "exit_status": result.returncode,
                      "peak_gib_per_gpu": plan["peak_gib_per_gpu"], "fits": plan["fits"]}))


if __name__ == "__main__":
    main()
