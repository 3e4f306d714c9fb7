"""Wall time of the test suite: `make check`'s subset, and with `--full` the whole suite serial and in two processes.

    python bench/suite_time.py [--full] [--workers 2]

Runs pytest as the Makefile does (`make check`: `-m "not slow"`; `make test`: `-n WORKERS --dist loadfile`),
each in a child process from this repository, and prints one JSON line:

* `check_s`: the fast subset's wall seconds (the target: under 60 s on the 2-core machine);
* with `--full`: `serial_s` (one process, `-p no:xdist`), `parallel_s` (WORKERS processes) and their ratio,
  measured back to back in this one run, plus each run's pass/fail counts from pytest's summary line.

`--full` takes about 25 minutes on two cores. Figures move with the machine's load: run it on an idle machine.
Not part of the test suite (it runs it).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _pytest(*args: str) -> dict:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=REPO,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - started
    summary = (proc.stdout.strip().splitlines() or [""])[-1]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)", summary)}
    return {"s": round(seconds, 1), "exit": proc.returncode, **counts}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also the whole suite, serial and in parallel")
    parser.add_argument("--workers", type=int, default=2, help="processes of the parallel run (make test: 2)")
    args = parser.parse_args()

    check = _pytest("-m", "not slow")
    result = {"check_s": check["s"], "check": check}
    if args.full:
        serial = _pytest("-p", "no:xdist")
        parallel = _pytest("-n", str(args.workers), "--dist", "loadfile")
        result.update(serial_s=serial["s"], parallel_s=parallel["s"], workers=args.workers,
                      speedup=round(serial["s"] / parallel["s"], 2), serial=serial, parallel=parallel)
    print(json.dumps(result))
    return 0 if all(r.get("exit") == 0 for r in result.values() if isinstance(r, dict)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
