"""Loopback servers for tests: real servers on 127.0.0.1, port 0, bounded in time, torn down on exit.

One module owns them so every test (and every later issue) starts them the same way:

* `moto`: moto's server mode (the `moto[server]` pin) in a child process, with IAM authentication
  enforced from its first request: a request signed with unknown keys, or unsigned, is refused.
  It serves every AWS API moto knows (S3, IAM, STS, Secrets Manager, EC2, ...), so a test that needs
  Secrets Manager or EC2 uses the same server with an identity allowed to call them.
* `prometheus`: Debian's Prometheus 2.42 scraping what a test hands it (issue 23's overview test).
* `pod_identity`: an EKS-Pod-Identity-style credential endpoint (`AWS_CONTAINER_CREDENTIALS_FULL_URI`
  plus `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE`) that hands out credentials only to callers that
  send the token, and counts its calls.
* `stalling_proxy`: an HTTP proxy in front of another loopback server (moto) that forwards every
  request, except that once armed it holds the uploads (PUT, POST) whose path contains a given text:
  they never complete, so a test can kill a job while its checkpoint upload is in flight, every time.

Each server is a context manager; `SERVERS` maps a name to its factory so a new one (a Prometheus
server, ...) is one `@register("name")` class away, and `serve("moto", ...)` starts several under
one `ExitStack`. The pytest fixtures in `tests/conftest.py` expose them.

Why a child process for moto: moto keeps its auth switch and backends in module globals; in a child
they are this server's alone, Ray workers reach it over TCP like any other endpoint, and the child
exits when the test process's pipe to it closes (so a killed pytest leaves no server behind).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
REGION = "us-west-2"
START_TIMEOUT_S = 60.0  # two shared cores and a cold import of moto's server: seconds, not minutes
STOP_TIMEOUT_S = 10.0

# Every variable through which botocore or the AWS C++ SDK (inside pyarrow) could find credentials
# other than the container endpoint; a test that means "only Pod Identity" removes all of them.
_OTHER_CREDENTIAL_VARS = (
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
    "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
)

SERVERS: dict[str, Callable[..., contextlib.AbstractContextManager]] = {}


# socketserver's `serve_forever` looks for a `shutdown()` request once per `poll_interval`, 0.5 s by default
# (Lib/socketserver.py, Python 3.11): every stop of a thread-served loopback server waited up to that long.
SERVE_POLL_S = 0.02


class ThreadedHTTPServer:
    """A `ThreadingHTTPServer` on 127.0.0.1 (port 0) served from a daemon thread; `close()` stops it at once.

    The one way tests serve HTTP from a thread (the Pod-Identity endpoint, the stalling proxy, the fake
    Hugging Face Hub, the CRD mirror): request threads are daemons, so a held request never blocks the stop.
    """

    def __init__(self, handler: type[BaseHTTPRequestHandler]):
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": SERVE_POLL_S},
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=STOP_TIMEOUT_S)


def register(name: str):
    """Class decorator: make a loopback server startable as `serve(name)`."""
    def wrap(cls):
        SERVERS[name] = cls
        return cls
    return wrap


@contextlib.contextmanager
def serve(*names: str, **kwargs_by_name: dict) -> Iterator[dict[str, Any]]:
    """Start the named servers (each with `kwargs_by_name[name]`), yield them by name, stop them all."""
    with contextlib.ExitStack() as stack:
        yield {n: stack.enter_context(SERVERS[n](**kwargs_by_name.get(n, {}))) for n in names}


@dataclass(frozen=True)
class Keys:
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None
    expiration: str | None = None

    def env(self) -> dict[str, str]:
        out = {"AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key}
        if self.session_token:
            out["AWS_SESSION_TOKEN"] = self.session_token
        return out


def only_policy(actions: list[str], resources: list[str] | str = "*") -> dict:
    """An IAM policy document allowing `actions` on `resources`."""
    return {"Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": actions, "Resource": resources}]}


def s3_policy(bucket: str) -> dict:
    """What the training pods' role gets on the job bucket (stacks grant the same read/write/list).

    Plus "s3:HeadBucket": AWS authorizes HeadBucket as s3:ListBucket, but moto 5.2.5 checks an
    action of that name (moto/s3/responses.py maps HEAD on a bucket to "HeadBucket"); it is no
    real IAM action, so it grants nothing AWS would not.
    """
    return only_policy(["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket", "s3:HeadBucket",
                        "s3:GetBucketLocation", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
                       [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"])


def _read_line(proc: subprocess.Popen, timeout_s: float, stderr_file=None) -> str:
    """The child's first stdout line, or an error with its stderr if it does not come in time."""
    deadline = time.monotonic() + timeout_s
    buf = b""
    fd = proc.stdout.fileno()
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None:
            _stop_child(proc)
            if stderr_file is not None:
                stderr_file.seek(0)
            err = (stderr_file or proc.stderr).read().decode(errors="replace")[-3000:]
            raise RuntimeError(f"loopback server did not start within {timeout_s:.0f} s: {err}")
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                continue
            buf += chunk
    return buf.decode()


def _stop_child(proc: subprocess.Popen) -> None:
    """Close the child's stdin (its signal to stop), then SIGKILL its process group if it lingers."""
    with contextlib.suppress(Exception):
        proc.stdin.close()
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=STOP_TIMEOUT_S)


@register("moto")
class MotoServer:
    """moto's server on 127.0.0.1:<port 0>, IAM auth enforced; `admin` keys may do anything.

    `endpoint_url` is what boto3 (`endpoint_url=`) and pyarrow (`AWS_ENDPOINT_URL_S3`) point at.
    """

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.endpoint_url = ""
        self.admin: Keys | None = None
        self.account_id = ""
        self.admin_arn = ""

    def __enter__(self) -> MotoServer:
        env = {k: v for k, v in os.environ.items() if k not in _OTHER_CREDENTIAL_VARS}
        # The child's stderr goes to a file, not a pipe: nobody reads a pipe once the server is up, and when its
        # 64 KiB filled, the thread logging a request blocked in the write holding the logging lock, and every
        # other request thread queued behind it: moto answered nothing more (seen with py-spy after ~600
        # requests; it looked like a wedge after a killed upload).
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "harness.loopback", "moto"], cwd=REPO, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                     start_new_session=True)
        info = json.loads(_read_line(self.proc, START_TIMEOUT_S, self._stderr))
        self.endpoint_url = f"http://127.0.0.1:{info['port']}"
        self.admin = Keys(**info["admin"])
        self.account_id = info["account_id"]
        self.admin_arn = info["admin_arn"]
        return self

    def __exit__(self, *exc) -> None:
        if self.proc:
            _stop_child(self.proc)
            for stream in (self.proc.stdout, self._stderr):
                with contextlib.suppress(Exception):
                    stream.close()
            self.proc = None

    # --- clients ---------------------------------------------------------------------------------
    def client(self, service: str, keys: Keys | None = None, *, anonymous: bool = False):
        """A boto3 client for `service` on this server, signed with `keys` (default: admin), or unsigned."""
        import boto3
        from botocore import UNSIGNED
        from botocore.config import Config

        cfg = Config(retries={"max_attempts": 1}, connect_timeout=5, read_timeout=30,
                     signature_version=UNSIGNED if anonymous else None)
        keys = keys or self.admin
        creds = {} if anonymous else {"aws_access_key_id": keys.access_key_id,
                                      "aws_secret_access_key": keys.secret_access_key,
                                      "aws_session_token": keys.session_token}
        # A bare Session: no profile, env or config-file credentials leak into the client.
        return boto3.session.Session(region_name=REGION, **creds).client(
            service, endpoint_url=self.endpoint_url, config=cfg)

    # --- identities ------------------------------------------------------------------------------
    def create_user(self, name: str, policy: dict) -> Keys:
        """An IAM user with `policy` inline, and a fresh access key for it."""
        iam = self.client("iam")
        iam.create_user(UserName=name)
        iam.put_user_policy(UserName=name, PolicyName=f"{name}-policy", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        return Keys(key["AccessKeyId"], key["SecretAccessKey"])

    def create_role(self, name: str, policy: dict) -> str:
        """An IAM role with `policy` inline, trusted by Pod Identity's service principal; its ARN."""
        iam = self.client("iam")
        # On EKS the Pod Identity service principal assumes the role; here the admin plays the agent
        # (moto 5.2.5 matches only an "AWS" principal against the caller: iam/access_control.py).
        trust = {"Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Principal": {"Service": "pods.eks.amazonaws.com", "AWS": self.admin_arn},
            "Action": ["sts:AssumeRole", "sts:TagSession"]}]}
        arn = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
        iam.put_role_policy(RoleName=name, PolicyName=f"{name}-policy", PolicyDocument=json.dumps(policy))
        return arn

    def assume_role(self, role_arn: str, session: str = "pod", duration_s: int = 3600) -> Keys:
        """Temporary (ASIA...) credentials for the role, as the Pod Identity agent gets them from STS."""
        c = self.client("sts").assume_role(RoleArn=role_arn, RoleSessionName=session,
                                           DurationSeconds=duration_s)["Credentials"]
        return Keys(c["AccessKeyId"], c["SecretAccessKey"], c["SessionToken"],
                    c["Expiration"].strftime("%Y-%m-%dT%H:%M:%SZ"))

    def create_bucket(self, name: str) -> str:
        self.client("s3").create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": REGION})
        return name


@dataclass
class _EndpointState:
    token: str
    credentials: Callable[[], Keys]
    account_id: str
    calls: list[str | None] = field(default_factory=list)  # the Authorization header of every call
    lock: threading.Lock = field(default_factory=threading.Lock)


class _CredentialsHandler(BaseHTTPRequestHandler):
    state: _EndpointState  # set on a per-server subclass

    def do_GET(self):  # noqa: N802 (http.server's naming)
        auth = self.headers.get("Authorization")
        with self.state.lock:
            self.state.calls.append(auth)
        if auth != self.state.token:
            # The EKS Pod Identity Agent answers a missing or wrong token with 4xx.
            self._reply(401 if auth is None else 403, {"code": "AccessDenied", "message": "bad token"})
            return
        keys = self.state.credentials()
        # Field names as the agent returns them (botocore's ContainerProvider and the AWS C++ SDK's
        # ECS/"general HTTP" provider both read AccessKeyId, SecretAccessKey, Token, Expiration).
        self._reply(200, {"AccessKeyId": keys.access_key_id, "SecretAccessKey": keys.secret_access_key,
                          "Token": keys.session_token, "AccountId": self.state.account_id,
                          "Expiration": keys.expiration})

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):  # quiet
        pass


@register("pod_identity")
class PodIdentityEndpoint:
    """A Pod-Identity-style credential endpoint on 127.0.0.1:<port 0>, serving `credentials()`.

    `env()` is the environment a pod gets from the Pod Identity webhook, pointing here; with
    `exclusive_env()` nothing else could supply credentials. `calls` lists each call's
    Authorization header; `authorized_calls` counts those that carried the token.
    """

    def __init__(self, credentials: Callable[[], Keys] | Keys, account_id: str = "123456789012",
                 token: str | None = None):
        self._credentials = credentials if callable(credentials) else (lambda: credentials)
        self.token = token or secrets.token_urlsafe(24)
        self.account_id = account_id
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._server: ThreadedHTTPServer | None = None
        self.token_file = ""
        self.url = ""

    def __enter__(self) -> PodIdentityEndpoint:
        state = _EndpointState(self.token, self._credentials, self.account_id)
        handler = type("Handler", (_CredentialsHandler,), {"state": state})
        self._state = state
        self._server = ThreadedHTTPServer(handler)
        self._tmp = tempfile.TemporaryDirectory(prefix="pod-identity-")
        self.token_file = os.path.join(self._tmp.name, "eks-pod-identity-token")
        Path(self.token_file).write_text(self.token)
        # The path the EKS Pod Identity Agent serves (169.254.170.23/v1/credentials on a node).
        self.url = f"http://127.0.0.1:{self._server.port}/v1/credentials"
        return self

    def __exit__(self, *exc) -> None:
        if self._server:
            self._server.close()
            self._server = None
        if self._tmp:
            self._tmp.cleanup()
            self._tmp = None

    @property
    def calls(self) -> list[str | None]:
        with self._state.lock:
            return list(self._state.calls)

    @property
    def authorized_calls(self) -> int:
        return sum(1 for c in self.calls if c == self.token)

    def env(self) -> dict[str, str]:
        return {"AWS_CONTAINER_CREDENTIALS_FULL_URI": self.url,
                "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": self.token_file}

    def exclusive_env(self, endpoint_url: str | None = None, base: dict | None = None) -> dict[str, str]:
        """`base` (default os.environ) with this endpoint as the only credential source.

        Shared config/credential files point at an empty file and IMDS is off, as on a pod with
        hop limit 1; `endpoint_url` (moto's) becomes the S3/STS endpoint for botocore and pyarrow.
        """
        env = {k: v for k, v in (os.environ if base is None else base).items()
               if k not in _OTHER_CREDENTIAL_VARS}
        empty = os.path.join(self._tmp.name, "empty")
        Path(empty).touch()
        env.update(self.env(), AWS_CONFIG_FILE=empty, AWS_SHARED_CREDENTIALS_FILE=empty,
                   AWS_EC2_METADATA_DISABLED="true", AWS_REGION=REGION, AWS_DEFAULT_REGION=REGION)
        if endpoint_url:
            env["AWS_ENDPOINT_URL"] = endpoint_url
        return env


def _moto_child() -> None:
    """Child-process entry: start moto on port 0, make an admin, enforce auth, print, wait for EOF."""
    os.environ.setdefault("MOTO_ALLOW_NONEXISTENT_REGION", "true")
    from moto import settings
    from moto.core.authorization import ActionAuthenticatorMixin
    from moto.moto_server import werkzeug_app
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer

    # moto 5.2.5's dispatcher picks the backend under one lock for the whole server, and may read the request
    # body while holding it (werkzeug_app.py `get_application` -> `infer_service_region_host` -> `_get_body`):
    # one upload whose body stalls (a Ray worker killed mid-checkpoint) then blocks every other request,
    # which real S3 never does. The lock only guards a cache of per-service Flask apps, whose state lives in
    # moto's global backends, so a duplicate app from a race is harmless. The tests that kill a driver also send
    # its S3 traffic through `StallingProxy`, which passes only whole requests on. (The server-wide wedge once
    # blamed on this lock was the unread stderr pipe: see `MotoServer.__enter__`.)
    dispatcher_init = werkzeug_app.DomainDispatcherApplication.__init__

    def unlocked_init(self, *args, **kwargs):
        dispatcher_init(self, *args, **kwargs)
        self.lock = contextlib.nullcontext()

    werkzeug_app.DomainDispatcherApplication.__init__ = unlocked_init
    # One log line per request is noise (and grew the stderr file without bound); warnings and errors stay.
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)

    # No auth while the admin identity is made, through the server itself like any client ...
    settings.INITIAL_NO_AUTH_ACTION_COUNT = float("inf")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    _, port = server.get_host_and_port()
    import boto3

    iam = boto3.session.Session(aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap",
                                region_name=REGION).client("iam", endpoint_url=f"http://127.0.0.1:{port}")
    iam.create_user(UserName="admin")
    iam.put_user_policy(UserName="admin", PolicyName="all",
                        PolicyDocument=json.dumps(only_policy(["*"])))
    key = iam.create_access_key(UserName="admin")["AccessKey"]
    me = boto3.session.Session(aws_access_key_id=key["AccessKeyId"],
                               aws_secret_access_key=key["SecretAccessKey"], region_name=REGION
                               ).client("sts", endpoint_url=f"http://127.0.0.1:{port}").get_caller_identity()
    # ... then every request is authenticated and authorized (moto/core/authorization.py, 5.2.5:
    # auth applies once request_count >= INITIAL_NO_AUTH_ACTION_COUNT).
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
    ActionAuthenticatorMixin.request_count = 0
    print(json.dumps({"port": port, "account_id": me["Account"], "admin_arn": me["Arn"],
                      "admin": {"access_key_id": key["AccessKeyId"],
                                "secret_access_key": key["SecretAccessKey"]}}), flush=True)
    sys.stdin.read()  # until the parent closes the pipe (or dies)
    # Not server.stop(): it joins request threads, and a client's keep-alive connection (pyarrow's
    # S3 client in the test process) would hold the child until the parent's SIGKILL.
    os._exit(0)


# ---- issue 22: moto's EC2/IAM server for Ray's cluster launcher (auth not enforced) ----------------
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


SERVERS["moto_ec2"] = moto_ec2_server


# ---- issue 23: Debian's Prometheus server, scraping what a test hands it ---------------------------------------

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


@register("prometheus")
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



# ---- a proxy that drops one stream (issue 19: a log stream lost mid-run) -------------------------------------

DROP_TIMEOUT_S = 120.0


@register("dropping_proxy")
class DroppingProxy:
    """A TCP proxy on 127.0.0.1 (port 0) in front of `upstream` (http://host:port) that cuts one connection.

    The first connection whose request carries `path_marker` (e.g. b"/logs/tail", the Jobs API's WebSocket
    log stream) is forwarded until the upstream's bytes to it contain `after`; then both sides are closed
    without a WebSocket close frame, as a dashboard restart or an idle-timeout proxy would. Every other
    connection is forwarded untouched. `dropped` counts the cuts; threads end with the sockets, and
    `__exit__` closes whatever is still open.
    """

    def __init__(self, upstream: str, *, path_marker: bytes, after: bytes, drops: int = 1):
        import socket

        host, _, port = upstream.removeprefix("http://").rstrip("/").partition(":")
        self._upstream = (host, int(port))
        self._marker, self._after, self._budget = path_marker, after, drops
        self._lock = threading.Lock()
        self._sockets: list = []
        self.dropped = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def __enter__(self) -> DroppingProxy:
        threading.Thread(target=self._accept, daemon=True, name="dropping-proxy").start()
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def _accept(self) -> None:
        import socket

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._upstream, timeout=DROP_TIMEOUT_S)
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._connection, args=(client, upstream), daemon=True).start()

    def _connection(self, client, upstream) -> None:
        request = client.recv(65536)
        with self._lock:
            cut = bool(request) and self._marker in request and self.dropped < self._budget
            if cut:
                self.dropped += 1  # claimed now, so a second stream opened meanwhile is left alone
        upstream.sendall(request)
        threading.Thread(target=self._pump, args=(client, upstream, None), daemon=True).start()
        self._pump(upstream, client, self._after if cut else None)

    @staticmethod
    def _pump(source, sink, cut_after: bytes | None) -> None:
        import socket

        seen = b""
        try:
            while data := source.recv(65536):
                sink.sendall(data)
                if cut_after is not None:
                    seen = (seen + data)[-65536:]
                    if cut_after in seen:
                        break
        except OSError:
            pass
        # shutdown, not just close: the other direction's thread is blocked in recv() on these sockets, and a
        # close alone would not send the FIN until that call returns.
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
# ---- issue 23 (EFA): Debian's node exporter, reading a test's sysfs tree ----------------------------------------
# A separate block: NodeExporter and node_exporter_missing only.

NODE_EXPORTER = "prometheus-node-exporter"
"""Debian's name for node_exporter (package prometheus-node-exporter, 1.5.0 in bookworm)."""
NODE_EXPORTER_INSTALL_HINT = ("Debian's prometheus-node-exporter package (1.5.0): `make setup` installs it when "
                              "apt-get can (root or passwordless sudo), or run "
                              "`apt-get install prometheus-node-exporter`")
NODE_EXPORTER_START_TIMEOUT_S = 30.0


def node_exporter_missing() -> str | None:
    """Why the node exporter cannot run here (None when `prometheus-node-exporter` is on PATH)."""
    import shutil

    return None if shutil.which(NODE_EXPORTER) else f"{NODE_EXPORTER} not found; install {NODE_EXPORTER_INSTALL_HINT}"


@register("node_exporter")
class NodeExporter:
    """Node exporter on 127.0.0.1, only `collectors` on, its sysfs `sysfs` and its textfile directory `textfile_dir`.

    It listens on port 0 and `address` is the port the kernel gave it: node exporter logs the listener's address,
    not the flag's ("Listening on" address=127.0.0.1:<port>, exporter-toolkit web/tls_config.go, as Debian's 1.5.0
    prints it), so there is no bind-and-release race.
    """

    def __init__(self, *, sysfs: Path, textfile_dir: Path, collectors: tuple[str, ...] = ("textfile", "infiniband")):
        self.sysfs = Path(sysfs)
        self.textfile_dir = Path(textfile_dir)
        self.collectors = collectors
        self.proc: subprocess.Popen | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        self.address = ""

    def __enter__(self) -> NodeExporter:
        import re

        reason = node_exporter_missing()
        if reason:
            raise RuntimeError(reason)
        self._tmp = tempfile.TemporaryDirectory(prefix="node-exporter-")
        log_path = Path(self._tmp.name) / "node-exporter.log"
        try:
            with log_path.open("wb") as log:
                self.proc = subprocess.Popen(
                    [NODE_EXPORTER, "--web.listen-address=127.0.0.1:0", f"--path.sysfs={self.sysfs}",
                     "--collector.disable-defaults", *(f"--collector.{c}" for c in self.collectors),
                     f"--collector.textfile.directory={self.textfile_dir}"],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            deadline = time.monotonic() + NODE_EXPORTER_START_TIMEOUT_S
            while not self.address:
                text = log_path.read_text(errors="replace")
                found = re.search(r'msg="Listening on" address=(127\.0\.0\.1:\d+)', text)
                if found:
                    self.address = found.group(1)
                elif self.proc.poll() is not None:
                    raise RuntimeError(f"node exporter exited at start: {text[-3000:]}")
                elif time.monotonic() > deadline:
                    raise RuntimeError(f"node exporter not listening within {NODE_EXPORTER_START_TIMEOUT_S:.0f} s: "
                                       f"{text[-3000:]}")
                else:
                    time.sleep(0.05)  # poll interval of the start wait, bounded by the deadline above
            return self
        except BaseException:
            self.__exit__()
            raise

    def metrics(self) -> str:
        """One scrape of /metrics, as text."""
        import urllib.request

        with urllib.request.urlopen(f"http://{self.address}/metrics", timeout=30) as reply:
            return reply.read().decode()

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            self.proc = None
        if self._tmp:
            self._tmp.cleanup()
            self._tmp = None

# ---- end of issue 23 (EFA) block ---------------------------------------------------------------------------------


# ---- issue 19: a proxy that holds uploads, so a kill lands mid-upload every time ---------------------------------

HOLD_TIMEOUT_S = 300.0  # a held upload whose client never goes away is dropped after this
UPSTREAM_TIMEOUT_S = 60.0
# Hop-by-hop headers (RFC 9110 7.6.1) are the proxy's own on each side; the body is re-sent whole, with its length.
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
               "content-length"}


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the AWS SDK inside pyarrow expects of S3
    proxy: StallingProxy  # set on a per-server subclass

    def do_GET(self):  # noqa: N802 (http.server's naming)
        self._relay()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET  # noqa: N815

    def _body(self) -> bytes | None:
        """The request's whole body, or None when the client went away before sending all of it."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                line = self.rfile.readline()
                if not line:
                    return None
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while (line := self.rfile.readline()) not in (b"\r\n", b"\n"):  # trailers
                        if not line:
                            return None
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                if len(parts[-1]) < size or not self.rfile.readline():
                    return None
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        return body if len(body) == length else None

    def _relay(self) -> None:
        body = self._body()  # the whole request first: a held one never reaches the server behind
        self.proxy._note(self.command, self.path, "received")
        if body is None:
            # The client went away mid-body (killed): nothing of it goes on, so the server behind never
            # waits for the rest of a body (moto 5.2.5 could, and then served nothing else: `_moto_child`).
            self.proxy._note(self.command, self.path, "incomplete body: dropped")
            self.close_connection = True
            return
        if self.proxy._hold(self):
            self.proxy._note(self.command, self.path, "hold ended")
            self.close_connection = True
            return
        # One upstream connection per request, closed before the reply goes back: no connection to the
        # server behind outlives a request, whatever happens to the client (moto 5.2.5's server stopped
        # answering after a client died mid-body: see `_moto_child`).
        upstream = http.client.HTTPConnection(self.proxy.upstream_host, self.proxy.upstream_port,
                                              timeout=UPSTREAM_TIMEOUT_S)
        try:
            # Headers as the client sent them, Host included: the SigV4 signature covers it.
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for key, value in self.headers.items():
                if key.lower() not in _HOP_BY_HOP:
                    upstream.putheader(key, value)
            if body or self.command in ("PUT", "POST"):
                upstream.putheader("Content-Length", str(len(body)))
            upstream.endheaders(body or None)
            reply = upstream.getresponse()
            data = reply.read()
            status, reason, headers = reply.status, reply.reason, reply.getheaders()
        finally:
            upstream.close()
        with self.proxy._lock:  # counted before the reply goes back: a client that has its reply sees the count
            self.proxy.forwarded += 1
        self.send_response_only(status, reason)
        for key, value in headers:
            if key.lower() not in _HOP_BY_HOP:
                self.send_header(key, value)
        # A HEAD reply's Content-Length is the object's size; its body is empty.
        length = dict((k.lower(), v) for k, v in headers).get("content-length", "0")
        self.send_header("Content-Length", length if self.command == "HEAD" else str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self.proxy._note(self.command, self.path, f"forwarded: {status}")

    def log_message(self, *args):  # quiet
        pass


@register("stalling_proxy")
class StallingProxy:
    """An HTTP proxy on 127.0.0.1:<port 0> in front of `upstream` (an `http://host:port` URL).

    It forwards each request whole and relays the reply. After `arm(text)` it holds every upload (PUT or
    POST: PutObject, UploadPart, Create/CompleteMultipartUpload) whose path contains `text`: the request
    is read, never forwarded and never answered, so the client's upload cannot complete; the hold ends
    when the client goes away (killed), at `HOLD_TIMEOUT_S`, or when the proxy stops, and the client's
    connection is then closed. `held` lists the held paths; `wait_held` waits for one. The server behind
    never sees a held request, nor a part of one.
    """

    def __init__(self, upstream: str):
        from urllib.parse import urlsplit

        parts = urlsplit(upstream)
        self.upstream_host, self.upstream_port = parts.hostname, parts.port
        self.endpoint_url = ""
        self.forwarded = 0
        self.events: list[tuple[float, str, str, str]] = []  # (time, method, path, what happened): for a failure
        self._armed: str | None = None
        self._held: list[str] = []
        self._lock = threading.Condition()
        self._stopping = threading.Event()
        self._server: ThreadedHTTPServer | None = None

    def __enter__(self) -> StallingProxy:
        handler = type("Handler", (_ProxyHandler,), {"proxy": self})
        self._server = ThreadedHTTPServer(handler)
        self.endpoint_url = f"http://127.0.0.1:{self._server.port}"
        return self

    def __exit__(self, *exc) -> None:
        self._stopping.set()  # releases every hold within one poll
        if self._server:
            self._server.close()
            self._server = None

    def arm(self, text: str) -> None:
        with self._lock:
            self._armed = text

    def disarm(self) -> None:
        with self._lock:
            self._armed = None

    @property
    def held(self) -> list[str]:
        with self._lock:
            return list(self._held)

    def wait_held(self, timeout_s: float) -> list[str]:
        """The held paths, once there is one; TimeoutError after `timeout_s` without any."""
        with self._lock:
            if not self._lock.wait_for(lambda: self._held, timeout=timeout_s):
                raise TimeoutError(f"no upload held within {timeout_s:.0f} s ({self.forwarded} requests forwarded)")
            return list(self._held)

    def _note(self, method: str, path: str, what: str) -> None:
        with self._lock:
            self.events.append((time.time(), method, path, what))

    def _hold(self, handler: _ProxyHandler) -> bool:
        """Hold the handler's request if armed for it (returns once the hold ends); False to forward it."""
        with self._lock:
            if not (self._armed and handler.command in ("PUT", "POST") and self._armed in handler.path):
                return False
            self._held.append(handler.path)
            self._lock.notify_all()
        sock, deadline = handler.connection, time.monotonic() + HOLD_TIMEOUT_S
        while not self._stopping.is_set() and time.monotonic() < deadline:
            readable, _, _ = select.select([sock], [], [], 0.2)
            if not readable:
                continue
            try:
                if not sock.recv(1, socket.MSG_PEEK):  # end of stream: the client is gone
                    break
            except OSError:
                break
            self._stopping.wait(0.2)  # bytes beyond the held request: not read, the hold goes on
        return True


if __name__ == "__main__":
    if sys.argv[1:] == ["moto"]:
        _moto_child()
    else:
        sys.exit(f"usage: python -m harness.loopback moto (got {sys.argv[1:]})")
