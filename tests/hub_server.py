"""A Hugging Face Hub stand-in on 127.0.0.1 (port 0) that serves one gated model repository to one token.

Reached through `HF_ENDPOINT`. It answers the requests huggingface_hub 1.33 makes for `repo_info`,
`snapshot_download` and `hf_hub_download` (hf_api.py `repo_info` / `list_repo_tree`,
file_download.py `get_hf_file_metadata`: HEAD then GET of `/{repo}/resolve/{revision}/{file}` with
`X-Repo-Commit`, `ETag` and `Content-Length`), and only with `Authorization: Bearer <token>`; any
other request gets 401. `token=None` makes a Hub that refuses everyone. `requests` records
(method, path, whether the right token came) for each request.
"""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from harness.loopback import ThreadedHTTPServer, register

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub

    def do_HEAD(self):  # noqa: N802 (http.server's naming)
        self._serve(body=False)

    def do_GET(self):  # noqa: N802
        self._serve(body=True)

    def _serve(self, *, body: bool) -> None:
        hub = self.hub
        path = urllib.parse.urlparse(self.path).path
        authorized = hub.token is not None and self.headers.get("Authorization") == f"Bearer {hub.token}"
        with hub.lock:
            hub.requests.append((self.command, path, authorized))
        if not authorized:
            # The Hub's answer to a missing or invalid token on a gated repository.
            return self._reply(401, json.dumps({"error": "Invalid credentials in Authorization header"}).encode(),
                               body=body)
        repo = hub.repo
        info_paths = {f"/api/models/{repo}", f"/api/models/{repo}/revision/main",
                      f"/api/models/{repo}/revision/{COMMIT}"}
        if path in info_paths:
            info = {"id": repo, "modelId": repo, "sha": COMMIT, "private": False, "gated": "manual",
                    "siblings": [{"rfilename": name} for name in hub.files]}
            return self._reply(200, json.dumps(info).encode(), body=body)
        if path == f"/api/models/{repo}/auth-check":
            return self._reply(200, b"{}", body=body)
        if path.startswith(f"/api/models/{repo}/tree/"):
            tree = [{"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                    for name, data in hub.files.items()]
            return self._reply(200, json.dumps(tree).encode(), body=body)
        for revision in ("main", COMMIT):
            prefix = f"/{repo}/resolve/{revision}/"
            if path.startswith(prefix) and path[len(prefix):] in hub.files:
                data = hub.files[path[len(prefix):]]
                return self._reply(200, data, body=body, headers={
                    "X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                    "Content-Type": "application/octet-stream"})
        return self._reply(404, json.dumps({"error": "Entry not found"}).encode(), body=body,
                           headers={"X-Error-Code": "EntryNotFound"})

    def _reply(self, status: int, data: bytes, *, body: bool, headers: dict | None = None) -> None:
        self.send_response(status)
        for key, value in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, *args):  # quiet
        pass


@register("hub")
class FakeHub:
    """One repository `repo` with `files` (name -> bytes, or a directory whose files are served), for `token`."""

    def __init__(self, *, repo: str = "acme/gated-model", token: str | None = None,
                 files: dict[str, bytes] | Path | None = None):
        self.repo, self.token = repo, token
        if isinstance(files, Path):
            files = {p.name: p.read_bytes() for p in sorted(files.iterdir()) if p.is_file()}
        self.files = files or {"config.json": b"{}"}
        self.requests: list[tuple[str, str, bool]] = []
        self.lock = threading.Lock()
        self.url = ""

    def __enter__(self) -> FakeHub:
        handler = type("Handler", (_Handler,), {"hub": self})
        self._server = ThreadedHTTPServer(handler)
        self.url = f"http://127.0.0.1:{self._server.port}"
        return self

    def __exit__(self, *exc) -> None:
        self._server.close()
