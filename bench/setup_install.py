"""pip against uv, side by side, installing requirements.txt into fresh throwaway venvs (what `make setup` does).

Each installer starts from an empty venv under /tmp and an empty cache of its own (pip --no-cache-dir, uv
--no-cache), so neither reuses what the other (or an earlier `make setup`) downloaded or built. Both see the same
package sources: pip's own configuration (`pip config list`: find-links, extra index URLs, constraints) is passed
to uv as flags, since uv does not read pip.conf. After both installs the two venvs' `name==version` lists are
compared: the faster installer is only usable if it keeps the same pins.

Run once (it downloads and unpacks every wheel twice: CPU and network heavy):

    .venv/bin/python bench/setup_install.py

Prints one line per installer (wall seconds) and whether the installed versions agree; exit 1 if they differ.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tools.install import pip_config, uv_flags  # noqa: E402  (the same translation make setup uses)

REQUIREMENTS = REPO / "requirements.txt"


def freeze(venv: Path) -> list[str]:
    out = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze",
                          "--disable-pip-version-check"], capture_output=True, text=True, check=True).stdout
    return sorted(line.lower().replace("_", "-") for line in out.splitlines()
                  if line and not line.lower().startswith(("pip==", "setuptools==", "wheel==")))


def run(label: str, command: list[str], env: dict[str, str]) -> float:
    print(f"{label}: {' '.join(command[:4])} ...", flush=True)
    start = time.monotonic()
    result = subprocess.run(command, env=env, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    elapsed = time.monotonic() - start
    if result.returncode != 0:
        print(result.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"{label} failed (exit {result.returncode}) after {elapsed:.1f} s")
    print(f"{label}: {elapsed:.1f} s", flush=True)
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/setup-install-bench"),
                        help="throwaway folder for the two venvs (removed first and after)")
    parser.add_argument("--keep", action="store_true", help="keep the venvs afterwards")
    args = parser.parse_args(argv)
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        raise SystemExit("uv not found: `.venv/bin/pip install uv` (pinned in requirements.txt)")
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    env = {**os.environ, "PIP_NO_CACHE_DIR": "1"}
    config = pip_config(Path(sys.executable))
    base = sys.executable if not hasattr(sys, "_base_executable") else sys._base_executable
    times = {}
    try:
        pip_venv, uv_venv = args.work / "pip", args.work / "uv"
        subprocess.run([base, "-m", "venv", str(pip_venv)], check=True)
        times["pip"] = run("pip", [str(pip_venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-cache-dir",
                                   "--disable-pip-version-check", "-r", str(REQUIREMENTS)], env)
        subprocess.run([base, "-m", "venv", str(uv_venv)], check=True)
        times["uv"] = run("uv", [uv, "pip", "install", "--no-cache", "--quiet", "--python",
                                 str(uv_venv / "bin" / "python"), *uv_flags(config), "-r", str(REQUIREMENTS)], env)
        same = freeze(pip_venv) == freeze(uv_venv)
        if not same:
            a, b = set(freeze(pip_venv)), set(freeze(uv_venv))
            print(f"only pip: {sorted(a - b)}\nonly uv: {sorted(b - a)}")
    finally:
        if not args.keep:
            shutil.rmtree(args.work, ignore_errors=True)
    print(f"requirements.txt into an empty venv, no cache: pip {times['pip']:.1f} s, uv {times['uv']:.1f} s "
          f"(uv {times['pip'] / times['uv']:.1f}x); same versions installed: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
