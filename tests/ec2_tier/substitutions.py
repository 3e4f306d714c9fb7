"""What the tier's YAML may change in the YAML `python -m ops.launcher render` writes, and why: the declared
table, and `differences()`, which lists every change between two launcher YAMLs so a test can fail on any change
the table does not declare.

A change is a `Change(path, old, new, why)`: a scalar or a mapping replaced at `path` (dotted; `old` or `new`
None where a key is added or dropped), or one list item dropped (`old`) or added (`new`) at `path`.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path

PROVIDER_MODULE = "provider.NamespaceNodeProvider"
MODULE_DIR = "/opt/ec2-tier"
# The tier's object store per node: this machine has 24 GiB for two nodes and everything else, where an
# m7i.2xlarge head has 32 GiB and a g6.12xlarge worker 192 GiB (what the rendered sizes are computed from).
TIER_OBJECT_STORE_BYTES = 512 * 1024**2
# Ray starts up to CPU-count worker processes per node; two cores cannot hold the 48 of a g6.12xlarge.
TIER_WORKER_CPUS = 2


@dataclass(frozen=True)
class Change:
    path: str
    old: object
    new: object
    why: str = ""
    whole: bool = False
    """A key set, added or dropped as a whole: it covers every difference under `path`."""

    def key(self) -> tuple:
        return (self.path, repr(self.old), repr(self.new))


def _walk(a, b, path: str, out: list[Change]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            sub = f"{path}.{k}" if path else str(k)
            if k not in b:
                out.append(Change(sub, a[k], None))
            elif k not in a:
                out.append(Change(sub, None, b[k]))
            else:
                _walk(a[k], b[k], sub, out)
    elif isinstance(a, list) and isinstance(b, list):
        for item in a:
            if item not in b:
                out.append(Change(path, item, None))
        for item in b:
            if item not in a:
                out.append(Change(path, None, item))
    elif a != b:
        out.append(Change(path, a, b))


def differences(rendered: dict, tier: dict) -> list[Change]:
    out: list[Change] = []
    _walk(rendered, tier, "", out)
    return out


@dataclass(frozen=True)
class Context:
    cloud_url: str
    key_path: Path
    image_tag: str
    venv: Path
    python_base: Path
    module_dir: Path
    """This checkout's tests/ec2_tier (bind-mounted at MODULE_DIR so the head's autoscaler imports the provider)."""
    s3_env: dict[str, str] | None = None
    """The fine-tune's S3: the tier's S3 server on the bridge and its keys (instance profile and AWS S3 on EC2)."""
    data_dir: Path | None = None
    """The fine-tune's local data folder (the file's job.dataset), bind-mounted read-only at its own path."""


def _replace_item(items: list, old, new, path: str, why: str, table: list[Change]) -> None:
    index = items.index(old)
    if new is None:
        items.pop(index)
    else:
        items[index] = new
    table.append(Change(path, old, None, why))
    if new is not None:
        table.append(Change(path, None, new, why))


def apply(rendered: dict, ctx: Context) -> tuple[dict, list[Change]]:
    """The YAML the tier runs, and the table of every change made to `rendered`."""
    tier = copy.deepcopy(rendered)
    table: list[Change] = []

    def setkey(mapping: dict, path: str, key: str, value, why: str) -> None:
        old = mapping.get(key)
        if value is None:
            mapping.pop(key, None)
        else:
            mapping[key] = value
        table.append(Change(f"{path}.{key}" if path else key, old, value, why, whole=True))

    setkey(tier, "", "provider", {"type": "external", "module": PROVIDER_MODULE, "cloud_url": ctx.cloud_url},
           "instances are the namespace hosts, launched by the tier's NodeProvider (Ray's `local` provider drops "
           "available_node_types)")
    auth = tier["auth"]
    if "ssh_proxy_command" in auth:
        setkey(auth, "auth", "ssh_proxy_command", None, "no SSM here: the hosts' sshd is reached directly")
    setkey(auth, "auth", "ssh_private_key", str(ctx.key_path),
           "Ray's AWS provider makes a key pair; an external provider is given the throwaway key")
    docker = tier["docker"]
    setkey(docker, "docker", "pull_before_run", False, "no registry: the stand-in is imported into each daemon")
    setkey(docker, "docker", "image", ctx.image_tag, "the DLC stand-in (tests/ec2_tier/image.py)")
    why_env = ("the stand-in carries no Python: the project's environment is bind-mounted read-only at its own "
               "path, with the test provider's module")
    for path in (ctx.venv, ctx.python_base):
        docker["run_options"].append(f"-v {path}:{path}:ro")
        table.append(Change("docker.run_options", None, f"-v {path}:{path}:ro", why_env))
    docker["run_options"].append(f"-v {ctx.module_dir}:{MODULE_DIR}:ro")
    table.append(Change("docker.run_options", None, f"-v {ctx.module_dir}:{MODULE_DIR}:ro", why_env))
    if ctx.data_dir is not None:
        option = f"-v {ctx.data_dir}:{ctx.data_dir}:ro"
        docker["run_options"].append(option)
        table.append(Change("docker.run_options", None, option,
                            "the demo's data file the variable file names, on each host: `datasets` reads s3:// only "
                            "through s3fs, which the project's environment does not carry (as make cluster-real)"))
    for key, value in (ctx.s3_env or {}).items():
        option = f"--env {key}={value}"
        docker["run_options"].append(option)
        table.append(Change("docker.run_options", None, option,
                            "S3 is the tier's server on the bridge, with its keys; on EC2 the instance profile "
                            "gives the credentials (IMDS) and S3 is AWS's"))
    if "--ulimit memlock=-1" in docker["run_options"] and not memlock_unlimited_allowed():
        _replace_item(docker["run_options"], "--ulimit memlock=-1", None, "docker.run_options",
                      "this machine's hard memlock limit is finite and runc may not raise it (EPERM); on the DLAMI "
                      "root's is unlimited", table)
    _replace_item(docker["run_options"], "--env PYTHONPATH=/app", f"--env PYTHONPATH=/app:{MODULE_DIR}",
                  "docker.run_options", why_env, table)
    why_store = (f"object store {TIER_OBJECT_STORE_BYTES // 1024**2} MiB: this machine's memory, not the "
                 "instance's")
    for item in list(docker.get("head_run_options", [])):
        if re.fullmatch(r"--env RAY_EFA_OBJECT_STORE_BYTES=(\d+)", item):
            _replace_item(docker["head_run_options"], item,
                          f"--env RAY_EFA_OBJECT_STORE_BYTES={TIER_OBJECT_STORE_BYTES}", "docker.head_run_options",
                          why_store, table)
    for name, node_type in tier["available_node_types"].items():
        if name == tier["head_node_type"]:
            continue
        base = f"available_node_types.{name}"
        commands = node_type.get("initialization_commands", [])
        for command in list(commands):
            if command.startswith("sudo sysctl -w vm.nr_hugepages="):
                _replace_item(commands, command, "cat /proc/sys/vm/nr_hugepages", f"{base}.initialization_commands",
                              "huge pages are a kernel-wide setting: the shared kernel's is read, not set", table)
        options = node_type.get("docker", {}).get("worker_run_options", [])
        for item in list(options):
            path = f"{base}.docker.worker_run_options"
            if item.startswith("--device=/dev/infiniband/"):
                _replace_item(options, item, None, path, "no EFA device on this machine", table)
            elif item == "--gpus all":
                _replace_item(options, item, None, path, "no GPU (and no NVIDIA toolkit) on this machine", table)
            elif re.fullmatch(r"--env RAY_EFA_OBJECT_STORE_BYTES=(\d+)", item):
                _replace_item(options, item, f"--env RAY_EFA_OBJECT_STORE_BYTES={TIER_OBJECT_STORE_BYTES}", path,
                              why_store, table)
        resources = node_type["resources"]
        if resources.get("CPU", 0) > TIER_WORKER_CPUS:
            setkey(resources, f"{base}.resources", "CPU", TIER_WORKER_CPUS,
                   "Ray starts a worker process per CPU: two cores, not the instance's vCPUs (GPU is kept, so "
                   "GPU demand still starts the worker)")
    return tier, table


def memlock_unlimited_allowed() -> bool:
    import resource

    return resource.getrlimit(resource.RLIMIT_MEMLOCK)[1] == resource.RLIM_INFINITY


def table_text(table: list[Change]) -> str:
    rows = [f"  {c.path}: {'-' if c.old is None else repr(c.old)} -> {'-' if c.new is None else repr(c.new)}"
            f"\n      because {c.why}" for c in table]
    return "the ray up tier's substitutions (everything else is the rendered YAML):\n" + "\n".join(rows)


def undeclared(rendered: dict, tier: dict, table: list[Change]) -> list[Change]:
    """Every difference between `rendered` and `tier` the table does not declare."""
    declared = {c.key() for c in table if not c.whole}
    whole = [c.path for c in table if c.whole]
    return [c for c in differences(rendered, tier)
            if c.key() not in declared and not any(c.path == w or c.path.startswith(w + ".") for w in whole)]
