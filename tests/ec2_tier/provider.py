"""The tier's NodeProvider (`provider: {type: external, module: provider.NamespaceNodeProvider}`): Ray's
NodeProvider API (ray 2.58.0, ray/autoscaler/node_provider.py) over the tier's cloud (cloud.py).

Imported by `ray up` on this machine and by the autoscaler (`ray start --head --autoscaling-config`) in the
head container, so it uses the standard library only and finds the cloud at `provider.cloud_url`.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from ray.autoscaler.node_launch_exception import NodeLaunchException
from ray.autoscaler.node_provider import NodeProvider


class NamespaceNodeProvider(NodeProvider):
    def __init__(self, provider_config: dict[str, Any], cluster_name: str) -> None:
        super().__init__(provider_config, cluster_name)
        self.url = provider_config["cloud_url"]

    def _call(self, op: str, **body):
        request = urllib.request.Request(f"{self.url}/{op}", data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            message = json.loads(exc.read()).get("error", str(exc))
            raise NodeLaunchException("InsufficientInstanceCapacity", message, None) from None

    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        return self._call("list", tag_filters=tag_filters)

    def is_running(self, node_id: str) -> bool:
        return self._call("describe", node_id=node_id)["state"] == "running"

    def is_terminated(self, node_id: str) -> bool:
        return self._call("describe", node_id=node_id)["state"] == "terminated"

    def node_tags(self, node_id: str) -> dict[str, str]:
        return self._call("describe", node_id=node_id)["tags"]

    def external_ip(self, node_id: str) -> str:
        return self._call("describe", node_id=node_id)["ip"]

    def internal_ip(self, node_id: str) -> str:
        return self._call("describe", node_id=node_id)["ip"]

    def create_node(self, node_config: dict[str, Any], tags: dict[str, str], count: int):
        self._call("create", node_config=node_config, tags=tags, count=count)
        return None

    def set_node_tags(self, node_id: str, tags: dict[str, str]) -> None:
        self._call("set_tags", node_id=node_id, tags=tags)

    def terminate_node(self, node_id: str):
        self._call("terminate", node_ids=[node_id])
        return None

    def terminate_nodes(self, node_ids: list[str]):
        self._call("terminate", node_ids=list(node_ids))
        return None

    @staticmethod
    def bootstrap_config(cluster_config: dict[str, Any]) -> dict[str, Any]:
        return cluster_config
