"""Run inside the head container by the tier (`ray exec ... python /opt/ec2-tier/probe.py WHAT`): prints one JSON
line. `gpu-task`: a task that asks for a GPU (the demand that makes the autoscaler start a worker) answers with
the IP of the node it ran on. `nodes`: the alive nodes' IPs and resources."""

import json
import sys

import ray


def main(what: str) -> None:
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
