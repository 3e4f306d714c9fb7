"""bench/newcomer.py's measuring parts: the README commands it runs, each timed with the longest stretch
without output, and the empty caches of `--cold` (tests/test_newcomer_script.py checks them without a clone)."""

from __future__ import annotations

import os
import re
import selectors
import subprocess
import time
from pathlib import Path


def readme_commands(readme: Path) -> list[str]:
    """The commands of the README's "Try it locally" bash block, in order (comments dropped)."""
    text = readme.read_text()
    section = text[text.index("## Try it locally"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def run_timed(command: str, cwd: Path, env: dict[str, str]) -> tuple[int, float, float, str]:
    """Run `command` in a shell; echo its output indented; return (exit code, wall s, longest silence s, the last
    line before that silence)."""
    start = last = time.monotonic()
    longest, where, previous = 0.0, "(start)", "(start)"
    process = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    pending = b""
    while True:
        ready = selector.select(timeout=1.0)
        now = time.monotonic()
        if ready:
            chunk = os.read(process.stdout.fileno(), 65536)
            if not chunk:
                break
            if now - last > longest:
                longest, where = now - last, previous
            last = now
            # tqdm redraws with \r: each redraw is output, shown as one line per chunk.
            pending += chunk
            *lines, pending = re.split(rb"[\r\n]", pending)
            for line in lines:
                if line.strip():
                    previous = line.decode(errors="replace")[:160]
                    print(f"    {previous}", flush=True)
        elif process.poll() is not None:
            break
    code = process.wait()
    end = time.monotonic()
    if end - last > longest:
        longest, where = end - last, previous
    return code, end - start, longest, where


def cold_caches(root: Path) -> dict[str, str]:
    """Environment that points every package cache a set-up reads at an empty folder under `root`."""
    folders = {"UV_CACHE_DIR": "uv", "PIP_CACHE_DIR": "pip", "npm_config_cache": "npm", "HF_HOME": "huggingface"}
    env = {}
    for variable, name in folders.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        env[variable] = str(root / name)
    return env
