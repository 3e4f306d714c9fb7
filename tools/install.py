"""Install a requirements file into a venv with uv, showing what it installs, how far it is, and how long it took.

`make setup` runs it (`python3 tools/install.py .venv requirements.txt`). Why uv: bench/setup_install.py installs
requirements.txt with pip and with uv side by side, into empty venvs without a cache, from the same sources, and
checks both end with the same versions; on the 2-core machine pip took 177.4 s and uv 45.2 s (docs/benchmarks.md).
The pins do not change: uv installs exactly the `name==version` lines of the file.

uv does not read pip's configuration, so pip's effective settings (`pip config list`: pip.conf files and PIP_*
variables such as the CPU index for torch, PIP_EXTRA_INDEX_URL) are passed to uv as flags, with pip's rule of
taking the best version across every index (`--index-strategy unsafe-best-match`).

Output: one line per phase, uv's own summary lines, and while uv works quietly (downloads, unpacking torch) a line
at least every HEARTBEAT_S seconds with the elapsed time and the packages in the venv so far, so a newcomer never
watches a silent terminal. Standard library only: it runs before the venv exists.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

HEARTBEAT_S = 10.0
# The uv pin: requirements.txt's `uv==` line, whichever file is being installed.
UV_PIN_FILE = Path(__file__).resolve().parent.parent / "requirements.txt"


def log(message: str) -> None:
    print(f"setup: {message}", flush=True)


class Heartbeat:
    """While a step runs: `line(elapsed_s)` printed whenever nothing was printed for HEARTBEAT_S seconds.

    `said()` records output (the step's own lines). A thread watches the time, so a step that prints nothing at
    all (a subprocess reading pip's configuration, venv's ensurepip) is covered too; it starts before the step
    does and stops after it (a `with` block)."""

    def __init__(self, line, start: float | None = None):
        self.line = line
        self.start = time.monotonic() if start is None else start
        self.last = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def said(self) -> None:
        self.last = time.monotonic()

    def _beat(self) -> None:
        while not self._done.wait(min(1.0, HEARTBEAT_S / 4)):
            if time.monotonic() - self.last >= HEARTBEAT_S:
                print(self.line(time.monotonic() - self.start), flush=True)
                self.said()

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()


def pip_config(python: Path) -> dict[str, list[str]]:
    """pip's effective find-links, index URLs and constraints (environment and configuration files)."""
    out = subprocess.run([str(python), "-m", "pip", "config", "list"], capture_output=True, text=True,
                         check=False).stdout
    found: dict[str, list[str]] = {"find-links": [], "extra-index-url": [], "index-url": [], "constraint": []}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        name = key.rpartition(".")[2]
        if name in found:
            for item in shlex.split(value.strip().strip("'\"")):
                if item not in found[name]:
                    found[name].append(item)
    return found


def uv_flags(config: dict[str, list[str]]) -> list[str]:
    """uv pip install flags for pip's configuration."""
    flags = []
    for url in config["index-url"]:
        flags += ["--default-index", url]
    for url in config["extra-index-url"]:
        flags += ["--index", url]
    for path in config["find-links"]:
        flags += ["--find-links", path]
    for path in config["constraint"]:
        flags += ["--constraint", path]
    return flags + ["--index-strategy", "unsafe-best-match"]


def installed_count(venv: Path) -> int:
    return sum(1 for _ in venv.glob("lib/python*/site-packages/*.dist-info"))


def pinned(requirements: Path, name: str) -> str:
    for line in requirements.read_text().splitlines():
        if re.match(rf"^{re.escape(name)}==", line.strip()):
            return line.split("#")[0].strip()
    raise SystemExit(f"{requirements}: no `{name}==VERSION` line; add the pinned installer there")


def run_with_heartbeat(command: list[str], venv: Path, start: float, expected: int) -> int:
    """Run `command`, echoing its lines; a progress line whenever it has been quiet for HEARTBEAT_S."""
    total = [expected]

    def progress(elapsed: float) -> str:
        of = f" of {total[0]}" if total[0] else ""
        return f"setup: still installing: {elapsed:.0f} s so far, {installed_count(venv)}{of} packages in {venv}"

    with Heartbeat(progress, start) as beat:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        for line in process.stdout:
            line = line.rstrip()
            if line:
                match = re.match(r"Resolved (\d+) packages", line)
                if match:
                    total[0] = int(match.group(1))
                log(f"uv: {line}")
                beat.said()
        return process.wait()


def run_labelled(label: str, command: list[str], *, log_file: Path | None = None) -> int:
    """`--run LABEL [--log FILE] -- COMMAND`: any other step (npm ci, the demo's synthesis) with the same heartbeat
    and timing; with a log file the command's own lines go there instead of the console."""
    start = time.monotonic()

    def say(message: str) -> None:
        print(message, flush=True)

    say(f"{label}: {' '.join(command)}" + (f" (output in {log_file})" if log_file else ""))
    sink = log_file.open("a") if log_file else None
    # The heartbeat starts before the process: starting it (an interpreter on a loaded machine) can be slow too.
    with Heartbeat(lambda elapsed: f"{label}: still working, {elapsed:.0f} s so far", start) as beat:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        for line in process.stdout:
            if sink:
                sink.write(line)
            elif line.strip():
                say(f"{label}: {line.rstrip()}")
                beat.said()
        code = process.wait()
    if sink:
        sink.close()
    say(f"{label}: {'done' if code == 0 else f'failed (exit {code})'} in {time.monotonic() - start:.0f} s")
    return code


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--run"]:
        log_file = None
        if argv[2:3] == ["--log"] and len(argv) > 3:
            log_file = Path(argv[3])
            argv = argv[:2] + argv[4:]
        if len(argv) < 4 or argv[2] != "--":
            raise SystemExit("usage: python3 tools/install.py --run LABEL [--log FILE] -- COMMAND...")
        return run_labelled(argv[1], argv[3:], log_file=log_file)
    parser = argparse.ArgumentParser(prog="python3 tools/install.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("venv", type=Path)
    parser.add_argument("requirements", type=Path)
    parser.add_argument("--python", default=sys.executable, help="the interpreter that creates the venv")
    parser.add_argument("--what", default="", help="what the file holds, said in the progress line")
    args = parser.parse_args(argv)
    start = time.monotonic()
    python = args.venv / "bin" / "python"
    packages = sum(1 for line in args.requirements.read_text().splitlines()
                   if re.match(r"^[A-Za-z0-9]", line.strip()))
    if not python.exists():
        # venv's ensurepip took 250 s on the loaded machine (bench/newcomer.py): under a heartbeat too.
        code = run_labelled(f"setup: [1/3] creating the Python environment {args.venv}",
                            [args.python, "-m", "venv", str(args.venv)])
        if code != 0:
            return code
    else:
        log(f"[1/3] {args.venv} exists: updating it to {args.requirements}")
    uv = args.venv / "bin" / "uv"
    uv_pin = pinned(UV_PIN_FILE, "uv")
    code = run_labelled(f"setup: [2/3] installing the installer {uv_pin} with pip (one wheel)",
                        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", uv_pin])
    if code != 0:
        return code
    what = f" ({args.what})" if args.what else ""
    log(f"[3/3] installing {packages} pinned packages of {args.requirements} and their dependencies with uv{what}")
    # `pip config list` starts pip (seconds; more on a loaded machine): under the heartbeat like every step.
    with Heartbeat(lambda elapsed: f"setup: reading pip's configuration for uv, {elapsed:.0f} s so far", start):
        flags = uv_flags(pip_config(python))
    command = [str(uv), "pip", "install", "--python", str(python), *flags, "-r", str(args.requirements)]
    code = run_with_heartbeat(command, args.venv, start, 0)
    if code != 0:
        log(f"failed after {time.monotonic() - start:.0f} s (uv exit {code}); rerun `make setup` to resume: "
            "what is installed stays")
        return code
    log(f"{args.venv}: {installed_count(args.venv)} packages ready in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    # Not `config.errors.run_cli`: this runs under the system python3 before the venv exists, and `config` needs
    # pydantic; a SystemExit with a message prints it and exits 1, the same contract.
    raise SystemExit(main())
