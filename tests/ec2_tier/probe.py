"""Run inside the head container by the tier (`ray exec ... python /opt/ec2-tier/probe.py WHAT`): prints one JSON
line. `gpu-task`: a task that asks for a GPU (the demand that makes the autoscaler start a worker) answers with
the IP of the node it ran on. `nodes`: the alive nodes' IPs and resources. `auth`: the Jobs API's answer without
and with the token."""

import json
import os
import sys
import urllib.error
import urllib.request


def _status(headers: dict) -> int:
    request = urllib.request.Request("http://127.0.0.1:8265/api/jobs/", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def main(what: str) -> None:
    if what == "auth":
        # The Jobs API without a token, and with the one in the file RAY_AUTH_TOKEN_PATH names (the env has no token).
        with open(os.environ["RAY_AUTH_TOKEN_PATH"]) as fh:
            token = fh.read().strip()
        print(json.dumps({"without": _status({}), "with": _status({"Authorization": f"Bearer {token}"}),
                          "token_in_env": "RAY_AUTH_TOKEN" in os.environ}))
        return
    import ray

    ray.init(address="auto", log_to_driver=False)
    if what == "gpu-task":
        @ray.remote(num_gpus=1, num_cpus=0)
        def where() -> str:
            return ray.util.get_node_ip_address()

        print(json.dumps({"node_ip": ray.get(where.remote(), timeout=600)}))
    elif what == "nodes":
        print(json.dumps([{"ip": n["NodeManagerAddress"], "resources": n["Resources"]}
                          for n in ray.nodes() if n["Alive"]]))


if __name__ == "__main__":
    main(sys.argv[1])
