"""Pytest fixtures over `tests/loopback.py`'s servers (loopback only, port 0, torn down on exit)."""

from __future__ import annotations

import pytest

from tests.loopback import MotoServer


@pytest.fixture(scope="session")
def moto_server():
    """moto's server with IAM auth enforced; shared by the session (make unique bucket/user names)."""
    with MotoServer() as server:
        yield server


@pytest.fixture(scope="session")
def driver_assets(tmp_path_factory):
    """The tiny job's generated model and data, made once for every `tests.driver_run` of the session
    (about 20 s each on the loaded two-core machine; the same files make the runs comparable by construction)."""
    from workloads.fsdp_finetune.local_assets import prepare_local_assets

    return prepare_local_assets(tmp_path_factory.mktemp("driver-assets")).model_dir.parent


@pytest.fixture(scope="session")
def unbroken_model(tmp_path_factory, driver_assets):
    """The exported model folder of `tests.driver_run`'s tiny job run once without a break (local storage).

    The reference of every driver-kill test, local or through S3: where checkpoints are stored does not
    change what is trained, so one unbroken run serves them all.
    """
    from tests import driver_run

    out = tmp_path_factory.mktemp("unbroken")
    status = driver_run.wait_exit(driver_run.start(out, "unbroken", "--assets", str(driver_assets)), out, "unbroken")
    assert status == 0, driver_run.log_tail(out, "unbroken")
    return out / "unbroken" / "model"
