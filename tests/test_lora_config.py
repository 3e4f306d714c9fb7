"""`job.method: lora` in the variable file: the fields, their refusals, the architecture check, the runtime env.

No process group, no simulation: the architecture check builds the model on the meta device (the two tests
that import torch are marked slow all the same).
"""

from __future__ import annotations

import pytest

from config import ConfigError, load_config
from tests.helpers import DEFAULT_FILE, REPO, load_variant, write_variant

LORA_EXAMPLE = REPO / "config" / "examples" / "lora.yaml"


def _refused(tmp_path, job: dict) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(write_variant(tmp_path, {"job": job}))
    return str(info.value)


def test_default_is_full_fine_tuning_and_the_example_is_lora():
    assert load_config(DEFAULT_FILE).job.method == "full"
    job = load_config(LORA_EXAMPLE).job
    assert job.method == "lora" and job.model == "Qwen/Qwen2.5-32B"
    assert job.lora.rank == 16 and job.lora.alpha == 32 and job.export.merge is True
    assert job.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def test_method_typo_is_refused_with_the_nearest(tmp_path):
    message = _refused(tmp_path, {"method": "lroa"})
    assert "job.method: Input should be 'full' or 'lora'" in message and "did you mean 'lora'?" in message


@pytest.mark.parametrize(("lora", "expected"), [
    ({"rank": 0}, "job.lora.rank: Input should be greater than 0"),
    ({"dropout": 1.0}, "job.lora.dropout: Input should be less than 1"),
    ({"target_modules": []}, "job.lora.target_modules: List should have at least 1 item"),
    ({"target_modules": ["q_proj", "q proj"]}, "'q proj' is not a module name"),
    ({"target_modules": ["q_proj", "v_proj", "q_proj"]}, "q_proj listed twice; list each module once"),
    ({"ranks": 8}, "job.lora.ranks: unknown key (did you mean 'rank'?)"),
])
def test_bad_lora_fields_are_refused_naming_file_and_field(tmp_path, lora, expected):
    message = _refused(tmp_path, {"method": "lora", "lora": lora})
    assert expected in message
    assert str(tmp_path) in message  # the file is named


@pytest.mark.slow  # imports torch, transformers and peft: seconds `make check` does not spend
def test_target_that_is_not_a_linear_layer_is_refused_with_the_names_that_are(tmp_path, capsys):
    """The plan checks job.lora.target_modules against the real architecture before simulating anything: exit 2,
    `FILE: job.lora.target_modules: ...` naming the missing one and the model's linear layers."""
    from config.errors import run_cli
    from workloads.plan.__main__ import main

    file = write_variant(tmp_path, {"job": {"method": "lora", "lora": {"target_modules": ["q_proj", "qkv_proj"]}}})
    with pytest.raises(SystemExit) as exited:
        run_cli(main, [str(file)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"{file}: job.lora.target_modules: 'qkv_proj' is not a linear layer of Qwen/Qwen2.5-1.5B" in err
    assert "its linear layers are named down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj" in err


@pytest.mark.slow
def test_worker_refuses_the_same_target_before_training():
    import torch
    from transformers import AutoModelForCausalLM

    from workloads.fsdp_finetune.lora import LoraTargetError, apply_lora
    from workloads.plan.architectures import resolve_architecture

    arch, _ = resolve_architecture("Qwen/Qwen2.5-0.5B")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(arch)
    lora = {"rank": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["c_attn"]}
    with pytest.raises(LoraTargetError, match="'c_attn' is not a linear layer of org/model"):
        apply_lora(model, lora, seed=0, base_model="org/model")
    # A dotted suffix is a name PEFT matches too.
    peft_model = apply_lora(model, {**lora, "target_modules": ["self_attn.q_proj"]}, seed=0)
    assert {n.rsplit(".lora_", 1)[0].rsplit(".", 1)[-1] for n, p in peft_model.named_parameters()
            if p.requires_grad} == {"q_proj"}


def test_lora_adds_the_pinned_peft_to_the_runtime_env(tmp_path):
    """The image has no peft (aws/deep-learning-containers docker/ray-train/pyproject.toml), so a LoRA job's
    runtime env installs requirements.txt's pin; a full fine-tune installs nothing, and a listed peft is kept."""
    from charts import ray

    pin = next(line for line in (REPO / "requirements.txt").read_text().splitlines() if line.startswith("peft=="))
    assert ray.job_pip(load_config(DEFAULT_FILE)) == []
    assert ray.job_pip(load_config(LORA_EXAMPLE)) == [pin]
    own = load_variant(tmp_path, {"job": {"method": "lora"}, "ray": {"extra_pip_packages": ["peft==0.20.0"]}})
    assert ray.job_pip(own) == ["peft==0.20.0"]
