"""The tier's "EC2 API": instances are the namespace hosts; the test NodeProvider (provider.py) calls it over
HTTP from `ray up` on this machine and from the autoscaler in the head container, as Ray's AWS provider calls
EC2 from both places. Launching assigns a free host (the head type to the head host, worker types to the
worker hosts; none free = a capacity shortage, refused as EC2's InsufficientInstanceCapacity is);
terminating an instance removes every container on its host's daemon (an instance that is gone runs nothing).
"""

from __future__ import annotations

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.ec2_tier.hosts import Host

HEAD_KIND = "head"
TAG_NODE_KIND = "ray-node-type"  # ray/autoscaler/tags.py TAG_RAY_NODE_KIND (ray 2.58.0)


class Cloud:
    def __init__(self, hosts: list[Host], bind: str, *, head_host: str = "head"):
        self.hosts = {h.name: h for h in hosts}
        self.head_host = head_host
        self.instances: dict[str, dict] = {}  # id -> {host, tags, state}
        self.lock = threading.Lock()
        self.calls: list[str] = []
        self.capacity_shortage = False
        self._ids = itertools.count(1)
        cloud = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                op = self.path.strip("/")
                try:
                    status, answer = 200, getattr(cloud, f"op_{op}")(**body)
                except CloudError as exc:
                    status, answer = 409, {"error": str(exc)}
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((bind, 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{bind}:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ---- the API (each op takes and returns JSON) -----------------------------------------------
    def _live(self) -> dict[str, dict]:
        return {i: n for i, n in self.instances.items() if n["state"] == "running"}

    def op_list(self, tag_filters: dict) -> list[str]:
        with self.lock:
            return [i for i, n in self._live().items()
                    if all(n["tags"].get(k) == v for k, v in tag_filters.items())]

    def op_describe(self, node_id: str) -> dict:
        with self.lock:
            node = self.instances[node_id]
            return {"tags": node["tags"], "state": node["state"], "ip": self.hosts[node["host"]].ip}

    def op_create(self, node_config: dict, tags: dict, count: int) -> list[str]:
        with self.lock:
            self.calls.append(f"create {tags.get('ray-user-node-type', '?')} x{count}")
            if self.capacity_shortage:
                raise CloudError("InsufficientInstanceCapacity: no capacity for "
                                 f"{node_config.get('InstanceType')} (the tier's capacity shortage)")
            busy = {n["host"] for n in self._live().values()}
            head = tags.get(TAG_NODE_KIND) == HEAD_KIND
            free = [h for h in self.hosts if h not in busy and (h == self.head_host) == head]
            if len(free) < count:
                raise CloudError(f"InsufficientInstanceCapacity: {count} x {node_config.get('InstanceType')} "
                                 f"asked, {len(free)} host(s) free")
            made = []
            for host in free[:count]:
                node_id = f"i-{next(self._ids):017x}"
                self.instances[node_id] = {"host": host, "tags": dict(tags), "state": "running",
                                           "instance_type": node_config.get("InstanceType")}
                made.append(node_id)
            return made

    def op_set_tags(self, node_id: str, tags: dict) -> None:
        with self.lock:
            self.instances[node_id]["tags"].update(tags)

    def op_terminate(self, node_ids: list[str]) -> None:
        for node_id in node_ids:
            with self.lock:
                node = self.instances.get(node_id)
                if node is None or node["state"] != "running":
                    continue
                node["state"] = "terminated"
                self.calls.append(f"terminate {node['tags'].get('ray-user-node-type', '?')}")
            self.hosts[node["host"]].remove_containers()

    # ---- for the tests ------------------------------------------------------------------------
    def running(self) -> dict[str, str]:
        """node type -> host of each running instance."""
        with self.lock:
            return {n["tags"].get("ray-user-node-type", "?"): n["host"] for n in self._live().values()}


class CloudError(Exception):
    pass
