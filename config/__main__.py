"""`python -m config check [FILE]`: validate a variable file and print the plan it implies.

`python -m config reference [--write [PAGE]]`: the field reference table (PAGE: docs/reference.md)."""

# The config package knows nothing of the workload: `python -m workloads.check [FILE]` runs this check and
# then counts a local dataset's tokens and epochs with the workload's data pipeline.

from __future__ import annotations

import argparse

from config.catalog import load_catalog
from config.cli import add_file_argument, chosen_file
from config.errors import FAILED, UserError, report, run_cli
from config.hub import token_warnings
from config.loader import ConfigError, load_config, load_or_exit, resolve_path
from config.mesh import mesh_plan
from config.model import ClusterConfig
from config.observability import EFA_SIDECAR_REQUESTS
from config.target import target_problems
from config.versions import image_tag_moves


def plan(config: ClusterConfig) -> str:
    """A short human summary: nodes, GPUs, world size, EFA, pod resources, autoscaling and cost idle / running."""
    lines = [f"cluster {config.cluster.name} in {config.region} (GPU nodes in {config.gpu_availability_zone}), "
             f"EKS {config.cluster.kubernetes_version}, transport {config.nccl.transport}"]
    system = config.cluster.system_nodes
    head = config.head_resources
    lines.append(f"  system: {system.nodes} x {system.instance_type}; Ray head {head.cpu} CPU, {head.memory_gib} GiB, "
                 f"/dev/shm {head.shm_gib} GiB, object store {_gib(head.object_store_mib)} GiB")
    for group in config.cluster.worker_groups:
        itype = config.instance(group)
        res = config.pod_resources[group.name]
        lines.append(
            f"  {group.name}: {group.nodes} x {group.instance_type} ({group.capacity}; node group "
            f"min/desired/max {config.group_min(group)}/{config.group_desired(group)}/{config.group_max(group)}), "
            f"{itype.gpus} x "
            f"{itype.gpu_model or 'logical GPU (lab)'} per node, {config.pods_per_node(group)} pod(s)/node, "
            f"{config.pods(group)} pods; "
            f"per pod {res.gpus} GPU, {res.cpu} CPU, {res.memory_gib} GiB, /dev/shm {res.shm_gib} GiB "
            f"(object store {_gib(res.object_store_mib)} GiB), EFA {res.efa_devices}, "
            f"hugepages-2Mi {res.hugepages_2mi_mib} MiB")
    lines.append(f"  world size {config.world_size} (one Ray Train worker per GPU, {config.cpus_per_worker} CPU each), "
                 f"gradient accumulation {config.grad_accumulation}")
    mesh = mesh_plan(config)
    where = ("shard within each node, replicate across nodes" if mesh.sharding == "hybrid"
             else "one group over all ranks")
    lines.append(f"  sharding {mesh.sharding} (job.sharding: {config.job.sharding}): mesh {mesh.mesh_shape} "
                 f"{mesh.mesh_dim_names}, {where}")
    scaler = (f"Cluster Autoscaler on, idle GPU nodes removed after {config.autoscaling.scale_down_minutes} min"
              if config.autoscaling.enabled else "Cluster Autoscaler off, fixed node groups")
    lines.append(f"  {scaler}")
    gpu_minimum = ", GPU minimum" if any(config.group_min(g) for g in config.cluster.worker_groups) else ""
    if config.target == "ec2":
        # target: ec2 has no control plane and no system nodes: the head instance and NAT (config.target).
        from config.target import ec2_cost_per_hour

        idle, running = ec2_cost_per_hour(config)
        lines.append(f"  on-demand cost (target: ec2): idle ${idle:.2f}/hour (head {config.ec2.head_instance_type}, "
                     f"NAT{gpu_minimum}), while a job runs ${running:.2f}/hour (prices of "
                     f"{load_catalog().price_date})")
    else:
        lines.append(f"  on-demand cost: idle ${config.idle_cost_per_hour:.2f}/hour (control plane, NAT, system "
                     f"nodes{gpu_minimum}), while a job runs ${config.cost_per_hour:.2f}/hour (prices of "
                     f"{load_catalog().price_date})")
    lines.append(f"  {observability_line(config)}")
    lines.append(f"  {endpoint_line(config)}")
    lines += [f"  {line}" for line in day_two_lines(config)]
    return "\n".join(lines)


def endpoint_line(config: ClusterConfig) -> str:
    """Who can reach the Kubernetes API endpoint (`cluster.endpoint_access`, `public_access_cidrs`)."""
    section = config.cluster
    if section.endpoint_access == "private":
        return "Kubernetes API endpoint: private, reachable only from inside the VPC (closed by default)"
    who = ("the whole internet (endpoint_open_to_internet: true)" if "0.0.0.0/0" in section.public_access_cidrs
           else ", ".join(section.public_access_cidrs))
    private = " and from inside the VPC" if section.endpoint_access == "public_and_private" else ""
    return f"Kubernetes API endpoint: public to {who}{private}"


def day_two_lines(config: ClusterConfig) -> list[str]:
    """What a later deploy does to the node groups (docs/lifecycle.md; tests/test_lifecycle_templates.py)."""
    lines = []
    # The groups whose size is not the template's once they exist: all under the autoscaler, and a capacity block's.
    owned = [g for g in config.cluster.worker_groups if config.autoscaling.enabled or g.capacity == "capacity_block"]
    new = [g.name for g in owned if not g.deployed]
    if new:
        lines.append(f"node groups {', '.join(new)}: deployed: false, so the template sets DesiredSize to the "
                     "group minimum, which creating a group needs; once the deploy has created them set "
                     "deployed: true, so that later deploys leave out DesiredSize and keep the size the Cluster "
                     "Autoscaler (or you, for a capacity block) set (a teardown deletes the groups: set it back to "
                     "false before a redeploy); --online compares deployed with the node groups EKS has")
    if config.autoscaling.enabled:
        lines.append("min_nodes/max_nodes of a deployed group: only its limits change, running nodes stay (EKS refuses "
                     "a min_nodes above the group's current size, and the deploy rolls back unchanged)")
    lines.append("a worker group's instance_type, disk_gib or cluster.node_ami_release_version replaces every node of "
                 "the group one at a time: a running job ends, so deploy such a change between jobs "
                 "(python -m ops.check --against OLD lists what a deploy rolls)")
    return lines


def observability_line(config: ClusterConfig) -> str:
    """What the metrics stack runs and what it costs (`observability`)."""
    section = config.observability
    if not section.enabled:
        return "metrics stack off (observability.enabled: false): no Prometheus, Grafana or DCGM exporter"
    cpu_m, mem_mib = section.requests
    system = config.system_instance
    share = section.usd_per_hour(system_usd_per_hour=system.usd_per_hour, system_vcpus=system.vcpus,
                                 system_memory_gib=system.memory_gib)
    gpu = "dcgm-exporter on each GPU node, " if section.dcgm_exporter else ""
    efa_cpu_m, efa_mib = EFA_SIDECAR_REQUESTS
    return (f"metrics stack: kube-prometheus-stack on the system nodes ({cpu_m / 1000:g} CPU, {_gib(mem_mib)} GiB "
            f"requested, ${share:.2f}/hour of their price, inside the idle cost; no other AWS charge), node exporter "
            f"with its EFA counters sidecar on every node ({efa_cpu_m}m CPU, {efa_mib} MiB each, in the DaemonSet "
            f"share), {gpu}Prometheus keeps {section.retention_hours} h in {section.storage_gib} GiB, "
            f"scrapes every {section.scrape_interval_s} s")


def _gib(mib: int) -> str:
    return f"{mib / 1024:g}"


def warnings(config: ClusterConfig) -> list[str]:
    """What the file leaves to chance or to the user's hands after the deploy."""
    out = []
    if not config.cluster.admin_role_arn:
        out.append(
            "cluster.admin_role_arn is null: after the deploy no one can use kubectl (the only access entry is the "
            "stack's kubectl handler). Set it to your role, or grant yourself after the deploy: aws eks "
            f"create-access-entry --cluster-name {config.cluster.name} --principal-arn <your role ARN> && aws eks "
            f"associate-access-policy --cluster-name {config.cluster.name} --principal-arn <your role ARN> "
            "--policy-arn arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy "
            "--access-scope type=cluster (docs/lifecycle.md)")
    if config.cluster.endpoint_access == "private":
        out.append(
            "cluster.endpoint_access is private: the stacks deploy, but kubectl from this machine (every step after "
            "`cdk deploy`: the manifests, the dashboards, workloads.verify) cannot reach the API. The one edit for "
            "that: endpoint_access: public_and_private and public_access_cidrs: [<your address>/32] (curl -s "
            "https://checkip.amazonaws.com); or run kubectl from inside the VPC (docs/security.md)")
    elif config.cluster.endpoint_open_to_internet and "0.0.0.0/0" in config.cluster.public_access_cidrs:
        out.append("cluster.endpoint_open_to_internet: the Kubernetes API endpoint answers the whole internet "
                   "(IAM authentication still applies); narrow public_access_cidrs to your own addresses")
    if not config.ray.image_by_digest and image_tag_moves(config.ray.image):
        # DLC releases carry a moving major.minor tag and one patch-level tag each (aws/deep-learning-containers
        # docs/ray-train/changelog/index.md): only the latter, or a digest, names one build.
        out.append(
            f"ray.image {config.ray.image} is a tag that can move: a republished tag and the IfNotPresent pull let "
            "nodes started on different days run different builds. Pin a release tag (the DLC's -vX.Y.Z) or the "
            f"digest: ray.image: {config.ray.image}@sha256:<digest> (docker buildx imagetools inspect "
            f"{config.ray.image}; docs/lifecycle.md)")
    # A gated model without a token: a warning, not an error, since the model may be on this machine.
    out += [f"{w.path}: {w.message}" for w in token_warnings(config.job)]
    return out


def check(file: str | None, *, online: bool = False) -> ClusterConfig:
    """Load and validate the variable file (exit 2 with one line per problem on stderr), print OK, its plan and
    its warnings.

    Offline (the default) nothing touches the network: each check that would is named on one `note:` line
    (stderr). `online` runs them (config/online.py), each request bounded in time; a problem they find
    exits 2 like any other."""
    import sys

    from config.online import offline_notes, online_findings

    config = load_or_exit(file)
    if config.target != "ec2":
        for line in target_problems(config, "ec2"):
            print(f"note: make synth skips the EC2 target for this file (synth-ec2), which refuses {line}",
                  file=sys.stderr)
    if online:
        found = online_findings(config)
        for note in found.notes:
            print(f"note: {note}", file=sys.stderr)
        if found.problems:
            # An exit, as load_or_exit's above: tests and `ops.check` call check() in process.
            raise SystemExit(report(ConfigError(resolve_path(file), found.problems)))
    else:
        for note in offline_notes(config):
            print(f"note: {note}", file=sys.stderr)
    print(f"{resolve_path(file)}: OK")
    print(plan(config))
    for line in warnings(config):
        print(f"warning: {line}")
    return config


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit 0 with the plan, or 2 with one line per problem on stderr."""
    parser = argparse.ArgumentParser(prog="python -m config", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    check_cmd = sub.add_parser("check", help="validate a variable file and print its plan")
    add_file_argument(check_cmd)
    check_cmd.add_argument("--online", action="store_true",
                           help="also check what needs the network: Hub ids, S3 buckets and, with AWS credentials, "
                                "GPU quotas, instance offerings in the GPU AZ and capacity reservations")
    suits = sub.add_parser("suits", help="exit 0 if the file synthesizes for TARGET, else 1 with the rules it "
                                         "breaks (the Makefile's synth-ec2 asks before synthesizing)")
    suits.add_argument("target", choices=("eks", "ec2"))
    add_file_argument(suits)
    reference = sub.add_parser("reference", help="print the field reference table (docs/reference.md)")
    reference.add_argument("--write", metavar="PAGE", nargs="?", const="docs/reference.md",
                           help="update the table in this page instead (default page: docs/reference.md)")
    args = parser.parse_args(argv)
    if args.command == "reference":
        from pathlib import Path

        from config.reference import reference_table, write_into

        if args.write:
            print(f"{args.write}: {'updated' if write_into(Path(args.write)) else 'already current'}")
        else:
            print(reference_table())
        return 0
    if args.command == "suits":
        problems = target_problems(load_config(chosen_file(suits, args)), args.target)
        if problems:
            raise UserError("; ".join(problems), exit_code=FAILED)
        return 0
    check(chosen_file(check_cmd, args), online=args.online)
    return 0


if __name__ == "__main__":
    run_cli(main)
