"""LoRA with FSDP2 on two gloo ranks: the workload's own pieces (`train.build_sharded_model`, `train_step`,
`checkpoint`, `lora.export_lora`) against PEFT on one process, a kill and resume, and the export's loaders.

Runs shared across assertions (each spawns 2 ranks; a few seconds of CPU each):

* `unbroken`: 10 steps from the seed's adapters, a checkpoint at step 5, then the export (adapter folder and
  merged model) and the trained model's logits on a fixed input.
* `killed`: the same run, whose last rank exits abruptly (os._exit, no clean-up) at step 7, after the
  checkpoint of step 5; `resumed`: a new group that loads that checkpoint and trains to step 10.
* the reference: one process, no FSDP, no process group: the same tiny Qwen2 in fp32, PEFT's `get_peft_model`
  with the same seed, and both ranks' micro-batches of each step as one accumulation window.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.ranks import spawn_gloo

pytestmark = pytest.mark.slow  # spawns ranks: `make check` leaves it out

STEPS, CHECKPOINT_AT, KILL_AT = 10, 5, 7
MICRO_BATCH, SEQ = 2, 32
LORA = {"rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj",
                                                                     "gate_proj", "up_proj", "down_proj"]}


def _job(model_dir: str) -> dict:
    from config.model import JobConfig

    return JobConfig(model=model_dir, method="lora", lora=LORA, learning_rate=1e-2, weight_decay=0.01,
                     warmup_steps=2, max_steps=STEPS, activation_checkpointing=False, seed=7).model_dump()


def _micro_batch(step: int, rank: int, vocab: int) -> dict:
    """Rank `rank`'s micro-batch of `step` (0-based): seeded token ids, the same in every run; two batches
    alternate, so ten steps visibly learn them."""
    gen = torch.Generator().manual_seed(1000 * (step % 2) + rank)
    ids = torch.randint(0, vocab, (MICRO_BATCH, SEQ), generator=gen)
    return {"input_ids": ids, "labels": ids.clone()}


def _probe(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(99))


def _adapters(model) -> dict[str, torch.Tensor]:
    """The adapters, gathered whole (collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True,
                                                                 ignore_frozen_params=True))
    # (torch 2.13 keeps a frozen tied alias, lm_head.weight, despite ignore_frozen_params: not an adapter)
    return {k: v.clone() for k, v in state.items() if ".lora_" in k}


def _run(rank: int, world: int, model_dir: str, out: str, mode: str) -> None:
    """One group's run; `mode` is unbroken, killed or resumed. Rank 0 writes what the test reads into `out`."""
    from transformers import AutoTokenizer

    from workloads.fsdp_finetune.checkpoint import load_checkpoint, save_checkpoint
    from workloads.fsdp_finetune.lora import export_lora
    from workloads.fsdp_finetune.train import build_optimizer, build_scheduler, build_sharded_model, train_step

    device = torch.device("cpu")
    job = _job(model_dir)
    torch.manual_seed(job["seed"] + rank)  # as train_func: a per-rank stream, which the adapters must not use
    model, peft_model = build_sharded_model(job, model_dir, device=device, local_rank=rank, local_world=world)
    optimizer = build_optimizer(model, job, device)
    scheduler = build_scheduler(optimizer, job)
    vocab = model.config.vocab_size
    checkpoint = os.path.join(out, "checkpoint")
    step, losses = 0, []
    if mode == "resumed":
        step = load_checkpoint(checkpoint, model=model, optimizer=optimizer, scheduler=scheduler,
                               device=device)["step"]
    while step < STEPS:
        if mode == "killed" and step == KILL_AT and rank == world - 1:
            os._exit(1)  # as an OOM kill: no clean-up, no goodbye to the group
        result = train_step(model, optimizer, [_micro_batch(step, rank, vocab)], grad_clip=1.0, device=device)
        scheduler.step()
        step += 1
        losses.append(float(result["loss_sum"] / result["label_tokens"]))
        if step == CHECKPOINT_AT and mode != "resumed":
            save_checkpoint(checkpoint, model=model, optimizer=optimizer, scheduler=scheduler, step=step,
                            data_state={"epoch": 0, "position": step}, device=device)
    adapters = _adapters(model)
    if mode == "unbroken":
        with torch.no_grad():
            logits = model(input_ids=_probe(vocab)).logits
        export_lora(model, peft_model, AutoTokenizer.from_pretrained(model_dir), os.path.join(out, "export"),
                    lora=job["lora"], merge=True, dtype=torch.float32)
    if rank == 0:
        torch.save({"losses": losses, "adapters": adapters, **({"logits": logits} if mode == "unbroken" else {})},
                   os.path.join(out, f"{mode}.pt"))


def _reference(model_dir: str) -> dict:
    """PEFT on one process: the same model, seed, data (both ranks' micro-batches per step) and optimizer."""
    from workloads.fsdp_finetune.lora import apply_lora
    from workloads.fsdp_finetune.model import build_model
    from workloads.fsdp_finetune.train import build_optimizer, build_scheduler, train_step

    device = torch.device("cpu")
    job = _job(model_dir)
    model = build_model(model_dir, attn_implementation="sdpa", device=device)
    peft_model = apply_lora(model, job["lora"], seed=job["seed"])
    assert peft_model.base_model.model is model
    optimizer = build_optimizer(model, job, device)
    scheduler = build_scheduler(optimizer, job)
    losses = []
    for step in range(STEPS):
        batches = [_micro_batch(step, rank, model.config.vocab_size) for rank in range(2)]
        result = train_step(model, optimizer, batches, grad_clip=1.0, device=device)
        scheduler.step()
        losses.append(float(result["loss_sum"] / result["label_tokens"]))
    adapters = {k: v.detach().clone() for k, v in model.state_dict().items() if ".lora_" in k}
    return {"losses": losses, "adapters": adapters}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from workloads.fsdp_finetune.local_assets import prepare_local_assets

    # Same place and arguments as test_data and test_export: one build per session, reused (idempotent).
    return prepare_local_assets(tmp_path_factory.getbasetemp() / "local-assets", seed=0, n_train=400, n_eval=16)


@pytest.fixture(scope="module")
def runs(assets, tmp_path_factory):
    out = tmp_path_factory.mktemp("lora")
    model_dir = str(assets.model_dir)
    spawn_gloo(_run, 2, tmp_path_factory.mktemp("group-unbroken"), model_dir, str(out / "unbroken"), "unbroken")
    killed = out / "killed"
    with pytest.raises(Exception, match="exit"):  # torch.multiprocessing: "process 1 terminated with exit code 1"
        spawn_gloo(_run, 2, tmp_path_factory.mktemp("group-killed"), model_dir, str(killed), "killed")
    spawn_gloo(_run, 2, tmp_path_factory.mktemp("group-resumed"), model_dir, str(killed), "resumed")
    return {"out": out, "model_dir": model_dir,
            "unbroken": torch.load(out / "unbroken" / "unbroken.pt"),
            "resumed": torch.load(killed / "resumed.pt"),
            "killed_checkpoint": killed / "checkpoint",
            "reference": _reference(model_dir)}


def test_two_ranks_match_single_process_peft(runs, capsys):
    """fp32 on CPU: the sharded run's loss at every step is PEFT's on one process to 1e-6 (relative)."""
    ours, reference = runs["unbroken"]["losses"], runs["reference"]["losses"]
    assert len(ours) == len(reference) == STEPS
    with capsys.disabled():
        worst = max(abs(a - b) / abs(b) for a, b in zip(ours, reference, strict=True))
        print(f"\nLoRA on 2 gloo ranks vs PEFT on one process: losses {ours[0]:.4f} -> {ours[-1]:.4f}, "
              f"largest relative difference {worst:.2e} over {STEPS} steps")
    for step, (a, b) in enumerate(zip(ours, reference, strict=True)):
        assert abs(a - b) <= 1e-6 * abs(b), (step, a, b)
    assert ours[-1] < ours[0]  # it learns (the two alternating batches)
    # And the adapters themselves: the reference's names, close values (they moved: B starts at zero).
    gathered, expected = runs["unbroken"]["adapters"], runs["reference"]["adapters"]
    assert gathered.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(gathered[key], expected[key], rtol=1e-5, atol=1e-6)
    assert any(k.endswith("lora_B.default.weight") and v.abs().sum() > 0 for k, v in gathered.items())


def test_killed_and_resumed_adapters_equal_the_unbroken_run(runs):
    unbroken, resumed = runs["unbroken"], runs["resumed"]
    assert len(resumed["losses"]) == STEPS - CHECKPOINT_AT  # resumed at the checkpoint, not from scratch
    assert resumed["losses"] == unbroken["losses"][CHECKPOINT_AT:]
    assert resumed["adapters"].keys() == unbroken["adapters"].keys()
    for key, value in unbroken["adapters"].items():
        assert torch.equal(resumed["adapters"][key], value), key


def test_checkpoint_holds_adapters_and_optimizer_state_only(runs, capsys):
    """The tensors a LoRA checkpoint holds: fp32 adapters plus AdamW's two fp32 moments (12 bytes a trainable
    parameter) and AdamW's step counters; no base weight. On disk DCP adds a fixed cost per entry (the
    optimizer's hyper-parameters and counters are pickled one by one), which dominates only for a tiny model."""
    import math

    from torch.distributed.checkpoint import FileSystemReader
    from transformers import AutoModelForCausalLM

    from workloads.fsdp_finetune.lora import apply_lora, trainable_count

    directory = runs["killed_checkpoint"]
    model = AutoModelForCausalLM.from_pretrained(runs["model_dir"])
    base = sum(p.numel() for p in model.parameters())
    trainable = trainable_count(apply_lora(model, LORA, seed=0).base_model.model)
    adapters = sum(1 for n, p in model.named_parameters() if p.requires_grad)
    entries = FileSystemReader(str(directory)).read_metadata().state_dict_metadata
    tensors = {k: math.prod(v.size) for k, v in entries.items() if hasattr(v, "size")}
    assert all(".lora_" in k for k in tensors), sorted(k for k in tensors if ".lora_" not in k)
    assert sum(tensors.values()) == 3 * trainable + adapters  # weights, exp_avg, exp_avg_sq; one step each
    total = sum(f.stat().st_size for f in directory.iterdir())
    with capsys.disabled():
        print(f"\nLoRA checkpoint: {total:,} bytes on disk ({4 * sum(tensors.values()):,} of tensors) for "
              f"{trainable:,} trainable of {base:,} parameters; a full fine-tune's tensors: {16 * base:,} bytes")
    assert total < 0.25 * 16 * base


def test_exports_load_with_standard_loaders_and_give_the_trained_logits(runs):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    export = runs["out"] / "unbroken" / "export"
    trained = runs["unbroken"]["logits"]
    probe = _probe(trained.shape[-1])
    config = json.loads((export / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == LORA["rank"] and config["lora_alpha"] == LORA["alpha"]
    assert (export / "adapter" / "adapter_model.safetensors").is_file()

    merged = AutoModelForCausalLM.from_pretrained(export).eval()
    assert not any(".lora_" in n or "base_layer" in n for n, _ in merged.named_parameters())
    base = AutoModelForCausalLM.from_pretrained(runs["model_dir"])
    adapted = PeftModel.from_pretrained(base, export / "adapter").eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=probe).logits, trained, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(adapted(input_ids=probe).logits, trained, rtol=1e-5, atol=1e-5)
        untrained = AutoModelForCausalLM.from_pretrained(runs["model_dir"]).eval()(input_ids=probe).logits
    assert not torch.allclose(untrained, trained, atol=1e-3)  # the adapters changed the model
