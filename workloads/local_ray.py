"""The Ray cluster of local runs (`--local` training, `python -m workloads.preflight --local`), on this machine.

Its own module so that the training launcher and the preflight both depend on it, and not on each other.
"""

from __future__ import annotations

import os

LOCAL_WORKERS = 2
"""Ray Train workers of a local run (one CPU each; gloo)."""

# Loopback only. Ray 2.58 ignores a loopback node address given to ray.init (ray/_private/worker.py `init`:
# `_node_ip_address = services.resolve_ip_for_localhost(...)` turns 127.0.0.1 into the machine's address) and
# then binds its gRPC servers (GCS, raylet, core workers) and agents to all interfaces. With this variable at 0,
# `services.get_node_ip_address` returns 127.0.0.1 ("Use loopback IP as the local IP address", ray-project/ray
# #18730), every process gets `--node-ip-address=127.0.0.1`, and the servers listen on 127.0.0.1 only
# (src/ray/rpc/grpc_server.cc `listen_to_localhost_only`); the variable only otherwise stops a *worker* node
# joining (ray/scripts/scripts.py `start`), which a local cluster never does. tests/test_local_ray_loopback.py
# checks every listening socket of a local cluster.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def loopback_only() -> None:
    """Make the Ray cluster this process starts listen on 127.0.0.1 only (before `ray.init`)."""
    os.environ.update(LOOPBACK_ENV)  # inherited by every process the cluster starts
    import ray._private.ray_constants as ray_constants

    # Read at import: a driver that imported Ray before this call needs the module's value too.
    ray_constants.ENABLE_RAY_CLUSTER = False


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
        loopback_only()
        ray.init(num_cpus=LOCAL_WORKERS + 1, include_dashboard=False, log_to_driver=True,
                 configure_logging=False)
