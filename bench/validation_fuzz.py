"""Random variable files against `config check`'s verdict: counts of accepted, refused, false accepts, tracebacks.

Usage: .venv/bin/python bench/validation_fuzz.py [EXAMPLES] [SYNTH]   (defaults 40 and 8)

Draws EXAMPLES files from harness/fuzz_files.py's strategy (the default file with one to three fields pushed to
the edges of their types; a different draw each run), runs `python -m config check` on each, and builds up to
SYNTH of the accepted ones as a deploy would (CDK app in process with cfn-lint over the templates, cdk8s charts
with the CRD and Kubernetes schema validation). A false accept is an accepted file that fails to build or
lint; a bad refusal is one that does not exit 2 naming the file and the field, or shows a traceback.
Prints the counts, each finding, and the wall time.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")

from hypothesis import HealthCheck, given, settings  # noqa: E402

from harness.fuzz_files import deploys, refusal_problems, variable_files, verdict, write  # noqa: E402


def main(examples: int = 40, synth: int = 8) -> int:
    counts = {"accepted": 0, "refused": 0, "synthesized": 0, "false accepts": 0, "bad refusals": 0,
              "tracebacks": 0}
    findings: list[str] = []
    work = Path(tempfile.mkdtemp(prefix="validation-fuzz-"))
    start = time.perf_counter()

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(variable_files())
    def one(example):
        data, mutated = example
        path = write(data, work)
        result = verdict(path)
        if result.traceback:
            counts["tracebacks"] += 1
            findings.append(f"traceback for {mutated}: {result.traceback.splitlines()[-1]}")
        if result.code == 0:
            counts["accepted"] += 1
            if counts["synthesized"] < synth:
                counts["synthesized"] += 1
                problems = deploys(path, work)
                if problems:
                    counts["false accepts"] += 1
                    findings.append(f"false accept {mutated}: {problems[:3]}")
        else:
            counts["refused"] += 1
            problems = refusal_problems(path, result)
            if problems:
                counts["bad refusals"] += 1
                findings.append(f"bad refusal {mutated}: {problems[:2]}")

    one()
    for finding in findings:
        print(finding)
    print(", ".join(f"{name}: {value}" for name, value in counts.items())
          + f" (of {examples} examples, {time.perf_counter() - start:.0f} s)")
    return 1 if counts["false accepts"] or counts["bad refusals"] or counts["tracebacks"] else 0


if __name__ == "__main__":
    raise SystemExit(main(*(int(a) for a in sys.argv[1:3])))
