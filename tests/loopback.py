"""Loopback servers for tests: real servers on 127.0.0.1, port 0, bounded in time, torn down on exit.

(Issue 19 adds moto with IAM auth enforced and a Pod Identity credential endpoint to this module; the
sections below are issue 22's (moto EC2) and issue 23's (Debian's Prometheus), each standing apart so they
merge side by side.)
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


# ---- issue 23: Debian's Prometheus server, scraping what a test hands it ---------------------------------------
# Self-contained like issue 22's section; with issue 19's registry merged it is `@register("prometheus")`.
import json  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

PROMETHEUS_START_TIMEOUT_S = 60.0  # two shared cores: seconds, not minutes
PROMETHEUS_STOP_TIMEOUT_S = 10.0

PROMETHEUS_INSTALL_HINT = ("Debian's prometheus package (2.42, with promtool): `make setup` installs it when apt-get "
                           "can (root or passwordless sudo), or run `apt-get install prometheus`")
# Ports tried for Prometheus: below Linux's ephemeral range (32768-60999), where the port-0 binds of Ray
# and the other loopback servers land, so a collision is rare; one is retried on the next port anyway.
PROMETHEUS_PORTS = (20000, 32000)
PROMETHEUS_ATTEMPTS = 20


def prometheus_missing() -> str | None:
    """Why the Prometheus server cannot run here (None when `prometheus` and `promtool` are on PATH)."""
    import shutil

    missing = [name for name in ("prometheus", "promtool") if shutil.which(name) is None]
    return f"{' and '.join(missing)} not found; install {PROMETHEUS_INSTALL_HINT}" if missing else None


class PrometheusServer:
    """Prometheus on 127.0.0.1 with `scrape_configs`, its data in a temporary folder, torn down on exit.

    Prometheus cannot listen on port 0 and report the port, and picking a free port by binding and
    releasing it races with every other process; so it is started on a random port and, when that
    one is taken ("address already in use" in its log), started again on another. `url` is its
    HTTP API.
    """

    def __init__(self, scrape_configs: list[dict], *, scrape_interval: str = "1s"):
        self.scrape_configs = scrape_configs
        self.scrape_interval = scrape_interval
        self.proc: subprocess.Popen | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        self.url = ""
        self.log_path: Path | None = None

    def __enter__(self) -> PrometheusServer:
        import random

        import yaml

        reason = prometheus_missing()
        if reason:
            raise RuntimeError(reason)
        self._tmp = tempfile.TemporaryDirectory(prefix="prometheus-")
        root = Path(self._tmp.name)
        config = root / "prometheus.yml"
        config.write_text(yaml.safe_dump({"global": {"scrape_interval": self.scrape_interval,
                                                     "evaluation_interval": self.scrape_interval},
                                          "scrape_configs": self.scrape_configs}, sort_keys=False))
        rng = random.Random()
        try:
            for attempt in range(PROMETHEUS_ATTEMPTS):
                port = rng.randrange(*PROMETHEUS_PORTS)
                self.log_path = root / f"prometheus-{attempt}.log"
                if self._start(config, root / "data", port):
                    self.url = f"http://127.0.0.1:{port}"
                    return self
            raise RuntimeError(f"Prometheus found no free port in {PROMETHEUS_ATTEMPTS} tries")
        except BaseException:
            self.__exit__()
            raise

    def _start(self, config: Path, data: Path, port: int) -> bool:
        """Start on `port`: True once ready, False when the port is taken; raises on any other failure."""
        import urllib.error
        import urllib.request

        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=info"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + PROMETHEUS_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                text = self.log_path.read_text(errors="replace")
                self.proc = None
                if "address already in use" in text:
                    return False
                raise RuntimeError(f"Prometheus exited at start: {text[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as reply:
                    if reply.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)  # a poll interval of the readiness wait, bounded by the deadline above
        raise RuntimeError(f"Prometheus not ready within {PROMETHEUS_START_TIMEOUT_S:.0f} s: "
                           f"{self.log_path.read_text(errors='replace')[-3000:]}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=PROMETHEUS_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=PROMETHEUS_STOP_TIMEOUT_S)
            self.proc = None
        if self._tmp:
            self._tmp.cleanup()
            self._tmp = None

    def api(self, path: str, **params) -> Any:
        """`GET /api/v1/<path>?params`'s `data` (raises with Prometheus' error on a failed query)."""
        import urllib.error
        import urllib.parse
        import urllib.request

        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as reply:
                body = json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus {path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query_range(self, expr: str, *, start: float, end: float, step: float = 1.0) -> list[dict]:
        """The series `expr` gives over [start, end] (what a Grafana panel over that range shows)."""
        return self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}")["result"]

    def active_targets(self) -> list[dict]:
        return self.api("targets", state="active")["activeTargets"]
