"""The cluster tier's cost: start-up, each test's and scenario's time, the total, and the peak memory.

Runs `pytest -m cluster tests/cluster` (what `make cluster-test` runs) once and prints:
- start-up: the first test's setup (the CDK and cdk8s synth of config/cluster.yaml, `lab up`);
- every test's setup + call + teardown time (pytest --durations), the scenarios with their timelines in
  dist/cluster-report.json;
- the total wall time (target: 8 minutes cold on 2 cores, issue 32);
- the peak resident memory of everything the tier started, sampled every 0.5 s: pytest and its children, the lab's
  components (started with setsid, so found by their folder under .cache/k8s-lab/) and the Ray head (its temp
  folder /tmp/rayns*).

Usage: .venv/bin/python bench/cluster_tier.py [extra pytest args]. Needs ../shared/k8s (or $K8S_LAB) and root.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.waiting import descendants  # noqa: E402  (the repository on the path first, as the other benches)

MARKERS = (str(REPO / ".cache" / "k8s-lab" / "run-"), "/tmp/rayns")


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _tier_pids(root: int) -> set[int]:
    found = descendants(root) | {root}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if any(m in cmdline or cwd.startswith(m) for m in MARKERS):
            found.add(int(entry.name))
    return found


def main(argv: list[str]) -> int:
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-m", "cluster", "tests/cluster", "-q", "-s",
                             "--durations=0", "-vv", *argv], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "CLUSTER_TIER_REQUIRED": "1"})
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], sum(_rss_kib(p) for p in _tier_pids(proc.pid)))
            done.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output = proc.stdout.read()
    proc.wait()
    done.set()
    sampler.join()
    total = time.monotonic() - started

    durations = defaultdict(float)
    startup = None
    for match in re.finditer(r"^([\d.]+)s (setup|call|teardown)\s+(\S+)$", output, re.MULTILINE):
        seconds, phase, test = float(match.group(1)), match.group(2), match.group(3)
        durations[test] += seconds
        if phase == "setup" and (startup is None or seconds > startup[0]):
            startup = (seconds, test)
    log = REPO / "dist" / "cluster-tier-bench.log"
    log.parent.mkdir(exist_ok=True)
    log.write_text(output)
    if proc.returncode != 0:
        # The first failure's traceback tail (its assertion and the timeline it printed), then pytest's summary;
        # the whole output is in the log.
        failures = output[output.find("= FAILURES ="):output.find("short test summary info")] \
            if "= FAILURES =" in output else ""
        print("\n".join(line[:400] for line in failures.splitlines()[-40:]))
        summary = output[output.find("short test summary info"):] if "short test summary info" in output else ""
        print("\n".join(line[:400] for line in summary.splitlines()[:30]))
        print(f"pytest's whole output: {log}")
    print(f"cluster tier: pytest exit {proc.returncode}; summary: "
          f"{(output.strip().splitlines() or ['?'])[-1]}")
    if startup:
        print(f"start-up (longest setup: synth + lab up + Ray head): {startup[0]:.1f} s ({startup[1]})")
    for test, seconds in sorted(durations.items(), key=lambda kv: kv[0]):
        print(f"  {seconds:7.1f} s  {test}")
    report = REPO / "dist" / "cluster-report.json"
    if report.exists():
        for row in json.loads(report.read_text()):
            span = row["timeline"][-1][0] if row.get("timeline") else 0
            print(f"  scenario {row['scenario']:<18} {span:6.1f} s of timeline, "
                  f"{row['gpu_node_minutes_lost']} GPU node min lost ({row['gpu_nodes']} nodes)")
    print(f"total: {total:.1f} s (target 480 s cold on 2 cores); peak memory of the tier: {peak[0] / 1024 / 1024:.2f} "
          f"GiB; load average at the end: {os.getloadavg()[0]:.1f}")
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
