"""Training pieces without Ray: schedule, FLOP accounting, exact gradient accumulation, checkpoint round trip."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch

from tests.ranks import spawn_gloo
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
    assert mfu(1000.0, model.config, 128, None) is None


def test_flops_and_mfu_of_qwen25_15b_by_hand():
    """Known numbers for Qwen2.5-1.5B (hidden 1536, 12 heads x 128, 2 KV heads, 8960 MLP, 28 layers, 151,936 vocab).

    Per layer: q 1536x1536 + k, v 2 x 1536x256 + o 1536x1536 + qkv biases 1536+512
               = 2,359,296 + 786,432 + 2,359,296 + 2,048      =  5,507,072
               MLP 3 x 1536x8960                               = 41,287,680
               two RMSNorms 2 x 1536                           =      3,072
               layer total                                     = 46,797,824; x 28 = 1,310,339,072
    final norm 1,536 + tied LM head (counted once) 151,936 x 1536 = 233,373,696
    N = 1,543,714,304 (~1.543e9, the published 1.54B).
    FLOPs/token at T=2048: 6N = 9,262,285,824; attention 12 x 28 x (12 x 128) x 2048 = 1,056,964,608;
    total 10,319,250,432 (~10.3 GFLOP). At 40,000 tokens/s on a 989 TFLOP/s GPU: MFU = 0.41736...
    """
    from transformers import Qwen2Config

    c = Qwen2Config(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                    num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
    assert matmul_params(c) == 1_543_714_304
    assert flops_per_token(c, 2048) == 10_319_250_432
    assert mfu(40_000.0, c, 2048, 989.0) == pytest.approx(0.417361, abs=1e-6)


def test_attention_flops_use_heads_times_head_dim():
    """A model whose attention width (8 heads x 32 = 256) differs from its hidden size (64)."""
    from transformers import Qwen2Config

    c = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
                    num_key_value_heads=2, head_dim=32, vocab_size=100, tie_word_embeddings=True)
    # 12 x L x 256 x T at T=10: 12 x 2 x 256 x 10 = 61,440 on top of 6N.
    assert flops_per_token(c, 10) - flops_per_token(c, 0) == 61_440


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


@pytest.mark.slow
def test_chunked_loss_equals_the_hugging_face_loss(assets):
    """`loss_sum` (LM head + CE in chunks, shifted labels) is the HF model's own loss, summed, with equal grads."""
    from transformers import AutoModelForCausalLM

    from workloads.fsdp_finetune.loss import loss_sum

    model = AutoModelForCausalLM.from_pretrained(assets.model_dir, dtype=torch.float32)
    torch.manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (3, 20))
    labels = ids.clone()
    labels[0, :7] = -100
    labels[2, 15:] = -100
    hf = model(input_ids=ids, labels=labels).loss
    hf.backward()
    hf_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    count = int((labels[:, 1:] != -100).sum())
    ours = loss_sum(model, ids, labels, chunk_tokens=7)  # 60 positions: 9 chunks, the last one short
    (ours / count).backward()
    assert float(ours.detach() / count) == pytest.approx(float(hf), rel=1e-6)
    for ours_grad, hf_grad in zip((p.grad for p in model.parameters()), hf_grads, strict=True):
        torch.testing.assert_close(ours_grad, hf_grad, rtol=1e-5, atol=1e-7)


def test_checkpointed_rng_state_round_trips(tmp_path):
    """save_checkpoint stores every generator; load_checkpoint puts them back: the same draws follow."""
    from workloads.fsdp_finetune.checkpoint import load_checkpoint, save_checkpoint

    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = build_scheduler(opt, {"warmup_steps": 1, "max_steps": 10})
    device = torch.device("cpu")
    torch.manual_seed(123)
    random.seed(4)
    np.random.seed(5)
    save_checkpoint(tmp_path / "ckpt", model=model, optimizer=opt, scheduler=sched, step=7,
                    data_state={"epoch": 1, "position": 3}, device=device)

    def draw():
        return torch.rand(5), random.random(), np.random.rand(3), torch.nn.functional.dropout(torch.ones(8), 0.5)

    first = draw()
    draw()  # move every generator on
    restored = load_checkpoint(tmp_path / "ckpt", model=model, optimizer=opt, scheduler=sched, device=device)
    again = draw()
    assert restored == {"step": 7, "data": {"epoch": 1, "position": 3}}
    assert torch.equal(first[0], again[0]) and first[1] == again[1]
    assert np.array_equal(first[2], again[2]) and torch.equal(first[3], again[3])


def test_export_writes_the_original_dtype(assets, tmp_path):
    """fp32 master weights of a bf16 model are exported in bf16 (half the size) and reload as bf16."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workloads.fsdp_finetune.checkpoint import export_hf_model
    from workloads.fsdp_finetune.model import saved_dtype

    assert saved_dtype(str(assets.model_dir)) == torch.float32  # the local tiny model stays fp32
    model = AutoModelForCausalLM.from_pretrained(assets.model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(assets.model_dir)
    export_hf_model(model, tokenizer, str(tmp_path / "bf16"), dtype=torch.bfloat16)
    assert saved_dtype(str(tmp_path / "bf16")) == torch.bfloat16
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), "pt") as fh:
        assert {fh.get_tensor(k).dtype for k in fh.keys()} == {torch.bfloat16}
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16")
    assert reloaded.dtype == torch.bfloat16
    for (name, p), q in zip(model.named_parameters(), reloaded.parameters(), strict=True):
        assert torch.equal(p.to(torch.bfloat16), q), name


# ---- FSDP2 over 2 gloo ranks against one plain process ---------------------------------------

GLOBAL_ROWS, SEQ = 4, 16


def _global_batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, vocab, (GLOBAL_ROWS, SEQ), generator=torch.Generator().manual_seed(7))
    labels = ids.clone()
    labels[0, :11] = -100  # uneven label counts per rank and micro-batch: a mean of means would be wrong
    labels[3, :2] = -100
    return ids, labels


def _fsdp_worker(rank: int, world: int, model_dir: str, out: str) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from workloads.fsdp_finetune.model import build_model, shard_model

    device = torch.device("cpu")
    model = build_model(model_dir, attn_implementation="sdpa", device=device)
    shard_model(model, device=device, activation_checkpointing=True)
    layers = model.model.layers
    flags = {"training": all(layer.training for layer in layers) and model.training,
             "checkpointing": all(layer.gradient_checkpointing for layer in layers)}
    calls = []
    layers[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))  # a post-hook misses recompute: it stops early
    ids, labels = _global_batch(model.config.vocab_size)
    rows = GLOBAL_ROWS // world
    mine = slice(rank * rows, (rank + 1) * rows)
    # This rank's share, as 2 accumulated micro-batches of 1 row.
    micro = [{"input_ids": ids[mine][i:i + 1], "labels": labels[mine][i:i + 1]} for i in range(rows)]
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    result = train_step(model, opt, micro, grad_clip=1e9, device=device, chunk_tokens=6)
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save({"state": state, "loss_sum": float(result["loss_sum"]),
                    "label_tokens": int(result["label_tokens"]), "grad_norm": float(result["grad_norm"]),
                    "flags": flags, "mlp_calls": len(calls), "micro_batches": len(micro)}, out)


@pytest.mark.slow
def test_two_rank_fsdp_step_with_activation_checkpointing_equals_one_plain_step(assets, tmp_path):
    """2 gloo ranks x 2 micro-batches, FSDP2, activation checkpointing, chunked loss == the HF loss on one process.

    Catches a wrong world-size factor in the loss normalisation (FSDP averages over ranks), a
    loss that differs from HF's, checkpointing left off (`from_pretrained` returns eval mode, and HF
    layers recompute only in train mode), and checkpointing that changes numerics.
    """
    from transformers import AutoModelForCausalLM

    out = tmp_path / "rank0.pt"
    spawn_gloo(_fsdp_worker, 2, tmp_path, str(assets.model_dir), str(out))
    got = torch.load(out, weights_only=False)

    assert got["flags"] == {"training": True, "checkpointing": True}
    # Checkpointed layers run forward twice per micro-batch: once, then again in backward.
    assert got["mlp_calls"] == 2 * got["micro_batches"]

    model = AutoModelForCausalLM.from_pretrained(assets.model_dir, dtype=torch.float32)
    model.train()
    ids, labels = _global_batch(model.config.vocab_size)
    loss = model(input_ids=ids, labels=labels).loss  # HF's mean over the whole global batch
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    torch.optim.SGD(model.parameters(), lr=1.0).step()

    assert got["label_tokens"] == int((labels[:, 1:] != -100).sum())
    assert got["loss_sum"] / got["label_tokens"] == pytest.approx(float(loss), rel=1e-5)
    assert got["grad_norm"] == pytest.approx(float(grad_norm), rel=1e-5)
    expected = model.state_dict()
    assert got["state"].keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(got["state"][key], value, rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.slow
def test_compiled_chunked_loss_equals_eager():
    """`job.compile` also compiles the LM head + cross-entropy chunks (inductor; dynamic: the last chunk is shorter)."""
    from workloads.fsdp_finetune.loss import token_ce_sum

    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 40, 16, generator=gen, requires_grad=True)
    head = torch.nn.Linear(16, 50, bias=False)
    labels = torch.randint(0, 50, (2, 40), generator=gen)
    labels[0, :5] = -100
    grads = []
    for compile_ in (False, True):
        loss = token_ce_sum(hidden, head, labels, chunk_tokens=32, compile=compile_)
        loss.backward()
        grads.append((loss.detach(), hidden.grad.clone(), head.weight.grad.clone()))
        hidden.grad = head.weight.grad = None
    for eager, compiled in zip(*grads, strict=True):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)


def test_two_runs_with_one_name_stage_checkpoints_apart(tmp_path):
    """Two local runs named alike (two output folders on one machine) never empty each other's staging."""
    import os

    from workloads.fsdp_finetune.train import _checkpoint_staging, checkpoint_staging_dir

    run = f"same-name-{os.getpid()}"
    first = _checkpoint_staging(run, 0, str(tmp_path / "a"))
    staged = os.path.join(first, "checkpoint_step_0000004-x")
    os.makedirs(staged)
    second = _checkpoint_staging(run, 0, str(tmp_path / "b"))  # the other run starting (it empties its own)
    try:
        assert first != second
        assert os.path.isdir(staged)  # the first run's checkpoint waiting for upload is still there
        # The same run restarting finds (and empties) its own folder: a killed attempt's leftovers go.
        assert _checkpoint_staging(run, 0, str(tmp_path / "a")) == first and os.listdir(first) == []
        a = str(tmp_path / "a")
        assert checkpoint_staging_dir(run, a, 1) != checkpoint_staging_dir(run, a, 0)
    finally:
        import shutil

        shutil.rmtree(first, ignore_errors=True)
        shutil.rmtree(second, ignore_errors=True)
