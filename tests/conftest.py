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
def unbroken_model(tmp_path_factory):
    """The exported model folder of `tests.driver_run`'s tiny job run once without a break (local storage).

    The reference of every driver-kill test, local or through S3: where checkpoints are stored does not
    change what is trained, so one unbroken run serves them all.
    """
    from tests import driver_run

    out = tmp_path_factory.mktemp("unbroken")
    status = driver_run.wait_exit(driver_run.start(out, "unbroken"), out, "unbroken")
    assert status == 0, driver_run.log_tail(out, "unbroken")
    return out / "unbroken" / "model"
