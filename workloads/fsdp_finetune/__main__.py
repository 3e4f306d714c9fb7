"""`python -m workloads.fsdp_finetune`: see `workloads.fsdp_finetune.launch`."""

import sys
import threading
import time

from config.errors import run_cli

# Importing PyTorch, Transformers and Ray takes 10 s on an idle 2-core machine and minutes on a loaded one: the
# local demo says so at once and then every 10 s, so its console never looks hung (bench/newcomer.py). Cluster
# runs (no --local) print nothing extra: their driver log is read by tools.
_loaded = threading.Event()
if "--local" in sys.argv:
    _start = time.monotonic()
    print("loading PyTorch, Transformers and Ray ...", flush=True)

    def _beat() -> None:
        while not _loaded.wait(10.0):
            print(f"  still loading: {time.monotonic() - _start:.0f} s", flush=True)

    threading.Thread(target=_beat, daemon=True).start()

from workloads.fsdp_finetune.launch import main  # noqa: E402 - after the message above

_loaded.set()
run_cli(main)
