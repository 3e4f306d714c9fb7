"""The Ray cluster of local runs (`--local` training, `python -m workloads.preflight --local`), on this machine.

Its own module so that the training launcher and the preflight both depend on it, and not on each other.
"""

from __future__ import annotations

import os

LOCAL_WORKERS = 2
"""Ray Train workers of a local run (one CPU each; gloo)."""


def start_local_ray() -> None:
    """A Ray cluster on this machine: CPUs for the workers plus one for the train controller."""
    import ray

    # The preemption watcher is for cloud instances; locally it only adds start-up time and noise.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    # How often Ray Train's controller polls the workers (default 2 s): it notices reports, the
    # end of training and failures only on a poll, so each costs up to that long. Set before
    # ray.init so the local cluster's processes (the controller included) inherit it.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    if not ray.is_initialized():
        ray.init(num_cpus=LOCAL_WORKERS + 1, include_dashboard=False, log_to_driver=True,
                 configure_logging=False)
