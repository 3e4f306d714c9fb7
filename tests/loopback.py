"""Loopback servers for tests: real servers on 127.0.0.1, port 0, bounded in time, torn down on exit.

(Issue 19 adds moto with IAM auth enforced and a Pod Identity credential endpoint to this module; the
section below is issue 22's and stands apart so the two merge side by side.)
"""

from __future__ import annotations

# ---- issue 22: moto's EC2/IAM server for Ray's cluster launcher -------------------------------------
import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

# Fake credentials: moto accepts any signature when auth is not enforced; nothing here reaches AWS.
FAKE_KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


@dataclass(frozen=True, kw_only=True)
class MotoEc2:
    """A running moto server: its endpoint and the environment that points botocore (and Ray) at it."""

    endpoint_url: str

    def env(self, home: str) -> dict[str, str]:
        """Variables that make every boto3 client in this process talk to the server with fake keys only:
        the shared config and credentials files, IMDS and any profile switched off; HOME moved to `home`
        (Ray's launcher writes the key pair's private key under ~/.ssh)."""
        return {**FAKE_KEYS, "AWS_ENDPOINT_URL": self.endpoint_url, "AWS_CONFIG_FILE": os.devnull,
                "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true", "HOME": home}


@contextlib.contextmanager
def moto_ec2_server() -> Iterator[MotoEc2]:
    """moto's server mode (moto.moto_server.threaded_moto_server, moto 5.2.5) on 127.0.0.1, port 0, in a
    thread of this process; stopped on exit. Auth is not enforced: the EC2 calls of Ray's launcher are
    what is under test here, not IAM evaluation (moto ignores tag conditions; see docs/ec2.md)."""
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield MotoEc2(endpoint_url=f"http://{host}:{port}")
    finally:
        server.stop()
