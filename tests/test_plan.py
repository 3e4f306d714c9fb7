"""`python -m workloads.plan`: the FSDP2 memory tracker and FLOP counter on fake tensors, through the CLI.

Each plan of a real architecture runs one fake training step per measured size (tens of seconds
of CPU for Qwen2.5-1.5B), so every plan here is made once per module and asserted on several ways.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO, load_variant, write_variant
from workloads.fsdp_finetune.metrics import flops_per_token
from workloads.plan.architectures import KNOWN, ArchitectureError, resolve_architecture, table_key

pytestmark = pytest.mark.slow  # `make check` leaves this module out (pyproject.toml markers)

BYTES_PER_PARAM = 16  # fp32 weights, fp32 gradients, AdamW's two fp32 moments


def run_plan(file, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workloads.plan", str(file), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def plan_json(file) -> dict:
    result = run_plan(file, "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def default_plan():
    """The default variable file: Qwen2.5-1.5B on 2 x g6.12xlarge (hybrid sharding under `auto`)."""
    return plan_json(REPO / "config" / "cluster.yaml")


def test_architecture_table_matches_the_published_parameter_counts():
    # Published sizes: Qwen2.5 0.49B / 1.54B / 3.09B / 7.62B, Llama 3.2 1.24B / 3.21B.
    # Qwen2.5-14B / 32B: their model cards say 14.7B and 32.5B; counted from the published config.json fields they
    # are 14.77B and 32.76B (the 32B card's figure is rounded low: its own 31.0B non-embedding plus two
    # 152,064 x 5,120 embeddings is 32.6B), so those two are held to the count, within the same 0.5 %.
    published = {"qwen2.5-0.5b": 0.494e9, "qwen2.5-1.5b": 1.544e9, "qwen2.5-3b": 3.086e9, "qwen2.5-7b": 7.616e9,
                 "qwen2.5-14b": 14.770e9, "qwen2.5-32b": 32.764e9,
                 "llama-3.2-1b": 1.236e9, "llama-3.2-3b": 3.213e9}
    import torch
    from transformers import AutoModelForCausalLM

    assert set(published) == set(KNOWN)
    for key, expected in published.items():
        arch, source = resolve_architecture(f"org/{key.upper()}-Instruct")
        assert source.startswith("table")
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(arch)
        assert sum(p.numel() for p in model.parameters()) == pytest.approx(expected, rel=0.005), key
    assert table_key("s3://bucket/models/Qwen2.5-7B/") == "qwen2.5-7b"
    with pytest.raises(ArchitectureError, match="point job.model at a local directory holding it"):
        resolve_architecture("someone/unknown-model-13b")


def test_state_is_16_bytes_per_parameter_over_the_shard_group(default_plan):
    """Hybrid (the default file): the plan's figure over shard groups of 4. Full sharding over 8:
    the same accounting (`FakeJob.state_bytes`) after AdamW's state exists, without the plan's steps."""
    assert default_plan["sharding"] == "hybrid" and default_plan["shard_group_size"] == 4
    assert default_plan["state_gib_per_gpu"] * 2**30 == pytest.approx(
        BYTES_PER_PARAM * default_plan["params"] / 4, rel=0.02)

    import torch

    from workloads.fsdp_finetune.topology import plan_from
    from workloads.plan.simulate import FakeJob, release_fake_process_group

    arch, _ = resolve_architecture("Qwen/Qwen2.5-1.5B")
    try:
        with FakeJob(arch, mesh_plan=plan_from("full", world_size=8, ranks_per_node=4),
                     activation_checkpointing=True) as fake:
            for p in fake.model.parameters():  # what the first step leaves behind: gradients, then AdamW state
                p.grad = torch.zeros_like(p)
            fake.optimizer.step()
            state = fake.state_bytes()
    finally:
        release_fake_process_group()
    assert sum(state.values()) == pytest.approx(BYTES_PER_PARAM * default_plan["params"] / 8, rel=0.02)


def test_default_file_fits_on_g6_12xlarge(default_plan):
    p = default_plan
    assert p["gpu"] == "L4" and p["fits"] is True
    assert p["peak_gib_per_gpu"] <= p["limit_gib"] == pytest.approx(p["gpu_memory_gib"] - p["reserve_gib"])
    assert p["peak_gib_per_gpu"] == pytest.approx(sum(p["peak_by_category_gib"].values()), abs=0.01)
    for key in ("params", "world_size", "sharding", "peak_gib_per_gpu", "state_gib_per_gpu", "gpu_memory_gib",
                "fits", "flops_per_step", "step_time_s", "tokens_per_s", "run_hours", "run_cost_usd"):
        assert key in p
    # The whole run follows from the step time and the catalog.
    assert p["tokens_per_s"] == pytest.approx(64 * 2048 / p["step_time_s"], rel=1e-3)
    assert p["run_hours"] == pytest.approx(500 * p["step_time_s"] / 3600, rel=1e-3)
    assert p["run_cost_usd"] == pytest.approx(p["run_hours"] * p["cost_per_hour_usd"], abs=0.01)
    assert p["step_time_s"] == pytest.approx(p["compute_s"] + p["network_s"], abs=1e-3)


def test_flop_counter_agrees_with_the_metrics_formula(default_plan):
    """PaLM's convention (metrics.py): 6N + 12LdT per token, backward = 2 x forward, no recomputation.
    The counter's 3 x forward differs only by the bias adds and norms, which N counts and a matmul
    counter does not (~0.01 % here)."""
    p = default_plan
    arch, _ = resolve_architecture(p["model"])
    formula = flops_per_token(arch, p["seq_len"]) * 64 * p["seq_len"]
    assert p["model_flops_per_step_formula"] == pytest.approx(formula)
    assert p["model_flops_per_step_counted"] == pytest.approx(formula, rel=0.002)
    # What the GPU executes is more: activation checkpointing recomputes each layer's forward and
    # the chunked loss its LM head (about 8N + 16LdT of 6N + 12LdT, less for the head).
    assert 1.2 < p["flops_per_step"] / p["model_flops_per_step_counted"] < 1.4


def _llama_1b_cut_to(directory, layers: int):
    """A model directory holding Llama 3.2 1B's published config.json with only `layers` decoder layers."""
    from transformers import AutoConfig

    fields = dict(KNOWN["llama-3.2-1b"])
    AutoConfig.for_model(fields.pop("model_type"), **{**fields, "num_hidden_layers": layers}).save_pretrained(directory)
    return directory


def test_oversized_job_is_refused_naming_the_field(tmp_path):
    """Llama 3.2 1B's widths cut to 4 of its 16 layers (the fake step's time is per layer; 4 still overflow),
    8 x 4096 tokens per micro-batch, no activation checkpointing, on the default 8 L4."""
    model = _llama_1b_cut_to(tmp_path / "llama-4-layers", 4)
    file = write_variant(tmp_path, {"job": {"model": str(model), "seq_len": 4096, "micro_batch_size": 8,
                                            "global_batch_size": 64, "activation_checkpointing": False}})
    result = run_plan(file)
    assert result.returncode == 2, result.stdout + result.stderr[-2000:]
    (line,) = [line for line in result.stderr.splitlines() if line.startswith(f"{file}: job.")]
    assert line.startswith(f"{file}: job.micro_batch_size: predicted peak ")
    assert "GiB limit" in line and "activation_checkpointing: true" in line
    best = int(line.split("the largest micro-batch that fits at seq_len 4096 is ")[1].split(":")[0])
    assert 1 <= best < 8
    assert "DOES NOT FIT" in result.stdout  # the table is still printed, to show where the memory goes
    # The suggestions are planned the same way: the micro-batch named in the refusal fits when planned as
    # the file it suggests (global batch rounded up to a multiple, so with the accumulation it will run).
    (smaller,) = [s for s in result.stdout.splitlines() if s.strip().startswith(f"job.micro_batch_size: {best};")]
    assert ", fits;" in smaller, smaller


def test_tiny_local_model_plan(tmp_path, capsys):
    """The architecture comes from the model directory's config.json; a few seconds of CPU, so `main` (what
    `python -m workloads.plan` exits with) runs in this process rather than after an interpreter start."""
    from workloads.fsdp_finetune.local_assets import prepare_local_assets
    from workloads.plan.__main__ import main
    from workloads.plan.simulate import release_fake_process_group

    assets = prepare_local_assets(tmp_path / "assets")
    file = write_variant(tmp_path, {"job": {"model": str(assets.model_dir), "seq_len": 128,
                                            "micro_batch_size": 8, "global_batch_size": 64}})
    try:
        assert main([str(file), "--json"]) == 0
    finally:
        release_fake_process_group()  # a later test in this process may start a real process group
    p = json.loads(capsys.readouterr().out)
    assert p["architecture_source"] == f"{assets.model_dir}/config.json"
    assert p["fits"] and 0 < p["peak_gib_per_gpu"] < 1
    assert p["state_bytes_per_gpu"] == pytest.approx(BYTES_PER_PARAM * p["params"] / 4, rel=0.02)


def test_unknown_architecture_is_refused_unless_skipped(tmp_path, capsys):
    """In this process (`main` is what `python -m workloads.plan` exits with): the refusal comes before any
    simulation, so an interpreter start would be most of the test's time."""
    from config.errors import run_cli
    from workloads.plan.__main__ import main

    file = write_variant(tmp_path, {"job": {"model": "someone/unknown-model-13b"}})
    with pytest.raises(SystemExit) as exited:
        run_cli(main, [str(file)])
    assert exited.value.code == 2
    assert f"{file}: job.model: no architecture known" in capsys.readouterr().err
    assert main([str(file), "--skip-unknown"]) == 0
    assert f"{file}: job.model: no architecture known" in capsys.readouterr().err


def _refused_plan(config) -> dict:
    """The fields of a refused plan that `suggest.candidates` reads (no simulation needed to choose candidates)."""
    from workloads.fsdp_finetune.topology import mesh_plan

    return {"sharding": mesh_plan(config).sharding, "largest_micro_batch": 2, "largest_seq_len": 0}


def test_suggestions_come_in_order_and_each_is_a_valid_file(tmp_path):
    from workloads.plan.suggest import candidates

    config = load_variant(tmp_path, {"job": {"model": "Qwen/Qwen2.5-7B"}})
    # The 7B's full fine-tune state over shard groups of 4: 28 GiB a GPU, more than half the L4's limit.
    found = list(candidates(config, {**_refused_plan(config), "state_gib_per_gpu": 28.4, "limit_gib": 20.5}))
    changes = [change for change, _, _ in found]
    assert changes[0] == "job.sharding: full"
    assert changes[1].startswith("nodes (gpu: 4), job.sharding: full")
    # LoRA on the same hardware, with the file's sharding (hybrid), then fully sharded.
    assert changes[2:4] == ["job.method: lora (job.lora.rank: 16)",
                            "job.method: lora (job.lora.rank: 16), job.sharding: full"]
    assert [c.job.method for _, c, _ in found[2:4]] == ["lora", "lora"]
    bigger = found[4][1].instance(found[4][1].cluster.worker_groups[0])
    assert changes[4].startswith(f"instance_type: {bigger.name} ")
    assert bigger.gpu_visible_memory_mib > config.instance(config.cluster.worker_groups[0]).gpu_visible_memory_mib
    assert bigger.efa_interfaces > 0  # the file's transport is efa
    assert changes[5].startswith("job.micro_batch_size: 2")
    # FLOPs recounted for LoRA (no weight gradients for the frozen base) and for a new batch.
    assert [same for _, _, same in found] == [True, True, False, False, True, False]
    for _, changed, _ in found:
        assert changed.cross_field_problems() == []
    assert found[1][1].world_size == 2 * config.world_size


def test_lora_is_not_suggested_to_a_lora_job_nor_where_activations_overflow(tmp_path):
    from workloads.plan.suggest import candidates

    config = load_variant(tmp_path, {"job": {"method": "lora"}})
    plan = {**_refused_plan(config), "method": "lora", "state_gib_per_gpu": 28.4, "limit_gib": 20.5}
    assert not any("job.method" in change for change, _, _ in candidates(config, plan))
    config = load_variant(tmp_path, {"job": {"method": "full"}})
    plan = {**_refused_plan(config), "state_gib_per_gpu": 5.8, "limit_gib": 20.5}  # activations are the problem
    assert not any("job.method" in change for change, _, _ in candidates(config, plan))


def test_lora_state_on_a_tiny_model(tmp_path, capsys):
    """The LoRA plan of the tiny local model (its config.json), through the FSDP2 memory tracker on fake tensors:
    the state is the frozen bf16 base (2 bytes a parameter) plus, for each adapter parameter, fp32 weight,
    gradient and AdamW's two moments (16 bytes), over the shard group: gradients and optimizer state are the
    adapters' alone; the peak is below the full fine-tune's of the same job."""
    from workloads.fsdp_finetune.local_assets import prepare_local_assets
    from workloads.plan.__main__ import main
    from workloads.plan.simulate import release_fake_process_group

    assets = prepare_local_assets(tmp_path / "assets")
    job = {"model": str(assets.model_dir), "seq_len": 128, "micro_batch_size": 8, "global_batch_size": 64}
    plans = {}
    try:
        for method in ("full", "lora"):
            file = write_variant(tmp_path, {"job": {**job, "method": method}}, name=f"{method}.yaml")
            assert main([str(file), "--json"]) == 0
            plans[method] = json.loads(capsys.readouterr().out)
    finally:
        release_fake_process_group()
    full, lora = plans["full"], plans["lora"]
    base, trainable = full["params"], lora["trainable_params"]
    assert lora["method"] == "lora" and lora["params"] == base + trainable and 0 < trainable < base / 5
    shard = lora["shard_group_size"]
    assert lora["state_bytes_per_gpu"] == pytest.approx((2 * base + 16 * trainable) / shard, rel=0.02)
    assert lora["peak_gib_per_gpu"] < full["peak_gib_per_gpu"]
    assert lora["flops_per_step"] < full["flops_per_step"]  # no weight gradients for the frozen base


def test_full_sharding_is_not_suggested_when_already_full(tmp_path):
    from workloads.plan.suggest import candidates

    config = load_variant(tmp_path, {"job": {"sharding": "full"}})
    assert not any(change.startswith("job.sharding") for change, _, _ in candidates(config, _refused_plan(config)))


# ---- LoRA on the default nodes: Qwen2.5-32B (issue 37) ------------------------------------------------------
# Each of these plans simulates a 64-layer model (minutes of CPU), once per module.

LORA_EXAMPLE = REPO / "config" / "examples" / "lora.yaml"


def test_32b_full_fine_tune_is_refused_with_its_numbers_and_lora_offered(tmp_path):
    """Qwen2.5-32B fully fine-tuned on the default file's 8 L4: the persistent state alone (16 bytes a parameter
    over shard groups of 4) is over the limit, so the refusal comes without simulating a step (seconds), names
    job.method with the numbers, and LoRA on these nodes is among what is planned instead. That LoRA plan itself
    (fully sharded, micro-batch 2) is config/examples/lora.yaml's, planned in the next test."""
    from workloads.plan import PlanRefusal, make_plan
    from workloads.plan.simulate import release_fake_process_group
    from workloads.plan.suggest import candidates

    config = load_variant(tmp_path, {"job": {"model": "Qwen/Qwen2.5-32B"}})
    try:
        with pytest.raises(PlanRefusal) as info:
            make_plan(config)
    finally:
        release_fake_process_group()
    plan = info.value.plan
    assert info.value.field == "method" and plan["method"] == "full" and plan["state_exceeds_limit"] is True
    assert plan["params"] == pytest.approx(32.76e9, rel=0.001)
    assert plan["state_bytes_per_gpu"] == pytest.approx(BYTES_PER_PARAM * plan["params"] / 4, rel=0.01)
    assert plan["state_gib_per_gpu"] > 5 * plan["limit_gib"]
    assert info.value.message.startswith(f"predicted peak {plan['peak_gib_per_gpu']:.1f} GiB per GPU exceeds the "
                                         f"{plan['limit_gib']:.1f} GiB limit")
    assert f"the persistent state alone is {plan['state_gib_per_gpu']:.1f} GiB per GPU" in info.value.message
    assert "train LoRA adapters (job.method: lora)" in info.value.message
    changes = [change for change, _, _ in candidates(config, plan)]
    assert "job.method: lora (job.lora.rank: 16), job.sharding: full" in changes


def test_32b_full_fine_tune_is_refused_through_the_cli(tmp_path, capsys):
    """End to end: `python -m workloads.plan FILE` on the default file with job.model Qwen2.5-32B (a full fine-tune
    on 2 x g6.12xlarge) exits 2; its last stderr line names the file, job.method, the numbers and the fix (LoRA, or
    more or bigger GPUs), and what fits instead: LoRA fully sharded at micro-batch 1 (config/examples/lora.yaml's
    job), with its per-GPU peak. Several minutes of CPU: the LoRA candidates simulate 64-layer steps."""
    file = write_variant(tmp_path, {"job": {"model": "Qwen/Qwen2.5-32B", "method": "full"}})
    result = run_plan(file)
    with capsys.disabled():
        print("\n" + result.stdout + result.stderr.splitlines()[-1])
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    line = result.stderr.splitlines()[-1]
    assert line.startswith(f"{file}: job.method: predicted peak 122.1 GiB per GPU exceeds the 20.5 GiB limit"), line
    assert "the persistent state alone is 122.1 GiB per GPU" in line
    assert "train LoRA adapters (job.method: lora), or shard over more GPUs or bigger ones" in line
    instead = line.split("; what fits instead: ")[1]
    assert instead.startswith("job.method: lora (job.lora.rank: 16), job.sharding: full, job.micro_batch_size: 1;")
    peak = float(instead.split("(peak ")[1].split(" GiB")[0])
    assert 0 < peak <= 20.5
    assert "DOES NOT FIT" in result.stdout and "what would fit instead" in result.stdout


def test_lora_example_plans_32b_on_the_default_nodes(capsys):
    """config/examples/lora.yaml: Qwen2.5-32B, LoRA rank 16, full sharding, micro-batch 1 on 2 x g6.12xlarge:
    accepted (exit 0), its per-GPU peak printed under the limit."""
    result = run_plan(LORA_EXAMPLE)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with capsys.disabled():
        print("\n" + result.stdout)
    text = result.stdout
    assert "Qwen/Qwen2.5-32B" in text and "method     LoRA rank 16 (alpha 32)" in text
    assert ": fits" in text and "bf16 frozen base + fp32 adapters" in text
    (peak_line,) = [line for line in text.splitlines() if line.strip().startswith("peak ")]
    peak, limit = float(peak_line.split()[1]), float(peak_line.split("limit ")[1].split()[0])
    assert 0 < peak <= limit == pytest.approx(20.49, abs=0.01), peak_line
