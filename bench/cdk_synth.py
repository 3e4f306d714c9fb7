"""`cdk synth` wall time of this project against a minimal one-bucket CDK app (the jsii floor).

Both run through the pinned CLI (`npx cdk synth --quiet`) in the same process run, into throw-away
output directories, best of `--repeat`. Prints one JSON line: seconds for each and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MINIMAL_APP = """
import aws_cdk as cdk
from aws_cdk import aws_s3 as s3

app = cdk.App()
stack = cdk.Stack(app, "minimal", env=cdk.Environment(region="us-east-2"))
s3.Bucket(stack, "Bucket")
app.synth()
"""


def _synth_seconds(cwd: Path, out: Path, env: dict) -> float:
    start = time.perf_counter()
    proc = subprocess.run([str(REPO / "node_modules" / ".bin" / "cdk"), "synth", "--quiet", "-o", str(out)],
                          cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"cdk synth failed in {cwd}:\n{proc.stderr[-3000:]}")
    return elapsed


def main() -> None:
    """Run both syntheses `--repeat` times and print the best times and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    env = {**os.environ, "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20", "CDK_DISABLE_CLI_TELEMETRY": "true",
           "CDK_DISABLE_VERSION_CHECK": "true"}
    with tempfile.TemporaryDirectory() as tmp:
        minimal = Path(tmp) / "minimal"
        minimal.mkdir()
        (minimal / "app.py").write_text(MINIMAL_APP)
        # The project's feature flags too, so both apps synthesize under the same context.
        context = json.loads((REPO / "cdk.json").read_text()).get("context", {})
        (minimal / "cdk.json").write_text(json.dumps({"app": f"{REPO / '.venv' / 'bin' / 'python'} app.py",
                                                      "notices": False, "cli-telemetry": False, "context": context}))
        project, floor = [], []
        for i in range(args.repeat):
            project.append(_synth_seconds(REPO, Path(tmp) / f"project-{i}", env))
            floor.append(_synth_seconds(minimal, Path(tmp) / f"minimal-{i}", env))
    result = {"project_synth_s": round(min(project), 2), "minimal_synth_s": round(min(floor), 2),
              "ratio": round(min(project) / min(floor), 2), "repeat": args.repeat}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
