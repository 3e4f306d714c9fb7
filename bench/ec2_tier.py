"""Wall time of the EC2 `ray up` tier (tests/test_ec2_rayup.py, `make ec2-test`): cold, then warm.

    python bench/ec2_tier.py [--warm-only]

Cold: an empty cache directory (EC2_TIER_CACHE), so the run includes the DLC stand-in's debootstrap from
deb.debian.org, its `docker import` into both hosts' fresh data roots, and everything after. Warm: the same
cache again (the tarball and the hosts' data roots with the image in them are reused). Prints one JSON line:
per run (`cold`, `warm`): `s` (seconds, the whole pytest run of the module), pytest's pass/fail counts, the
steps the tests print (`ray_up_head_s`, `worker_on_demand_s`, `ray_down_s`, `deadline_stop_s`; the fine-tune's
`finetune_up_s`, `finetune_lost_s` and `finetune_gpu_node_minutes` from the worker's kill until the resumed run is
back at the step it had reached, at 2 GPU nodes, `finetune_down_s`) and, cold,
`image_build_s` (the debootstrap step); the load average before (1 min) and after (5 min) each
run. Target: warm under 300 s on two cores (issue 34).
Root only (network namespaces, dockerd); takes about 10 minutes. Not part of the test suite (it runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _run(cache: Path) -> dict:
    env = {**os.environ, "EC2_TIER_CACHE": str(cache)}
    # The machine's load beside each run: the head's `ray start` fails under CPU starvation (Ray 2.58's raylet
    # aborts when the dashboard agent has not written its port file in time: docs/ec2.md "Measured").
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                           "tests/test_ec2_rayup.py"], cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    summary = (proc.stdout.strip().splitlines() or [""])[-1]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped)", summary)}
    build = re.search(r"built in ([\d.]+) s", proc.stdout)
    # The steps the tests print: `ray up` of the head, the GPU task until the worker ran it, `ray down`.
    steps = {name: float(m.group(1)) for name, pattern in (
        ("ray_up_head_s", r"ray up \(head alone\): ([\d.]+) s"),
        ("worker_on_demand_s", r"ran on the worker the autoscaler started: ([\d.]+) s"),
        ("ray_down_s", r"ray down: ([\d.]+) s"),
        ("deadline_stop_s", r"stopped and cleaned up ([\d.]+) s"),
        ("finetune_up_s", r"python -m ops.launcher up \(the fine-tune's head\): ([\d.]+) s"),
        ("finetune_lost_s", r"([\d.]+) s lost = "),
        ("finetune_gpu_node_minutes", r"lost = ([\d.]+) GPU-node minutes"),
        ("finetune_down_s", r"ray down \(the fine-tune's cluster\): ([\d.]+) s"))
        if (m := re.search(pattern, proc.stdout))}
    if proc.returncode:
        print(proc.stdout[-8000:], file=sys.stderr)  # what failed, for the record
    return {"s": round(seconds, 1), "exit": proc.returncode, "load_1min_before": round(load_before, 1),
            "load_5min_after": round(os.getloadavg()[1], 1), **counts, **steps,
            **({"image_build_s": float(build.group(1))} if build else {})}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm-only", action="store_true", help="reuse .cache/ec2-tier (no cold run)")
    args = parser.parse_args()
    result: dict = {"cpus": os.cpu_count()}
    if args.warm_only:
        result["warm"] = _run(REPO / ".cache" / "ec2-tier")
    else:
        cache = Path(tempfile.mkdtemp(prefix="ec2-tier-bench-", dir=REPO / ".cache"))
        try:
            result["cold"] = _run(cache)
            result["warm"] = _run(cache)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    print(json.dumps(result))
    return 0 if all(r.get("exit") == 0 for k, r in result.items() if isinstance(r, dict)) else 1


if __name__ == "__main__":
    sys.exit(main())
