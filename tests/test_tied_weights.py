"""Tied weights stored once: FSDP2 checkpoints and the Hugging Face export, and both older formats still load.

Two gloo ranks train one step of the tiny Qwen2 (tied like Qwen2.5-1.5B), then write a checkpoint,
a checkpoint in the format before this change (every key of `get_state_dict`, so the tied weight
twice) and the export; fresh sharded models restore each checkpoint.
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from tests.ranks import spawn_gloo
from workloads.fsdp_finetune.local_assets import prepare_local_assets

pytestmark = pytest.mark.slow  # `make check` leaves this module out (pyproject.toml markers)

ALIAS, KEPT = "lm_head.weight", "model.embed_tokens.weight"


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    # Same place and arguments as test_data: one build per session, reused (idempotent).
    return prepare_local_assets(tmp_path_factory.getbasetemp() / "local-assets", seed=0, n_train=400, n_eval=16)


def _sharded(model_dir: str):
    from workloads.fsdp_finetune.model import build_model, shard_model
    from workloads.fsdp_finetune.train import build_scheduler

    device = torch.device("cpu")
    model = shard_model(build_model(model_dir, attn_implementation="sdpa", device=device), device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, optimizer, build_scheduler(optimizer, {"warmup_steps": 0, "max_steps": 10})


def _full(model) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _worker(rank: int, world: int, model_dir: str, out: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from transformers import AutoTokenizer

    from workloads.fsdp_finetune.checkpoint import TRAINER_FILE, export_hf_model, load_checkpoint, save_checkpoint
    from workloads.fsdp_finetune.train import train_step

    device = torch.device("cpu")
    model, optimizer, scheduler = _sharded(model_dir)
    ids = torch.randint(3, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(rank))
    train_step(model, optimizer, [{"input_ids": ids, "labels": ids}], grad_clip=1.0, device=device)
    scheduler.step()
    new, old = os.path.join(out, "new"), os.path.join(out, "old")
    save_checkpoint(new, model=model, optimizer=optimizer, scheduler=scheduler, step=1,
                    data_state={"epoch": 0, "position": 1}, device=device)
    model_sd, optim_sd = get_state_dict(model, optimizer)  # what save_checkpoint wrote before: both keys
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=old)
    shutil.copy(os.path.join(new, TRAINER_FILE.format(rank=rank)), os.path.join(old, TRAINER_FILE.format(rank=rank)))
    export_hf_model(model, AutoTokenizer.from_pretrained(model_dir), os.path.join(out, "export"))
    results = {"trained": _full(model)}
    for name, directory in (("new", new), ("old", old)):
        fresh, fresh_optimizer, fresh_scheduler = _sharded(model_dir)
        restored = load_checkpoint(directory, model=fresh, optimizer=fresh_optimizer, scheduler=fresh_scheduler,
                                   device=device)
        results[name] = {"state": _full(fresh), "step": restored["step"],
                         "tied": fresh.lm_head.weight is fresh.model.embed_tokens.weight}
    if rank == 0:
        torch.save(results, os.path.join(out, "results.pt"))


@pytest.fixture(scope="module")
def run(assets, tmp_path_factory):
    out = tmp_path_factory.mktemp("tied")
    spawn_gloo(_worker, 2, tmp_path_factory.mktemp("store"), str(assets.model_dir), str(out))
    return out, torch.load(out / "results.pt", weights_only=False)


def test_tied_aliases_come_from_the_live_model(assets):
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from workloads.fsdp_finetune.checkpoint import tied_aliases

    model = AutoModelForCausalLM.from_pretrained(assets.model_dir)
    assert model.config.tie_word_embeddings  # the demo's model is tied like Qwen2.5-1.5B
    assert tied_aliases(model) == {ALIAS: KEPT}
    untied = Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False))
    assert tied_aliases(untied) == {}


def test_checkpoint_stores_the_tied_weight_once_and_both_formats_restore(run):
    import torch.distributed.checkpoint as dcp

    out, results = run
    new = dcp.FileSystemReader(str(out / "new")).read_metadata().state_dict_metadata
    old = dcp.FileSystemReader(str(out / "old")).read_metadata().state_dict_metadata
    assert f"model.{KEPT}" in new and f"model.{ALIAS}" not in new
    assert set(old) - set(new) == {f"model.{ALIAS}"}  # only the duplicate is gone (optimizer state included)

    def size(directory):
        return sum(f.stat().st_size for f in directory.iterdir() if f.name.endswith(".distcp"))

    embedding = results["trained"][KEPT]
    assert size(out / "old") - size(out / "new") >= embedding.numel() * embedding.element_size()
    for name in ("new", "old"):
        got = results[name]
        assert got["step"] == 1 and got["tied"], name
        assert got["state"].keys() == results["trained"].keys()
        for key, value in results["trained"].items():
            assert torch.equal(got["state"][key], value), (name, key)


def test_export_stores_the_tied_weight_once_and_reloads_tied(run):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    out, results = run
    with safe_open(str(out / "export" / "model.safetensors"), "pt") as fh:
        keys = set(fh.keys())
    assert KEPT in keys and ALIAS not in keys
    model = AutoModelForCausalLM.from_pretrained(out / "export", dtype=torch.float32)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    for key, value in model.state_dict().items():
        assert torch.equal(value, results["trained"][key]), key


def test_an_export_with_both_keys_still_loads_tied(run, tmp_path):
    """Exports written before this change hold `lm_head.weight` too; they load, tied, with the same weights."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    out, results = run
    model = AutoModelForCausalLM.from_pretrained(out / "export", dtype=torch.float32)
    both = {k: v.clone() for k, v in model.state_dict().items()}  # separate tensors: written twice
    model.save_pretrained(tmp_path / "old", state_dict=both)
    with safe_open(str(tmp_path / "old" / "model.safetensors"), "pt") as fh:
        assert {KEPT, ALIAS} <= set(fh.keys())
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "old", dtype=torch.float32)
    assert reloaded.lm_head.weight is reloaded.model.embed_tokens.weight
    assert torch.equal(reloaded.model.embed_tokens.weight, results["trained"][KEPT])
