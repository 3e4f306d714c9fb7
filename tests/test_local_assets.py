"""Local-mode assets: generated data, tokenizer and tiny model, loaded back the way the job loads them."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from workloads.fsdp_finetune import local_assets as la  # noqa: E402


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    # Same place and arguments as test_data: one build per session, reused (idempotent).
    return la.prepare_local_assets(tmp_path_factory.getbasetemp() / "local-assets", seed=0, n_train=400, n_eval=16)


@pytest.fixture(scope="module")
def tokenizer(assets):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(assets.tokenizer_dir)


def test_arithmetic_records_are_deterministic_and_correct():
    first = la.make_arithmetic_records(200, seed=3)
    assert first == la.make_arithmetic_records(200, seed=3)
    assert first != la.make_arithmetic_records(200, seed=4)
    assert la.make_arithmetic_records(0, seed=3) == []
    for record in first:
        numbers = [int(tok.strip("?.")) for tok in record["instruction"].split() if tok.strip("?.").isdigit()]
        assert len(numbers) == 2 and all(0 <= n <= 9 for n in numbers)
        assert record["response"] == str(sum(numbers))
    wide = la.make_arithmetic_records(300, seed=3, max_operand=50)
    assert max(int(r["response"]) for r in wide) > 18  # the operand range is honoured


def test_write_jsonl_round_trips(tmp_path):
    records = la.make_arithmetic_records(5, seed=1) + [{"instruction": "ünïcode ✓", "response": "ok"}]
    path = la.write_jsonl(records, tmp_path / "sub" / "d.jsonl")
    assert [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] == records
    assert not list(tmp_path.glob("sub/*.tmp"))


def test_tokenizer_loads_back_and_round_trips(assets, tokenizer):
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.pad_token_id == tokenizer.eos_token_id
    for token in ("<|im_start|>", "<|im_end|>"):
        # A special token is one id, not spelled out in bytes.
        assert len(tokenizer(token, add_special_tokens=False)["input_ids"]) == 1
    text = "What is 17 + 25?\nCompute 1234 + 5. ünïcode ✓ never-seen words"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text  # byte-level: anything round-trips
    digits = tokenizer("1234567890", add_special_tokens=False)["input_ids"]
    assert len(digits) == 10  # each digit its own token
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 1 + 2?"}, {"role": "assistant", "content": "3"}], tokenize=False
    )
    assert rendered == "<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n<|im_start|>assistant\n3<|im_end|>\n"
    # The template words were in the training corpus: they cost a token or two, not one per letter.
    assert len(tokenizer("assistant", add_special_tokens=False)["input_ids"]) <= 2


def test_tiny_model_loads_with_from_pretrained(assets, tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    assert (assets.model_dir / "model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(assets.model_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.num_attention_heads == 4 and model.config.num_key_value_heads == 2
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied
    ids = torch.tensor([tokenizer("What is 1 + 2?", add_special_tokens=False)["input_ids"]])
    out = model(input_ids=ids, labels=ids)
    assert out.logits.shape == (1, ids.shape[1], len(tokenizer)) and torch.isfinite(out.loss)


def test_tiny_model_is_seeded(tmp_path, tokenizer):
    from safetensors.torch import load_file

    a = load_file(la.make_tiny_model(tmp_path / "a", tokenizer, seed=5, hidden_size=32, intermediate_size=64)
                  / "model.safetensors")
    b = load_file(la.make_tiny_model(tmp_path / "b", tokenizer, seed=5, hidden_size=32, intermediate_size=64)
                  / "model.safetensors")
    c = load_file(la.make_tiny_model(tmp_path / "c", tokenizer, seed=6, hidden_size=32, intermediate_size=64)
                  / "model.safetensors")
    assert a.keys() == b.keys()
    assert all((a[k] == b[k]).all() for k in a)
    assert any((a[k] != c[k]).any() for k in a)


def test_prepare_local_assets_is_idempotent_and_holds_out_questions(assets):
    train = [json.loads(line) for line in assets.dataset_path.read_text().splitlines()]
    assert len(train) == 400 and len(assets.eval_records) == 16
    assert assets.tokenizer_dir == assets.model_dir
    held_out = {r["instruction"] for r in assets.eval_records}
    assert len(held_out) == 16
    assert not held_out & {r["instruction"] for r in train}

    stamp = (assets.model_dir / "model.safetensors").stat().st_mtime_ns
    again = la.prepare_local_assets(assets.model_dir.parent, seed=0, n_train=400, n_eval=16)
    assert again == assets
    assert (assets.model_dir / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt


def test_prepare_local_assets_rebuilds_for_other_arguments(tmp_path):
    first = la.prepare_local_assets(tmp_path, seed=0, n_train=50, n_eval=5)
    second = la.prepare_local_assets(tmp_path, seed=1, n_train=60, n_eval=5)
    assert len(second.dataset_path.read_text().splitlines()) == 60
    assert first.eval_records != second.eval_records
