"""The Hugging Face token on the job's side, offline: moto's Secrets Manager (IAM auth enforced) behind a
Pod-Identity-style credential endpoint (harness/loopback.py), and a Hub stand-in on 127.0.0.1 reached
through HF_ENDPOINT (tests/hub_server.py).

* `install_token` gets the token through the endpoint into this process's HF_TOKEN, and its errors
  name the field and the secret, never the value;
* the preflight (`python -m workloads.preflight`) stops, naming job.hf_token_secret, when the Hub
  refuses: no token, or a bad one; `python -m workloads.plan --online` says the same, and with the
  good token plans from the Hub's config.json;
* a tiny Ray Train run whose model comes from the gated Hub with the token: the workers fetched
  it themselves, and its value is nowhere in the logs, the Ray session folder, the run's S3
  folder (metrics.jsonl, TensorBoard events, checkpoints, model), MLflow's params and files, the
  Hugging Face cache, the job's runtime env, dist/ (charts synth) or cdk.out/ (in-process synth),
  even with HF_TOKEN set in the synthesizing process's environment.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness.loopback import PodIdentityEndpoint, only_policy, s3_policy
from tests.helpers import REPO, cdk_app, write_variant
from tests.hub_server import FakeHub

pytestmark = pytest.mark.slow  # moto, the fake Hub, child processes and a Ray run: `make check` leaves it out

BUCKET = "hf-token-run"
REPO_ID = "acme-gated/tiny-chat"
CHILD_TIMEOUT_S = 60  # the preflight must stop a job within a minute; its child is bounded by that
RUN_TIMEOUT_S = 300  # the plan's memory simulation and the Ray run: a bound for a loaded machine


def _token() -> str:
    return "hf_" + secrets.token_hex(17)


@pytest.fixture(scope="module")
def token():
    return _token()


@pytest.fixture(scope="module")
def secret(moto_server, token):
    """A secret holding the token, and the pod role that may read secrets (moto authorizes Secrets
    Manager calls against the resource "*": moto 5.2.5 core/responses.py call_action, no
    _determine_resource for secretsmanager; the exact-resource grant is tested on the template)."""
    sm = moto_server.client("secretsmanager")
    arn = sm.create_secret(Name="jobs/hf-token", SecretString=token)["ARN"]
    moto_server.create_bucket(BUCKET)
    policy = only_policy(["secretsmanager:GetSecretValue"], "*")
    policy["Statement"] += s3_policy(BUCKET)["Statement"]
    # moto 5.2.5 authorizes HEAD on a bucket as "s3:HeadBucket" (moto/s3/responses.py), where AWS checks
    # s3:ListBucket; pyarrow's create_dir (Ray Train's StorageContext) sends it. No real IAM action.
    policy["Statement"].append(only_policy(["s3:HeadBucket"], f"arn:aws:s3:::{BUCKET}")["Statement"][0])
    role = moto_server.create_role("hf-token-pod", policy)
    return {"name": "jobs/hf-token", "arn": arn, "role": role}


@pytest.fixture(scope="module")
def endpoint(moto_server, secret):
    with PodIdentityEndpoint(lambda: moto_server.assume_role(secret["role"]), moto_server.account_id) as ep:
        yield ep


@pytest.fixture
def pod_env(endpoint, moto_server, monkeypatch, tmp_path):
    """This process as a pod: only the endpoint's credentials, no token, an empty Hugging Face cache."""
    from workloads import hf_token

    saved = dict(os.environ)
    env = endpoint.exclusive_env(moto_server.endpoint_url, base=saved)
    for key in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_ENDPOINT"):
        env.pop(key, None)
    env["HF_HOME"] = str(tmp_path / "hf-home")
    for key in list(os.environ):
        if key not in env:
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(hf_token, "_installed", set())
    return env


def test_install_token_reads_the_secret_through_pod_identity(pod_env, endpoint, token, secret):
    from workloads.hf_token import current_token, install_token, secret_arn

    before = endpoint.authorized_calls
    assert install_token("jobs/hf-token") is True
    assert os.environ["HF_TOKEN"] == token == current_token()
    assert endpoint.authorized_calls > before and set(endpoint.calls) == {endpoint.token}
    assert secret_arn("jobs/hf-token") == secret["arn"]  # what the driver hands the workers


def test_a_json_secret_gives_its_hf_token_key(pod_env, moto_server):
    from workloads.hf_token import fetch_token

    moto_server.client("secretsmanager").create_secret(Name="jobs/hf-json", SecretString='{"HF_TOKEN": "hf_json"}')
    assert fetch_token("jobs/hf-json") == "hf_json"


def test_no_secret_installs_nothing(pod_env):
    from workloads.hf_token import install_token

    assert install_token(None) is False and "HF_TOKEN" not in os.environ


def test_a_missing_secret_names_the_field_and_how_to_fix_it(pod_env):
    from workloads.hf_token import TokenError, install_token

    with pytest.raises(TokenError) as err:
        install_token("jobs/no-such-secret")
    assert str(err.value).startswith("job.hf_token_secret: cannot read secret 'jobs/no-such-secret': "
                                     "ResourceNotFoundException; no such secret")
    assert "HF_TOKEN" not in os.environ


def test_a_role_without_the_grant_is_refused_without_the_value(moto_server, token, monkeypatch, tmp_path):
    from workloads.hf_token import TokenError, fetch_token

    role = moto_server.create_role("hf-token-nogrant", s3_policy(BUCKET))
    with PodIdentityEndpoint(moto_server.assume_role(role), moto_server.account_id) as ep:
        for key, value in ep.exclusive_env(moto_server.endpoint_url).items():
            monkeypatch.setenv(key, value)
        with pytest.raises(TokenError) as err:
            fetch_token("jobs/hf-token")
    assert "job.hf_token_secret: cannot read secret 'jobs/hf-token': AccessDenied" in str(err.value)
    assert "the pods' role may not read it" in str(err.value) and token not in str(err.value)


def test_scrub_hides_an_installed_token(pod_env, token):
    from workloads.hf_token import install_token, scrub

    install_token("jobs/hf-token")
    assert scrub(f"GET /x?t={token} failed") == "GET /x?t=*** failed"


# ---- the preflight and the plan against a refusing Hub ----------------------------------------------

def _child(args: list[str], env: dict, timeout_s: float = CHILD_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout_s)


def _repo_requests(hub: FakeHub) -> list[tuple[str, str, bool]]:
    """The requests for the repository (huggingface_hub 1.33 also fetches {ENDPOINT}/api/agent-harnesses,
    without a token: utils/_detect_agent.py)."""
    return [r for r in hub.requests if REPO_ID in r[1]]


def _gated_file(tmp_path: Path, **job) -> Path:
    dataset = tmp_path / "train.jsonl"
    dataset.write_text('{"instruction": "1+1", "output": "2"}\n')
    return write_variant(tmp_path, {"job": {"model": REPO_ID, "dataset": str(dataset), **job}})


def test_preflight_stops_without_a_token_when_the_hub_refuses(pod_env, tmp_path):
    with FakeHub(repo=REPO_ID, token=None) as hub:
        file = _gated_file(tmp_path)
        done = _child(["-m", "workloads.preflight", str(file)], {**pod_env, "HF_ENDPOINT": hub.url})
    assert done.returncode == 2, done.stderr
    assert (f"{file}: job.hf_token_secret: '{REPO_ID}' is refused without a token (HTTP 401" in done.stderr)
    assert "set job.hf_token_secret to its name or ARN" in done.stderr
    assert _repo_requests(hub) == [("GET", f"/api/models/{REPO_ID}/auth-check", False)]  # one request


def test_preflight_stops_on_a_token_the_hub_refuses(pod_env, moto_server, tmp_path):
    bad = _token()
    # By ARN: the file's region (us-east-2) is not moto's, and a name is looked up in the file's region.
    arn = moto_server.client("secretsmanager").create_secret(Name="jobs/hf-bad", SecretString=bad)["ARN"]
    with FakeHub(repo=REPO_ID, token=_token()) as hub:
        file = _gated_file(tmp_path, hf_token_secret=arn)
        done = _child(["-m", "workloads.preflight", str(file)], {**pod_env, "HF_ENDPOINT": hub.url})
    assert done.returncode == 2, done.stderr
    assert f"{file}: job.hf_token_secret: job.model '{REPO_ID}': the Hub refuses the token in " \
           "job.hf_token_secret (HTTP 401)" in done.stderr
    assert bad not in done.stdout + done.stderr
    assert _repo_requests(hub) == [("GET", f"/api/models/{REPO_ID}/auth-check", False)]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from workloads.fsdp_finetune.local_assets import prepare_local_assets

    return prepare_local_assets(tmp_path_factory.mktemp("hf-assets"))


def test_plan_online_names_the_field_when_the_hub_refuses(pod_env, tmp_path):
    with FakeHub(repo=REPO_ID, token=None) as hub:
        done = _child(["-m", "workloads.plan", str(_gated_file(tmp_path)), "--online"],
                      {**pod_env, "HF_ENDPOINT": hub.url}, timeout_s=RUN_TIMEOUT_S)
    assert done.returncode == 2 and "job.hf_token_secret: " in done.stderr and "HTTP 401" in done.stderr


def test_plan_online_reads_the_config_from_the_hub_with_the_jobs_token(pod_env, tmp_path, token, assets, secret):
    with FakeHub(repo=REPO_ID, token=token, files=Path(assets.model_dir)) as hub:
        done = _child(["-m", "workloads.plan", str(_gated_file(tmp_path, hf_token_secret=secret["arn"])),
                       "--online", "--json"], {**pod_env, "HF_ENDPOINT": hub.url}, timeout_s=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["architecture_source"] == "the Hub's config.json (with the job token)"
    assert _repo_requests(hub) and all(ok for _, _, ok in _repo_requests(hub))
    assert token not in done.stdout + done.stderr


# ---- a tiny Ray Train run: the workers get the token, and it leaks nowhere ------------------------

def _files_holding(root: Path, needle: bytes) -> list[str]:
    found = []
    for path in Path(root).rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                if needle in path.read_bytes():
                    found.append(str(path))
            except OSError:
                pass
    return found


@pytest.fixture(scope="module")
def gated_run(moto_server, endpoint, secret, token, assets, tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-run")
    ray_dir = tempfile.mkdtemp(prefix="hft", dir="/tmp")  # short: Ray's socket paths must stay < 108 bytes
    env = endpoint.exclusive_env(moto_server.endpoint_url)
    for key in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        env.pop(key, None)
    mlruns = root / "mlruns"
    env.update(HF_HOME=str(root / "hf-home"), RAY_USAGE_STATS_ENABLED="0", MLFLOW_ALLOW_FILE_STORE="true",
               TOKENIZERS_PARALLELISM="false")
    job = dict(model=REPO_ID, hf_token_secret=secret["name"], run_name="gated", max_steps=4, seq_len=64,
               micro_batch_size=4, global_batch_size=16, warmup_steps=1, checkpoint_every=2, report_every=2,
               eval_every=2, mlflow_tracking_uri=mlruns.as_uri())
    spec = root / "spec.json"
    spec.write_text(json.dumps({"ray_dir": ray_dir, "out": str(root / "out"),
                                "assets": str(Path(assets.model_dir).parent),
                                "storage": f"s3://{BUCKET}/checkpoints", "job": job}))
    try:
        with FakeHub(repo=REPO_ID, token=token, files=Path(assets.model_dir)) as hub:
            env["HF_ENDPOINT"] = hub.url
            done = _child(["-m", "tests.hf_token_run", str(spec)], env, timeout_s=RUN_TIMEOUT_S)
        yield {"done": done, "hub": hub, "root": root, "ray_dir": Path(ray_dir), "mlruns": mlruns, "env": env}
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)


def test_workers_download_the_gated_model_with_the_token(gated_run):
    done = gated_run["done"]
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["error"] is None and result["driver_has_token"] is True
    assert result["checkpoint"].endswith("checkpoints/gated/checkpoint_step_0000004")
    requests = _repo_requests(gated_run["hub"])
    downloads = {path for method, path, _ in requests if method == "GET" and "/resolve/" in path}
    assert any(p.endswith("/model.safetensors") for p in downloads)
    assert all(ok for _, _, ok in requests), [r for r in requests if not r[2]]


def test_the_token_is_in_no_log_and_no_ray_session_file(gated_run, token):
    done = gated_run["done"]
    assert token not in done.stdout and token not in done.stderr
    sessions = list(gated_run["ray_dir"].glob("session_*"))
    assert sessions and any(gated_run["ray_dir"].rglob("*.log")) or any(gated_run["ray_dir"].rglob("*.out"))
    assert _files_holding(gated_run["ray_dir"], token.encode()) == []


def test_the_token_is_not_in_the_runs_s3_folder(gated_run, moto_server, token):
    s3 = moto_server.client("s3")
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="checkpoints/")
            for o in page.get("Contents", [])]
    assert "checkpoints/gated/metrics.jsonl" in keys
    assert any(k.split("/")[-1].startswith("events.out.tfevents") for k in keys)
    holding = [k for k in keys if token.encode() in s3.get_object(Bucket=BUCKET, Key=k)["Body"].read()]
    assert holding == []


def test_the_token_is_not_in_mlflow_nor_the_hugging_face_cache(gated_run, token, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the run's store (tests/test_tracking.py says why)

    client = MlflowClient(tracking_uri=gated_run["mlruns"].as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("fsdp-finetune").experiment_id])
    # The secret's ARN, as the driver resolved the name for the workers; not its value.
    assert run.data.params["hf_token_secret"].endswith(":secret:jobs/hf-token-" + run.data.params[
        "hf_token_secret"][-6:]) and run.data.params["hf_token_secret"].startswith("arn:aws:secretsmanager:")
    assert not any(token in v for v in run.data.params.values())
    assert _files_holding(gated_run["mlruns"], token.encode()) == []
    hf_home = gated_run["root"] / "hf-home"
    assert any(hf_home.rglob("model.safetensors"))  # the download went through this cache
    assert _files_holding(hf_home, token.encode()) == []


def test_the_token_is_not_in_dist_cdk_out_or_the_runtime_env(tmp_path, token, monkeypatch):
    """Even with HF_TOKEN in the synthesizing process's environment (a user who exported it)."""

    from charts.__main__ import synthesize
    from charts.ray import runtime_env_json
    from config import load_config
    from stacks import build

    monkeypatch.setenv("HF_TOKEN", token)
    file = write_variant(tmp_path, {"job": {"model": "meta-llama/Llama-3.2-1B", "hf_token_secret": "jobs/hf-token"}})
    config = load_config(file)
    written = synthesize(config, file, tmp_path / "dist")
    assert written and _files_holding(tmp_path / "dist", token.encode()) == []
    assert "jobs/hf-token" in (tmp_path / "dist").joinpath(written[0].name).read_text() or any(
        "jobs/hf-token" in p.read_text() for p in written)
    app = cdk_app(outdir=str(tmp_path / "cdk.out"))
    build(app, config)
    app.synth()
    assert any((tmp_path / "cdk.out").glob("*.template.json"))
    assert _files_holding(tmp_path / "cdk.out", token.encode()) == []
    runtime_env = runtime_env_json(config)
    assert token not in runtime_env and "HF_TOKEN" not in runtime_env
