"""Pytest fixtures over `harness/loopback.py`'s servers (loopback only, port 0, torn down on exit)."""

from __future__ import annotations

import pytest

from harness.loopback import MotoServer

# Passed/skipped/failed per tier, and in CI (CI=true) an unlisted skip fails the run (tests/allowed_skips.toml);
# a line whenever pytest has been silent for 10 s (collecting, a long test), so no run is silent for minutes.
pytest_plugins = ("tests.ci_accounting", "tests.heartbeat")

# A test that uses one of these starts a child process (moto's server) or a Ray run through it: `slow`, so
# `make check` (pytest -m "not slow") leaves it out wherever the test itself is not marked.
SLOW_FIXTURES = frozenset({"moto_server", "scraped_run", "gated_run", "reference_run", "driver_assets", "ec2_synth",
                           "ray_head"})

# `make test` runs the suite in two processes (pytest-xdist, `-n 2 --dist loadfile`). Each module is one unit
# of work, so its module-scoped fixtures (a Ray cluster, a run shared by its assertions) are made once;
# modules that share an expensive session fixture are one unit together (`SHARED_UNITS`), or each process
# would make it again. xdist hands out the units with the most tests first. Handing out the longest first
# instead (Ray modules on both processes at once) measured slower on two cores: 740 s against 636 s.
# The failure-path modules compare against one unbroken run (`reference_run`, `driver_assets`).
SHARED_UNITS = {**{m: "reference-run" for m in ("test_driver_kill", "test_hang", "test_train_ray", "test_train_s3")},
                **{m: "ray-head"  # `ray_head`
                   for m in ("test_follow", "test_ray_auth_local", "test_local_ray_loopback")},
                # tests/cluster/: one k8s lab per process (tests/cluster/conftest.py `lab`).
                **{m: "k8s-lab" for m in ("test_cluster_lab", "test_cluster_examples", "test_cluster_scenarios")}}


def _module(nodeid: str) -> str:
    return nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")


def pytest_itemcollected(item):
    # Marked as each test is collected, before `-m "not slow"` deselects (`pytest_collection_modifyitems`).
    if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        item.add_marker(pytest.mark.slow)


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` with `SHARED_UNITS`: xdist's file scheduling, where a few files are one unit.

    (xdist's own `xdist_group` marks did not group tests here: with pytest 9.2 and xdist 3.8.0 the workers'
    node ids came back without the group suffix, so `--dist loadgroup` spread a group over both processes.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedUnitScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return SHARED_UNITS.get(_module(nodeid)) or super()._split_scope(nodeid)

    return SharedUnitScheduling(config, log)


@pytest.fixture(scope="module")
def local_ray():
    """The workload's local Ray cluster (`start_local_ray`: 2 CPU workers and the controller) for one module's
    runs, shut down after it."""
    ray = pytest.importorskip("ray")
    from workloads.local_ray import start_local_ray

    start_local_ray()
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def ray_head():
    """A Ray head with its dashboard and token auth (`tests.ray_head`), shared by the session; killed at its end."""
    from tests import ray_head

    head = ray_head.start()
    yield head
    head.stop()


@pytest.fixture(scope="session")
def moto_server():
    """moto's server with IAM auth enforced; shared by the session (make unique bucket/user names)."""
    with MotoServer() as server:
        yield server


@pytest.fixture(scope="session")
def driver_assets(tmp_path_factory):
    """The tiny job's generated model and data, made once for every `harness.driver_run` of the session
    (about 20 s each on the loaded two-core machine; the same files make the runs comparable by construction)."""
    from workloads.fsdp_finetune.local_assets import prepare_local_assets

    return prepare_local_assets(tmp_path_factory.mktemp("driver-assets")).model_dir.parent


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory, driver_assets):
    """`harness.driver_run.JOB` run once without a break (local storage, in this process): `(plan, assets, Result)`.

    The reference of every failure path (a worker killed, a fit aborted, a hung collective, the driver
    killed, a kill mid-upload to S3), in this process or in a driver process: each must end with these
    weights bit for bit. Neither where checkpoints are stored, the run's name, nor who drives the fit changes
    what is trained (the data order depends only on the job's seed: `data.py`), so one unbroken run serves
    them all; test_train_ray.py checks the run itself. Runs on the module's `local_ray` cluster where there is
    one, else on a cluster of its own, stopped after it.
    """
    ray = pytest.importorskip("ray")
    from harness.driver_run import JOB
    from workloads.fsdp_finetune.run_plan import local_plan
    from workloads.fsdp_finetune.trainer import run_training
    from workloads.local_ray import start_local_ray

    out = tmp_path_factory.mktemp("reference")
    plan, assets = local_plan(out, assets_dir=driver_assets, run_name="reference", **JOB)
    own_cluster = not ray.is_initialized()
    start_local_ray()
    try:
        result = run_training(plan)
    finally:
        if own_cluster:
            ray.shutdown()
    assert result.error is None
    return plan, assets, result
