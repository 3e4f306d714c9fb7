"""Wall time of `npx cdk8s synth` (the pinned CLI running `python -m charts`), into a temporary directory.

Usage: .venv/bin/python bench/cdk8s_synth.py [RUNS]   (default 3; prints each run and the median)
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main(runs: int = 3) -> int:
    """Run the CLI `runs` times; exit non-zero if any run fails."""
    npx = shutil.which("npx")
    if npx is None:
        print("npx not found; install Node and run `make setup`", file=sys.stderr)
        return 1
    env = dict(os.environ, CDK8S_CHECK_UPGRADE="false", JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20")
    times = []
    for i in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            result = subprocess.run([npx, "--no-install", "cdk8s", "synth", "--output", f"{tmp}/dist"], cwd=REPO,
                                    env=env, capture_output=True, text=True)
            elapsed = time.perf_counter() - start
        if result.returncode:
            print(result.stderr, file=sys.stderr)
            return result.returncode
        times.append(elapsed)
        print(f"cdk8s synth run {i + 1}: {elapsed:.2f} s")
    print(f"cdk8s synth median wall time: {statistics.median(times):.2f} s over {runs} runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3))
