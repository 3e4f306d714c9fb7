"""`python -m workloads.verify_ec2`: `workloads.verify` for `target: ec2`, read through the Ray dashboard.

No Kubernetes there: the nodes come from Ray's State API and the last job's preflight verdict from the Jobs
API (both on the head's dashboard, reached as `ray job submit` reaches it: `ray dashboard out/ec2/cluster.yaml`
forwards it to 127.0.0.1:8265, and RAY_AUTH_TOKEN carries the token). Decisions are pure functions over
plain dicts (the State API's node records, the Jobs API's job details), so they are tested without a cluster.
"""

from __future__ import annotations

import argparse

from config.catalog import load_catalog
from config.cli import add_file_argument, chosen_file
from config.errors import UserError
from workloads.verify import Row, check_preflight, failed, parse_preflight_marker, render

DEFAULT_ADDRESS = "http://127.0.0.1:8265"


def check_nodes(nodes: list[dict], config) -> list[Row]:
    """The head holds no CPU or GPU for tasks; each worker group's alive nodes carry the type's GPUs.

    `nodes`: Ray State API node records (`state`, `is_head_node`, `resources_total`). With the autoscaler's
    minimum at 0 a group with no node is idle (SKIP), as on EKS under the Cluster Autoscaler.
    """
    rows = []
    alive = [n for n in nodes if n.get("state") == "ALIVE"]
    heads = [n for n in alive if n.get("is_head_node")]
    if len(heads) != 1:
        rows.append(Row(section="ray", name="head", status="FAIL", detail=f"{len(heads)} alive head node(s)",
                        fix="ray up out/ec2/cluster.yaml; ray monitor out/ec2/cluster.yaml shows why it is down"))
    else:
        total = heads[0].get("resources_total") or {}
        busy = {k: total.get(k, 0) for k in ("CPU", "GPU") if total.get(k, 0)}
        rows.append(Row(section="ray", name="head", status="FAIL" if busy else "PASS",
                        detail=f"head offers {busy} to tasks" if busy else "alive, CPU 0 and GPU 0 (trains nothing)",
                        fix="render the launcher YAML again (head resources: CPU 0, GPU 0) and ray up"))
    workers = [n for n in alive if not n.get("is_head_node")]
    catalog = load_catalog()
    for group in config.cluster.worker_groups:
        gpus = catalog.instances[group.instance_type].gpus
        mine = [n for n in workers if (n.get("resources_total") or {}).get("GPU", 0) == gpus]
        name = f"group {group.name}"
        if not mine:
            status = "SKIP" if config.group_min(group) == 0 else "FAIL"
            rows.append(Row(section="ray", name=name, status=status,
                            detail=f"no worker node with {gpus} GPUs (idle: Ray's autoscaler starts them for a job)"
                            if status == "SKIP" else f"no worker node, min_workers {config.group_min(group)}",
                            fix="ray monitor out/ec2/cluster.yaml shows the launch errors (capacity, quota, AMI)"))
        else:
            rows.append(Row(section="ray", name=name, status="PASS",
                            detail=f"{len(mine)} of {group.nodes} node(s) alive with {gpus} GPUs each"))
    return rows


def latest_job(jobs: list[dict]) -> dict | None:
    """The most recently started job (Jobs API details: `submission_id`, `status`, `start_time`)."""
    return max(jobs, key=lambda j: j.get("start_time") or 0, default=None)


def evaluate(config, *, nodes: list[dict], jobs: list[dict], job_logs: str | None) -> list[Row]:
    """Every row for one snapshot of the Ray cluster."""
    job = latest_job(jobs)
    as_rayjob = None if job is None else {"metadata": {"name": job.get("submission_id") or job.get("job_id")},
                                          "status": {"jobStatus": job.get("status")}}
    return check_nodes(nodes, config) + [check_preflight(as_rayjob, job_logs, config)]


def gather(address: str) -> dict:
    """Nodes and jobs through the dashboard at `address` (RAY_AUTH_TOKEN in the environment under token auth)."""
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import list_nodes

    client = JobSubmissionClient(address)
    nodes = [dict(n.__dict__) if not isinstance(n, dict) else n for n in list_nodes(address=address, detail=True)]
    jobs = [j.dict() if hasattr(j, "dict") else dict(j.__dict__) for j in client.list_jobs()]
    job = latest_job(jobs)
    logs = None
    if job is not None and job.get("submission_id"):
        text = client.get_job_logs(job["submission_id"])
        marker = [line for line in text.splitlines() if parse_preflight_marker([line]) is not None]
        logs = marker[-1] if marker else ""
    return {"nodes": nodes, "jobs": jobs, "job_logs": logs}


def main(argv: list[str] | None = None) -> int:
    """0 all passed, 1 a check failed, 2 the dashboard cannot be reached or a bad variable file."""
    parser = argparse.ArgumentParser(prog="python -m workloads.verify_ec2", description="Verify a `ray up` cluster.")
    add_file_argument(parser)
    parser.add_argument("--address", default=DEFAULT_ADDRESS,
                        help=f"the Ray dashboard (default: {DEFAULT_ADDRESS}, where `ray dashboard` forwards it)")
    args = parser.parse_args(argv)

    from config import load_or_exit

    config = load_or_exit(chosen_file(parser, args))
    address = args.address
    try:
        snapshot = gather(address)
    except Exception as exc:  # noqa: BLE001 - any client error means we could not look
        raise UserError(f"verify: cannot reach the Ray dashboard at {address}: {type(exc).__name__}: {exc}\n"
                        "  fix: ray dashboard out/ec2/cluster.yaml (in another shell), and export RAY_AUTH_MODE=token "
                        "RAY_AUTH_TOKEN=... (docs/ec2.md)") from None
    rows = evaluate(config, **snapshot)
    print(render(rows))
    return 1 if failed(rows) else 0


if __name__ == "__main__":
    from config.errors import run_cli

    run_cli(main)
