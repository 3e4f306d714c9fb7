"""Pytest fixtures over `tests/loopback.py`'s servers (loopback only, port 0, torn down on exit)."""

from __future__ import annotations

import pytest

from tests.loopback import MotoServer


@pytest.fixture(scope="session")
def moto_server():
    """moto's server with IAM auth enforced; shared by the session (make unique bucket/user names)."""
    with MotoServer() as server:
        yield server
