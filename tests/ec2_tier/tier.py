"""The tier, assembled: the stand-in image, moto (Secrets Manager, S3) reachable on the bridge, the namespace
hosts, the cloud, and the YAML: `python -m ops.launcher render` for the default file (stack outputs naming the
tier's secret and bucket), then the declared substitutions (substitutions.py). `ray()` runs Ray's own CLI.

    with Tier(tmp_dir) as tier:
        tier.ray("up", "-y", tier.yaml)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from tests.ec2_tier import image as image_mod
from tests.ec2_tier import substitutions
from tests.ec2_tier.cloud import Cloud
from tests.ec2_tier.hosts import GATEWAY, Lab

REPO = image_mod.REPO
MODULE_DIR = Path(__file__).resolve().parent
FIXTURE_OUTPUTS = REPO / "config" / "examples" / "ec2" / "outputs.json"
FINETUNE_FILE = REPO / "tests" / "fixtures" / "ec2-finetune.yaml"
ASSETS_DIR = Path("/var/tmp/ec2-tier-assets")
"""The demo's tiny model and data for the fine-tune (the file's job.dataset is ASSETS_DIR/data/train.jsonl): not
under /tmp, which each host replaces with its own."""
REGION = "us-east-2"  # config/cluster.yaml's region (the rendered commands name it)
RAY_TIMEOUT_S = 600


class Forwarder:
    """TCP from GATEWAY:<port> to 127.0.0.1:<target>: moto listens on loopback only, the hosts reach the bridge."""

    def __init__(self, target_port: int):
        self.target = target_port
        self.sock = socket.create_server((GATEWAY, 0))
        self.port = self.sock.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=10)
            except OSError:
                client.close()
                continue
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket):
        with contextlib.suppress(OSError):
            while data := a.recv(65536):
                b.sendall(data)
        with contextlib.suppress(OSError):
            b.shutdown(socket.SHUT_WR)

    def close(self):
        self.closed = True
        self.sock.close()


_AWS_SHIM = '''#!{python}
"""`aws` on the tier's hosts: the two calls the rendered commands make, through boto3 against the tier's moto
(the DLAMI's AWS CLI v2 with the instance profile's credentials makes the same API calls)."""
import argparse, sys
import boto3
parser = argparse.ArgumentParser(prog="aws")
parser.add_argument("service"); parser.add_argument("operation")
parser.add_argument("--region"); parser.add_argument("--secret-id"); parser.add_argument("--query")
parser.add_argument("--output")
args, _ = parser.parse_known_args()
if (args.service, args.operation) != ("secretsmanager", "get-secret-value"):
    sys.exit(f"aws shim: {{args.service}} {{args.operation}} is not served on the tier's hosts")
client = boto3.client("secretsmanager", region_name=args.region, endpoint_url="{endpoint}",
                      aws_access_key_id="{key}", aws_secret_access_key="{secret}")
try:
    value = client.get_secret_value(SecretId=args.secret_id)["SecretString"]
except Exception as exc:
    sys.exit(f"An error occurred: {{exc}}")
print(value)
'''


@dataclasses.dataclass(frozen=True)
class FineTuneYaml:
    config: object
    path: Path
    rendered: dict
    data: dict
    table: list
    model_dir: Path


class Tier:
    def __init__(self, work: Path, *, log=print):
        self.work = Path(work)
        self.log = log
        self.stack = contextlib.ExitStack()
        self.timings: dict[str, float] = {}

    def __enter__(self) -> Tier:
        try:
            self._start()
        except BaseException:
            self.stack.close()
            raise
        return self

    def __exit__(self, *exc):
        self.stack.close()

    def _timed(self, name: str, start: float) -> None:
        self.timings[name] = time.monotonic() - start

    def _start(self) -> None:
        from harness.loopback import MotoServer

        t = time.monotonic()
        self.image = image_mod.build(log=self.log)
        if self.image.build_seconds:
            self.log(f"the DLC stand-in rootfs {self.image.tag} built in {self.image.build_seconds:.1f} s")
        self._timed("image", t)
        t = time.monotonic()
        self.moto = self.stack.enter_context(MotoServer())
        # The lab's bridge address exists only once the lab's network is up: made in two steps.
        self.lab = Lab(self.image)
        self.stack.callback(self.lab.close)
        self.shim_dir = self.lab.root / "shim"
        self.shim_dir.mkdir(parents=True, exist_ok=True)
        self.token = secrets.token_hex(16)
        sm = _client(self.moto, "secretsmanager")
        self.secret_arn = sm.create_secret(Name=f"ray-efa-auth-{os.getpid()}", SecretString=self.token)["ARN"]
        self.bucket = f"ray-efa-tier-{os.getpid()}"
        _client(self.moto, "s3").create_bucket(Bucket=self.bucket,
                                               CreateBucketConfiguration={"LocationConstraint": REGION})
        self.lab.start(shim_dir=self.shim_dir, before_hosts=self._bridge_up)
        self._timed("hosts", t)
        t = time.monotonic()
        self.rendered, self.yaml_data, self.table = self._render()
        self.yaml = self.work / "tier-cluster.yaml"
        self.yaml.write_text(yaml.safe_dump(self.yaml_data, sort_keys=False, width=120))
        self._timed("render", t)

    def _bridge_up(self) -> None:
        """Once the bridge has its address: the forwarder to moto, the cloud, the `aws` and `sudo` shims."""
        self.forwarder = Forwarder(int(self.moto.endpoint_url.rsplit(":", 1)[1]))
        self.stack.callback(self.forwarder.close)
        self.moto_bridge_url = f"http://{GATEWAY}:{self.forwarder.port}"
        self.cloud = Cloud(self.lab.hosts, GATEWAY)
        self.stack.callback(self.cloud.close)
        shim = self.shim_dir / "aws"
        shim.write_text(_AWS_SHIM.format(python=Path(sys.executable), endpoint=self.moto_bridge_url,
                                         key=self.moto.admin.access_key_id,
                                         secret=self.moto.admin.secret_access_key))
        shim.chmod(0o700)
        # The DLAMI's ec2-user has password-less sudo (the rendered commands write the root-only token file with it);
        # the tier's ec2-user is uid 0 and this machine has no sudo.
        sudo = self.shim_dir / "sudo"
        sudo.write_text("#!/bin/sh\n# sudo on the tier's hosts: ec2-user is root here (tests/ec2_tier/hosts.py)\n"
                        'exec "$@"\n')
        sudo.chmod(0o755)

    def outputs(self, bucket: str | None = None) -> dict:
        """The bundled example's stack outputs, naming the tier's secret and bucket."""
        bucket = bucket or self.bucket
        outputs = json.loads(FIXTURE_OUTPUTS.read_text())
        flat = {o["OutputKey"]: o for s in outputs.get("Stacks", []) for o in s.get("Outputs", [])}
        if flat:
            flat["AuthTokenSecretArn"]["OutputValue"] = self.secret_arn
            flat["BucketName"]["OutputValue"] = bucket
            return outputs
        for stack in outputs.values():
            if "AuthTokenSecretArn" in stack:
                stack["AuthTokenSecretArn"] = self.secret_arn
            if "BucketName" in stack:
                stack["BucketName"] = bucket
        return outputs

    def _render(self, config_file: Path = REPO / "config" / "cluster.yaml", *, bucket: str | None = None,
                name: str = "ec2", **extra) -> tuple[dict, dict, list]:
        """`python -m ops.launcher render` of `config_file`, then the declared substitutions (`extra`: the
        fine-tune's S3 and data, substitutions.Context)."""
        out_json = self.work / f"{name}-outputs.json"
        out_json.write_text(json.dumps(self.outputs(bucket)))
        out_dir = self.work / name
        subprocess.run([sys.executable, "-m", "ops.launcher", "render", str(config_file),
                        "--outputs", str(out_json), "--out-dir", str(out_dir)], cwd=REPO, check=True,
                       capture_output=True, text=True, timeout=300)
        rendered = yaml.safe_load((out_dir / "cluster.yaml").read_text())
        venv, base = image_mod.python_env()
        ctx = substitutions.Context(cloud_url=self.cloud.url, key_path=self.lab.key, image_tag=self.image.tag,
                                    venv=venv, python_base=base, module_dir=MODULE_DIR, **extra)
        tier, table = substitutions.apply(rendered, ctx)
        return rendered, tier, table

    def render_finetune(self) -> FineTuneYaml:
        """The fine-tune file (FINETUNE_FILE) rendered and substituted, its bucket made on moto with the demo's tiny
        model in it (where the file's job.model names it), its data under ASSETS_DIR."""
        from config import load_config
        from workloads.fsdp_finetune.local_assets import prepare_local_assets

        config = load_config(FINETUNE_FILE)
        bucket = config.storage.bucket_name
        s3 = self.s3()
        s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
        assets = prepare_local_assets(ASSETS_DIR)
        if Path(config.job.dataset) != Path(assets.dataset_path):
            raise AssertionError(f"{FINETUNE_FILE}: job.dataset must be {assets.dataset_path}")
        model_prefix = config.job.model.removeprefix(f"s3://{bucket}/")
        for path in sorted(Path(assets.model_dir).rglob("*")):
            if path.is_file():
                s3.upload_file(str(path), bucket, f"{model_prefix}/{path.relative_to(assets.model_dir)}")
        s3_env = {"AWS_ENDPOINT_URL_S3": self.moto_bridge_url, "AWS_ACCESS_KEY_ID": self.moto.admin.access_key_id,
                  "AWS_SECRET_ACCESS_KEY": self.moto.admin.secret_access_key}
        rendered, data, table = self._render(FINETUNE_FILE, bucket=bucket, name="ec2-finetune", s3_env=s3_env,
                                             data_dir=ASSETS_DIR)
        path = self.work / "finetune-cluster.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False, width=120))
        return FineTuneYaml(config, path, rendered, data, table, Path(assets.model_dir))

    def s3(self):
        return _client(self.moto, "s3")

    # ---- Ray's CLI -----------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "AWS_"))}
        env.update({"PYTHONPATH": str(MODULE_DIR), "RAY_USAGE_STATS_ENABLED": "0", "HOME": str(self.work / "home")})
        (self.work / "home").mkdir(exist_ok=True)
        return env

    def ray(self, *args: str, check: bool = True, timeout: float = RAY_TIMEOUT_S) -> subprocess.CompletedProcess:
        ray_bin = Path(sys.executable).parent / "ray"
        argv = [str(ray_bin), *args]
        proc = subprocess.run(argv, cwd=self.work, env=self.env(), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-6000:]}\n"
                                 f"{proc.stderr[-6000:]}")
        return proc


def _client(moto, service: str):
    import boto3

    return boto3.client(service, region_name=REGION, endpoint_url=moto.endpoint_url,
                        aws_access_key_id=moto.admin.access_key_id,
                        aws_secret_access_key=moto.admin.secret_access_key)
