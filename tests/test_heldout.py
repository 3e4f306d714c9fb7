"""Held-out loss during training: 2 FSDP2 ranks over gloo, each on its own shard, give the one-process figure."""

from __future__ import annotations

import math

import pytest
import torch

from tests.ranks import spawn_gloo
from workloads.fsdp_finetune.evaluate import HeldOutLoss, evaluate
from workloads.fsdp_finetune.local_assets import prepare_local_assets

SEQ_LEN = 64
# Small enough that the shards need several batches (batch widths are rounded up to 64 positions).
TOKEN_BUDGET = 256


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return prepare_local_assets(tmp_path_factory.mktemp("assets"))


def _records(assets):
    # 15 records, an odd count: rank 0 gets 8 and rank 1 gets 7, so the ranks' batch counts can differ.
    return assets.eval_records[:15]


def _rank_worker(rank: int, world: int, model_dir: str, records: list, out: str) -> None:
    from transformers import AutoTokenizer

    from workloads.fsdp_finetune.model import build_model, shard_model

    device = torch.device("cpu")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = build_model(model_dir, attn_implementation="sdpa", device=device)
    shard_model(model, device=device, activation_checkpointing=True)
    model.train()
    scorer = HeldOutLoss(tokenizer, records, seq_len=SEQ_LEN, token_budget=TOKEN_BUDGET, rank=rank, world_size=world)
    figures = scorer(model, device)
    torch.save({"figures": figures, "batches": len(scorer.batches), "steps": scorer.steps,
                "training": model.training}, f"{out}.{rank}")


@pytest.mark.slow
def test_two_rank_held_out_loss_equals_one_process(assets, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    records = _records(assets)
    out = str(tmp_path / "rank")
    spawn_gloo(_rank_worker, 2, tmp_path, str(assets.model_dir), records, out)
    ranks = [torch.load(f"{out}.{r}", weights_only=False) for r in range(2)]

    tokenizer = AutoTokenizer.from_pretrained(assets.model_dir)
    model = AutoModelForCausalLM.from_pretrained(assets.model_dir, dtype=torch.float32).eval()
    single = HeldOutLoss(tokenizer, records, seq_len=SEQ_LEN, token_budget=TOKEN_BUDGET)(model, torch.device("cpu"))
    driver = evaluate(model, tokenizer, records, max_new_tokens=1)  # the local driver's before/after figure

    for got in ranks:
        assert got["figures"]["eval_tokens"] == single["eval_tokens"] > 0
        assert got["figures"]["eval_loss"] == pytest.approx(single["eval_loss"], rel=1e-5)
        assert got["figures"]["eval_perplexity"] == pytest.approx(math.exp(single["eval_loss"]), rel=1e-5)
        assert got["training"]  # the model goes back to train mode
    assert single["eval_loss"] == pytest.approx(driver["loss"], rel=1e-5)
    # The ranks ran the same number of forwards (FSDP's all-gathers), whatever their own batch counts.
    assert ranks[0]["steps"] == ranks[1]["steps"] == max(r["batches"] for r in ranks)


def test_batches_stay_within_the_token_budget_and_cut_at_seq_len(assets):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(assets.model_dir)
    long = [{"instruction": "1 + 1 = ? " * 40, "response": "2"}]
    scorer = HeldOutLoss(tokenizer, _records(assets) + long, seq_len=SEQ_LEN, token_budget=TOKEN_BUDGET)
    assert scorer.count == 16
    for batch in scorer.batches:
        widths = [len(ids) for ids, _ in batch]
        assert max(widths) <= SEQ_LEN
        assert len(batch) == 1 or len(batch) * -(-max(widths) // 64) * 64 <= TOKEN_BUDGET
    assert len(scorer.batches) > 2
    # Shards are disjoint and cover the set.
    shards = [HeldOutLoss(tokenizer, _records(assets), seq_len=SEQ_LEN, token_budget=TOKEN_BUDGET, rank=r,
                          world_size=2).batches for r in range(2)]
    assert sum(len(b) for shard in shards for b in shard) == 15
