"""A newcomer's first hour, scripted: a fresh clone, then the README's commands in order, timed.

For each command of the README's "Try it locally" block (`make help`, `make demo`, `make check`, ...; `make test`
and `make clean` are left out by default: the first is the 10-minute suite, the second undoes the demo) it prints
the wall time and the longest stretch without output, and it fails (exit 1) when a command fails or any stretch
exceeds the limit (30 s: a newcomer should never watch a silent terminal that long). The first success is the time
from the clone to the end of `make demo` (set-up included).

Not part of `make test`: it clones the repository and runs a full set-up (a new .venv with torch and Ray, npm ci),
minutes of CPU and network. Run it by hand, on an otherwise idle machine for figures worth recording:

    python3 bench/newcomer.py                      # clone HEAD into /tmp/newcomer-*/repo, run, remove
    python3 bench/newcomer.py --mirror ../shared   # with the team's mirror (PINS_MIRROR) instead of GitHub
    python3 bench/newcomer.py --mirror ../shared --cold   # and empty package caches, as on a new machine

--cold points uv's, pip's, npm's and Hugging Face's caches at empty folders inside the run's temporary folder, so
every package is fetched from the registries as on a machine that never installed the project; the folder is
removed at the end. Without it the caches of this machine (warm after earlier set-ups) serve the install.

Without --mirror the clone has no ../shared, so `make setup` downloads the pinned charts and CRDs from GitHub
(tools/pins.py), as a user's clone does. Output: one block per command as it runs (its own output indented), then a
table of the figures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as `python3 bench/newcomer.py`, before any venv: harness.newcomer is stdlib only

from harness.newcomer import cold_caches, readme_commands, run_timed  # noqa: E402

LIMIT_S = 30.0
SKIPPED = ("make test", "make clean")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirror", type=Path, help="PINS_MIRROR for the clone (a folder laid out like ../shared)")
    parser.add_argument("--skip", action="append", default=list(SKIPPED), help="a README command not to run")
    parser.add_argument("--keep", action="store_true", help="keep the clone")
    parser.add_argument("--cold", action="store_true", help="empty uv, pip, npm and Hugging Face caches")
    parser.add_argument("--limit", type=float, default=LIMIT_S, help="longest allowed stretch without output, s")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="newcomer-", dir="/tmp"))
    clone = work / "repo"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "CLUSTER_CONFIG", "PINS_"))}
    if args.mirror:
        env["PINS_MIRROR"] = str(args.mirror.resolve())
    if args.cold:
        env.update(cold_caches(work / "caches"))
    rows = []
    try:
        steps = [f"git clone -q {REPO} {clone}"] + [c for c in readme_commands(REPO / "README.md")
                                                      if c not in args.skip]
        first_success = None
        t0 = time.monotonic()
        for command in steps:
            print(f"$ {command}", flush=True)
            code, wall, silent, where = run_timed(command, work if command.startswith("git clone") else clone, env)
            rows.append((command, code, wall, silent))
            print(f"  -> exit {code}, {wall:.1f} s, longest stretch without output {silent:.1f} s, after: {where}",
                  flush=True)
            if command == "make demo" and code == 0:
                first_success = time.monotonic() - t0
            if code != 0:
                break
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    caches = "empty (--cold)" if args.cold else "this machine's"
    print(f"\npackage caches: {caches}")
    print(f"\n{'command':<40} {'exit':>4} {'wall s':>8} {'silent s':>9}")
    for command, code, wall, silent in rows:
        flag = "  > limit" if silent > args.limit else ""
        print(f"{command[:40]:<40} {code:>4} {wall:>8.1f} {silent:>9.1f}{flag}")
    if first_success is not None:
        print(f"first success (clone to the end of make demo): {first_success:.1f} s")
    failed = [r for r in rows if r[1] != 0 or r[3] > args.limit]
    if failed:
        print(f"FAILED: {', '.join(r[0] for r in failed)} (a failed command, or silent longer than {args.limit:.0f} s)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
