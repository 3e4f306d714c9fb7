"""Training pieces without Ray: schedule, FLOP accounting, exact gradient accumulation, checkpoint round trip."""

from __future__ import annotations

import copy

import pytest
import torch

from workloads.fsdp_finetune.local_assets import prepare_local_assets
from workloads.fsdp_finetune.metrics import flops_per_token, matmul_params, mfu
from workloads.fsdp_finetune.train import build_scheduler, lr_factor, train_step


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return prepare_local_assets(tmp_path_factory.mktemp("assets"))


def test_schedule_warms_up_then_decays_to_zero():
    factors = [lr_factor(s, warmup_steps=4, max_steps=20) for s in range(20)]
    assert factors[:4] == sorted(factors[:4]) and factors[0] > 0
    assert factors[4] == pytest.approx(1.0)
    assert factors[4:] == sorted(factors[4:], reverse=True)
    assert lr_factor(20, warmup_steps=4, max_steps=20) == pytest.approx(0.0)

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    sched = build_scheduler(opt, {"warmup_steps": 4, "max_steps": 20})
    assert sched.get_last_lr()[0] == pytest.approx(0.5 * factors[0])


def test_matmul_params_match_the_model(assets):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(assets.model_dir)
    # Tied embeddings: every parameter is used in a matmul once (the LM head is the embedding).
    assert matmul_params(model.config) == sum(p.numel() for p in model.parameters())
    c = model.config
    assert flops_per_token(c, 128) == 6 * matmul_params(c) + 12 * c.num_hidden_layers * c.hidden_size * 128
    assert mfu(1000.0, c, 128, None) is None
    assert mfu(1000.0, c, 128, 1.0) == pytest.approx(1000.0 * flops_per_token(c, 128) / 1e12)


def test_accumulation_gives_the_big_batch_gradient(assets):
    """Two micro-batches of 2 must update the weights like one batch of 4 (token-weighted loss)."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(assets.model_dir, dtype=torch.float32)
    torch.manual_seed(0)
    ids = torch.randint(0, base.config.vocab_size, (4, 16))
    labels = ids.clone()
    labels[0, :10] = -100  # uneven label counts per micro-batch: a mean-of-means would be wrong
    labels[3, :3] = -100
    results = []
    for micro in ([{"input_ids": ids, "labels": labels}],
                  [{"input_ids": ids[:2], "labels": labels[:2]}, {"input_ids": ids[2:], "labels": labels[2:]}]):
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        out = train_step(model, opt, micro, grad_clip=1e9, device=torch.device("cpu"))
        results.append((model, float(out["loss_sum"] / out["label_tokens"])))
    (one, loss_one), (two, loss_two) = results
    assert loss_one == pytest.approx(loss_two, rel=1e-6)
    for p1, p2 in zip(one.parameters(), two.parameters(), strict=True):
        torch.testing.assert_close(p1, p2, rtol=0, atol=1e-6)
