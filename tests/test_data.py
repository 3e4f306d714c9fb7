"""The data path: loading and its refusals, chat-template tokenization, packing, sharding, resume, evaluation."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from config.model import JobConfig  # noqa: E402
from workloads.fsdp_finetune import data  # noqa: E402
from workloads.fsdp_finetune.data import IGNORE_INDEX, JobSettingError  # noqa: E402
from workloads.fsdp_finetune.local_assets import (  # noqa: E402
    make_arithmetic_records,
    prepare_local_assets,
    write_jsonl,
)

EOS = 0
PAD = 10**6  # a pad id no example uses, so tests can tell padding apart


def job(**overrides) -> JobConfig:
    """A job reading the generated arithmetic columns; the real `JobConfig`, so its validation applies."""
    base = {"instruction_field": "instruction", "response_field": "response", "input_field": None,
            "seq_len": 64, "micro_batch_size": 2, "global_batch_size": 4, "eval_fraction": 0.05, "seed": 7}
    return JobConfig(**{**base, **overrides})


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    # Same place and arguments as test_local_assets: one build per session, reused (idempotent).
    return prepare_local_assets(tmp_path_factory.getbasetemp() / "local-assets", seed=0, n_train=400, n_eval=16)


@pytest.fixture(scope="module")
def tokenizer(assets):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(assets.tokenizer_dir)


@pytest.fixture()
def cache(tmp_path):
    return tmp_path / "hf-cache"


# ---- errors ------------------------------------------------------------------------------------


def test_job_setting_error_names_the_field():
    err = JobSettingError("seq_len", "must be positive")
    assert isinstance(err, ValueError)
    assert (err.field, err.message, str(err)) == ("seq_len", "must be positive", "job.seq_len: must be positive")


# ---- loading -----------------------------------------------------------------------------------


def test_load_records_reads_jsonl(tmp_path, cache):
    records = make_arithmetic_records(30, seed=1)
    path = write_jsonl(records, tmp_path / "train.jsonl")
    ds = data.load_records(job(dataset=str(path)), cache_dir=cache)
    assert len(ds) == 30
    assert list(ds["instruction"]) == [r["instruction"] for r in records]
    assert list(ds["response"]) == [r["response"] for r in records]
    sliced = data.load_records(job(dataset=str(path), dataset_split="train[:10]"), cache_dir=cache)
    assert len(sliced) == 10


def test_load_records_reads_parquet_and_json_and_directories(tmp_path, cache):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = make_arithmetic_records(25, seed=2)
    table = pa.Table.from_pylist([{"prompt": r["instruction"], "answer": r["response"], "n": i}
                                  for i, r in enumerate(records)])
    parquet = tmp_path / "train.parquet"
    pq.write_table(table, parquet)
    settings = {"instruction_field": "prompt", "response_field": "answer"}
    ds = data.load_records(job(dataset=str(parquet), **settings), cache_dir=cache)
    assert list(ds["prompt"]) == [r["instruction"] for r in records] and ds.column_names == ["prompt", "answer", "n"]
    data.check_dataset(job(dataset=str(parquet), **settings))

    as_json = tmp_path / "rows.json"
    as_json.write_text(json.dumps(records))  # one JSON array, not JSON Lines
    data.check_dataset(job(dataset=str(as_json)))
    assert len(data.load_records(job(dataset=str(as_json)), cache_dir=cache)) == 25

    folder = tmp_path / "folder"
    write_jsonl(records[:10], folder / "part-0.jsonl")
    write_jsonl(records[10:], folder / "part-1.jsonl")
    data.check_dataset(job(dataset=str(folder)))
    assert len(data.load_records(job(dataset=str(folder)), cache_dir=cache)) == 25

    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(records),
                          "test": datasets.Dataset.from_list(records[:3])}).save_to_disk(saved)
    data.check_dataset(job(dataset=str(saved), dataset_split="test"))
    assert len(data.load_records(job(dataset=str(saved), dataset_split="test"))) == 3


@pytest.mark.parametrize("path", ["/no/such/dir/train.jsonl", "./missing.parquet", "data/nested/missing"])
def test_missing_local_path_is_refused_naming_dataset(path, cache):
    for call in (lambda: data.check_dataset(job(dataset=path)),
                 lambda: data.load_records(job(dataset=path), cache_dir=cache)):
        with pytest.raises(JobSettingError) as info:
            call()
        assert info.value.field == "dataset" and "does not exist" in str(info.value)
        assert str(info.value).startswith("job.dataset: ")


@pytest.mark.parametrize("column_field", ["instruction_field", "response_field", "input_field"])
def test_missing_column_is_refused_naming_the_field(tmp_path, cache, column_field):
    jsonl = write_jsonl(make_arithmetic_records(5, seed=0), tmp_path / "d.jsonl")
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(make_arithmetic_records(5, seed=0)), parquet)
    for path in (jsonl, parquet):
        bad = job(dataset=str(path), **{column_field: "nope"})
        for call in (lambda b=bad: data.check_dataset(b), lambda b=bad: data.load_records(b, cache_dir=cache)):
            with pytest.raises(JobSettingError) as info:
                call()
            assert info.value.field == column_field
            assert "'nope'" in info.value.message and "['instruction', 'response']" in info.value.message


def test_bad_split_and_file_type_are_refused(tmp_path, cache):
    path = write_jsonl(make_arithmetic_records(5, seed=0), tmp_path / "d.jsonl")
    with pytest.raises(JobSettingError) as info:
        data.check_dataset(job(dataset=str(path), dataset_split="validation"))
    assert info.value.field == "dataset_split"
    with pytest.raises(JobSettingError) as info:
        data.load_records(job(dataset=str(path), dataset_split="validation"), cache_dir=cache)
    assert info.value.field == "dataset_split"
    odd = tmp_path / "d.txt"
    odd.write_text("hello")
    with pytest.raises(JobSettingError) as info:
        data.check_dataset(job(dataset=str(odd)))
    assert info.value.field == "dataset" and ".txt" in info.value.message


@pytest.mark.skipif(importlib.util.find_spec("s3fs") is not None, reason="s3fs installed: would reach S3")
def test_s3_without_s3fs_is_refused_before_any_worker(cache):
    settings = job(dataset="s3://some-bucket/sft/train.jsonl")
    for call in (lambda: data.check_dataset(settings), lambda: data.load_records(settings, cache_dir=cache)):
        with pytest.raises(JobSettingError) as info:
            call()
        assert info.value.field == "dataset" and "s3fs" in info.value.message


def test_remote_dataset_existence_check_on_a_real_fsspec_filesystem():
    """The driver's check for s3:// paths, run on fsspec's in-memory filesystem (same code path, no S3)."""
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe("/sft-check/train.jsonl", b'{"instruction": "1+1", "response": "2"}\n')
    data.check_remote_exists("memory://sft-check/train.jsonl")  # a file
    data.check_remote_exists("memory://sft-check")  # a prefix
    with pytest.raises(JobSettingError) as info:
        data.check_remote_exists("memory://sft-check/missing.jsonl")
    assert info.value.field == "dataset" and "does not exist" in info.value.message
    # A filesystem that cannot be reached from here (an unknown protocol stands in for missing
    # credentials or no network) is left to the workers, not refused.
    data.check_remote_exists("nosuchprotocol://bucket/key")


def test_hub_id_is_left_to_the_workers_when_offline(monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    data.check_dataset(job(dataset="yahma/alpaca-cleaned"))  # no network: nothing to check, no error


def test_extract_pairs_folds_input_and_skips_empty_responses():
    import datasets

    records = datasets.Dataset.from_list([
        {"instruction": "Translate", "input": "bonjour", "output": "hello"},
        {"instruction": "Say hi", "input": "", "output": "hi"},
        {"instruction": "Nothing", "input": "", "output": "  "},
        {"instruction": None, "input": "", "output": "x"},
    ])
    pairs = data.extract_pairs(job(response_field="output", input_field="input"), records)
    assert pairs == [("Translate\n\nbonjour", "hello"), ("Say hi", "hi")]


# ---- tokenization ----------------------------------------------------------------------------------


def test_tokenize_example_masks_exactly_the_prompt(tokenizer):
    ids, labels = data.tokenize_example(tokenizer, "What is 17 + 25?", "42", mask_prompt=True)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 17 + 25?"}], tokenize=False,
                                           add_generation_prompt=True)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert ids[: len(prompt_ids)] == prompt_ids  # the prompt is a true prefix
    assert labels[: len(prompt_ids)] == [IGNORE_INDEX] * len(prompt_ids)
    assert labels[len(prompt_ids):] == ids[len(prompt_ids):]
    assert tokenizer.decode(ids[len(prompt_ids):]) == "42<|im_end|>\n"
    assert tokenizer.decode(ids) == prompt + "42<|im_end|>\n"
    unmasked_ids, unmasked = data.tokenize_example(tokenizer, "What is 17 + 25?", "42", mask_prompt=False)
    assert unmasked_ids == ids and unmasked == ids


def test_tokenize_example_cuts_cleanly_when_bpe_merges_across_the_boundary(assets):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(assets.tokenizer_dir)
    # A template with no separator after the prompt: "Wh" + "at" tokenizes as one "What" token.
    tok.chat_template = ("{{ messages[0]['content'] }}"
                         "{% if not add_generation_prompt %}{{ messages[1]['content'] }}{% endif %}")
    naive = tok("What", add_special_tokens=False)["input_ids"]
    prompt_ids = tok("Wh", add_special_tokens=False)["input_ids"]
    assert naive[: len(prompt_ids)] != prompt_ids  # the case the fallback exists for
    ids, labels = data.tokenize_example(tok, "Wh", "at", mask_prompt=True)
    assert ids[: len(prompt_ids)] == prompt_ids and tok.decode(ids) == "What"
    assert labels[: len(prompt_ids)] == [IGNORE_INDEX] * len(prompt_ids)
    assert IGNORE_INDEX not in labels[len(prompt_ids):]

    tok.chat_template = "{% if add_generation_prompt %}A{% else %}B{% endif %}{{ messages[0]['content'] }}"
    with pytest.raises(JobSettingError) as info:
        data.tokenize_example(tok, "x", "y")
    assert info.value.field == "model"


# ---- packing ---------------------------------------------------------------------------------------


def _examples(lengths, prompt_lengths):
    """Examples whose token ids are all distinct (1, 2, 3, ...), the first `p` of each masked."""
    out, next_id = [], 1
    for length, p in zip(lengths, prompt_lengths, strict=True):
        ids = list(range(next_id, next_id + length))
        next_id += length
        out.append((ids, [IGNORE_INDEX] * p + ids[p:]))
    return out


def _segments(position_ids):
    """(start, end) of every run of positions 0, 1, 2, ... in one block."""
    starts = np.flatnonzero(position_ids == 0).tolist()
    return list(zip(starts, starts[1:] + [len(position_ids)], strict=True))


def test_pack_keeps_every_example_whole_in_one_block():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 40, size=80).tolist() + [48, 60]  # with EOS: two examples over seq_len
    prompts = [int(rng.integers(0, n + 1)) for n in lengths]  # includes fully masked examples
    examples = _examples(lengths, prompts)
    seq_len = 48
    packed = data.pack(examples, seq_len, EOS, pad_id=PAD)
    assert packed.input_ids.dtype == packed.labels.dtype == packed.position_ids.dtype == np.int64
    assert packed.input_ids.shape == packed.labels.shape == packed.position_ids.shape == (len(packed), seq_len)

    # Expected rows, built independently: the example, its EOS (labelled unless the example ended
    # masked), the first label ignored, cut at seq_len.
    expected = {}
    for ids, labs in examples:
        row_ids = ids + [EOS]
        row_labels = [IGNORE_INDEX] + labs[1:] + [EOS if labs[-1] != IGNORE_INDEX else IGNORE_INDEX]
        expected[ids[0]] = (row_ids[:seq_len], row_labels[:seq_len])
    found = {}
    for block in range(len(packed)):
        segments = _segments(packed.position_ids[block])
        for start, end in segments:
            ids = packed.input_ids[block, start:end].tolist()
            assert packed.position_ids[block, start:end].tolist() == list(range(end - start))
            if ids[0] == PAD:  # the padding: one run at the end, ignored
                assert (start, end) == segments[-1] and set(ids) == {PAD}
                assert set(packed.labels[block, start:end].tolist()) == {IGNORE_INDEX}
                continue
            assert ids[0] not in found  # no example twice, none split (a split's tail would start mid-example)
            found[ids[0]] = (ids, packed.labels[block, start:end].tolist())
    assert found == expected
    assert packed.num_examples == len(examples)
    assert (packed.truncated_examples, packed.truncated_tokens) == (2, (48 + 1 - 48) + (60 + 1 - 48))
    padding = int((packed.input_ids == PAD).sum())
    assert packed.padding_tokens == padding == packed.input_ids.size - sum(min(n + 1, seq_len) for n in lengths)
    assert packed.example_tokens == packed.input_ids.size - padding
    # Best fit: fewer blocks than one per example, and no two blocks could merge.
    used = sorted(seq_len - int((packed.input_ids[b] == PAD).sum()) for b in range(len(packed)))
    assert used[0] + used[1] > seq_len
    assert packed.fill > 0.9


def test_pack_is_deterministic_and_handles_edges():
    examples = _examples([3, 10, 2, 7], [1, 4, 0, 7])
    first, again = data.pack(examples, 12, EOS, pad_id=PAD), data.pack(examples, 12, EOS, pad_id=PAD)
    assert np.array_equal(first.input_ids, again.input_ids) and np.array_equal(first.labels, again.labels)
    # With EOS: 4, 11, 3, 8 tokens. Longest first: 11 opens block 0 (1 left), 8 opens block 1 (4 left),
    # 4 fills block 1 exactly, 3 fits nowhere and opens block 2.
    assert first.input_ids.tolist() == [
        list(range(4, 14)) + [EOS, PAD],
        list(range(16, 23)) + [EOS] + [1, 2, 3, EOS],
        [14, 15, EOS] + [PAD] * 9,
    ]
    assert first.labels.tolist() == [
        [IGNORE_INDEX] * 4 + list(range(8, 14)) + [EOS, IGNORE_INDEX],
        [IGNORE_INDEX] * 8 + [IGNORE_INDEX, 2, 3, EOS],  # a fully masked example: its EOS is not trained
        [IGNORE_INDEX, 15, EOS] + [IGNORE_INDEX] * 9,
    ]
    assert first.position_ids.tolist() == [list(range(11)) + [0], list(range(8)) + list(range(4)),
                                           list(range(3)) + list(range(9))]
    assert (first.padding_tokens, first.truncated_examples, first.trained_tokens) == (10, 0, 6 + 1 + 3 + 2)
    empty = data.pack([], 8, EOS)
    assert empty.input_ids.shape == empty.position_ids.shape == (0, 8) and empty.fill == 0
    with pytest.raises(JobSettingError) as info:
        data.pack(_examples([2], [0]), 0, EOS)
    assert info.value.field == "seq_len"


def test_best_fit_decreasing_places_each_item_in_the_fullest_bin_it_fits():
    assert data.best_fit_decreasing([], 10) == []
    # Longest first: 6 opens bin 0 (4 left); 5 opens bin 1 (5 left); 4 fills bin 0; 3 into bin 1
    # (2 left); the first 2 fills bin 1; the second 2 opens bin 2.
    assert data.best_fit_decreasing([3, 6, 2, 5, 4, 2], 10) == [[1, 4], [3, 0, 2], [5]]
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 100, size=2000).tolist()
    bins = data.best_fit_decreasing(lengths, 100)
    assert sorted(i for b in bins for i in b) == list(range(2000))
    loads = [sum(lengths[i] for i in b) for b in bins]
    assert max(loads) <= 100 and len(bins) <= 1.02 * sum(lengths) / 100 + 2
    with pytest.raises(ValueError):
        data.best_fit_decreasing([11], 10)


@pytest.mark.slow
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_examples_give_the_logits_they_give_alone(attn):
    """transformers 5 masks packed examples from restarting position_ids: each one sees only itself.

    A tiny random Qwen2 runs a packed micro-batch once; every example (and the padding) run alone
    must give the same logits. Run without position_ids (plain causal attention over the block)
    they differ, so the test can fail.
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         attn_implementation=attn)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    rng = np.random.default_rng(2)
    examples = [(ids, ids) for ids in (rng.integers(3, 64, n).tolist() for n in [5, 9, 3, 12, 7, 2, 19, 1])]
    packed = data.pack(examples, 24, eos_id=1, pad_id=2)
    assert len(packed) == 3 and packed.padding_tokens > 0
    batch = data.make_batch(packed.input_ids, packed.labels, packed.position_ids)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
        plain = model(input_ids=batch["input_ids"], use_cache=False).logits
        checked = 0
        for block in range(len(packed)):
            for start, end in _segments(packed.position_ids[block]):
                alone = model(input_ids=batch["input_ids"][block:block + 1, start:end], use_cache=False).logits[0]
                torch.testing.assert_close(logits[block, start:end], alone, rtol=1e-5, atol=1e-5)
                checked += end - start
        assert checked == packed.input_ids.size
        assert not torch.allclose(plain, logits, atol=1e-3)
        # The loss the trainer computes is the sum of the examples' own losses.
        from workloads.fsdp_finetune.loss import loss_sum

        total = loss_sum(model, batch["input_ids"], batch["labels"], position_ids=batch["position_ids"])
        alone_sum = 0.0
        for ids, labels in examples:
            row = torch.tensor([ids + [1]])
            alone_sum += float(loss_sum(model, row, torch.tensor([labels + [1]])))
        assert float(total) == pytest.approx(alone_sum, rel=1e-5)


@pytest.mark.slow
def test_flash_varlen_arguments_reach_every_layer_and_keep_examples_apart():
    """The flash path without flash-attn (no GPU here): a registered attention kernel that does what
    `flash_attn_varlen_func` does with the arguments it is given (causal attention inside each
    `cu_seq_lens` span of the flattened batch) gets them in every layer, from `ShardedBatches`
    through `to_device` and `loss_sum`, and the packed loss is the sum of the examples' own losses.
    """
    import torch
    import torch.nn.functional as F
    from transformers import AttentionInterface, Qwen2Config, Qwen2ForCausalLM

    from workloads.fsdp_finetune.loss import loss_sum

    calls = []

    def varlen_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        cu, longest = kwargs["cu_seq_lens_q"], kwargs["max_length_q"]
        assert isinstance(longest, int) and attention_mask is None
        calls.append(cu.tolist())
        batch, heads, seq, dim = query.shape
        groups = heads // key.shape[1]
        q = query.transpose(1, 2).reshape(batch * seq, heads, dim)
        k = key.repeat_interleave(groups, dim=1).transpose(1, 2).reshape(batch * seq, heads, dim)
        v = value.repeat_interleave(groups, dim=1).transpose(1, 2).reshape(batch * seq, heads, dim)
        out = torch.empty_like(q)
        bounds = cu.tolist()
        for start, end in zip(bounds, bounds[1:], strict=False):
            span = [t[start:end].transpose(0, 1) for t in (q, k, v)]
            out[start:end] = F.scaled_dot_product_attention(*span, is_causal=True, scale=scaling).transpose(0, 1)
        return out.reshape(batch, seq, heads, dim), None

    AttentionInterface.register("test_varlen", varlen_attention)
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    rng = np.random.default_rng(3)
    examples = [(ids, ids) for ids in (rng.integers(3, 64, n).tolist() for n in [6, 9, 3, 12, 7, 2, 19, 4])]
    packed = data.pack(examples, 24, eos_id=1, pad_id=2)
    batches = data.ShardedBatches(packed, rank=0, world_size=1, micro_batch_size=len(packed), seed=0, varlen=True)
    inputs = data.to_device(next(iter(batches)), torch.device("cpu"))
    with torch.no_grad():
        alone = sum(float(loss_sum(model, torch.tensor([ids + [1]]), torch.tensor([ids + [1]])))
                    for ids, _ in examples)
        model.set_attn_implementation("test_varlen")
        total = loss_sum(model, inputs.pop("input_ids"), inputs.pop("labels"), **inputs)
    assert len(calls) == config.num_hidden_layers and calls[0] == inputs["cu_seq_lens_q"].tolist()
    assert len(calls[0]) == int((packed.position_ids == 0).sum()) + 1  # a span per example and padding run
    assert float(total) == pytest.approx(alone, rel=1e-5)


def test_varlen_kwargs_are_cumulative_sequence_lengths_over_the_flattened_batch():
    positions = np.array([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]])
    kwargs = data.varlen_kwargs(positions)
    assert kwargs["cu_seq_lens_q"].tolist() == [0, 3, 5, 6, 10, 12]
    assert str(kwargs["cu_seq_lens_q"].dtype) == "torch.int32"
    assert kwargs["cu_seq_lens_k"] is kwargs["cu_seq_lens_q"]
    assert kwargs["max_length_q"] == kwargs["max_length_k"] == 4 and isinstance(kwargs["max_length_q"], int)
    batch = data.make_batch(positions, positions, positions, varlen=True)
    assert set(batch) == {"input_ids", "labels", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k",
                          "max_length_q", "max_length_k"}
    assert set(data.make_batch(positions, positions, positions)) == {"input_ids", "labels", "position_ids"}
    assert data.uses_varlen("flash_attention_2") and data.uses_varlen("flash_attention_3")
    assert not data.uses_varlen("sdpa") and not data.uses_varlen("eager")


def test_build_datasets_splits_deterministically_and_packs(assets, tokenizer, cache):
    settings = job(dataset=str(assets.dataset_path), eval_fraction=0.05, seq_len=64)
    train, held_out = data.build_datasets(settings, tokenizer, cache_dir=cache)
    again_train, again_held_out = data.build_datasets(settings, tokenizer, cache_dir=cache)
    assert held_out == again_held_out and np.array_equal(train.input_ids, again_train.input_ids)
    assert len(held_out) == 20 and set(held_out[0]) == {"instruction", "response"}
    assert train.num_examples == 380 and train.seq_len == 64 and len(train) == train.input_ids.shape[0]
    assert train.truncated_examples == 0 and train.fill > 0.9
    assert train.trained_tokens < train.example_tokens  # prompts masked
    # One EOS after each example; the padding is the pad token, which is EOS here too.
    assert tokenizer.pad_token_id == tokenizer.eos_token_id
    eos_count = int((train.input_ids == tokenizer.eos_token_id).sum())
    assert eos_count == train.num_examples + train.padding_tokens

    other_train, other_held_out = data.build_datasets(job(dataset=str(assets.dataset_path), seed=8), tokenizer,
                                                      cache_dir=cache)
    assert other_held_out != held_out  # the split follows the seed
    tiny = job(dataset=str(assets.dataset_path), eval_fraction=0.001)
    assert len(data.build_datasets(tiny, tokenizer, cache_dir=cache)[1]) == 1  # at least one held out
    none = job(dataset=str(assets.dataset_path), eval_fraction=0.0)
    assert data.build_datasets(none, tokenizer, cache_dir=cache)[1] == []

    short, _ = data.build_datasets(job(dataset=str(assets.dataset_path), seq_len=12), tokenizer, cache_dir=cache)
    assert short.truncated_examples == short.num_examples == len(short) == 380  # each prompt alone is longer
    assert short.truncated_tokens == train.example_tokens - 380 * 12 and short.padding_tokens == 0


# ---- epochs ----------------------------------------------------------------------------------------


def test_dataset_epochs_counts_formatted_tokens_and_warns_above_the_threshold(assets, tokenizer, capsys):
    settings = job(dataset=str(assets.dataset_path), seq_len=64, micro_batch_size=2, global_batch_size=8,
                   max_steps=80, max_epochs_warning=3)
    # The count by hand: the training split's conversations, rendered and tokenized, one EOS each.
    pairs = [(r["instruction"], r["response"]) for r in map(json.loads, assets.dataset_path.read_text().splitlines())]
    train_pairs, _ = data.split_pairs(pairs, seed=settings.seed, eval_fraction=settings.eval_fraction)
    tokens = sum(len(tokenizer(data.render_chat(tokenizer, i, r), add_special_tokens=False)["input_ids"]) + 1
                 for i, r in train_pairs)
    blocks = len(data.build_datasets(settings, tokenizer)[0])
    epochs = 80 * 8 / (blocks // 4 * 4)  # world size 2 x micro-batch 2: whole rounds of 4 blocks per epoch
    assert 3 < epochs < 20

    assert data.dataset_epochs(settings, world_size=2, tokenizer=tokenizer) == pytest.approx(epochs)
    out, err = capsys.readouterr()
    assert f"{len(train_pairs):,} training examples, {tokens:,} tokens after formatting" in out
    assert f"{blocks:,} blocks of 64" in out and f"= {epochs:.2f} epochs" in out
    assert "warning: job.max_steps=80 trains" in err and "job.max_epochs_warning=3" in err

    calm = settings.model_copy(update={"max_epochs_warning": epochs + 0.01})
    assert data.dataset_epochs(calm, world_size=2, tokenizer=tokenizer) == pytest.approx(epochs)
    assert "warning" not in capsys.readouterr().err
    # Not on this machine: `workloads.check` skips it; nothing is read or printed.
    assert data.dataset_epochs(job(dataset="yahma/alpaca-cleaned"), world_size=2, local_only=True) is None
    assert capsys.readouterr() == ("", "")


def test_workloads_check_shows_the_epochs_of_a_local_dataset(assets, tmp_path, capsys):
    from tests.helpers import write_variant
    from workloads.check import main as check_main

    path = write_variant(tmp_path, {"job": {"model": str(assets.model_dir), "dataset": str(assets.dataset_path),
                                            "instruction_field": "instruction", "response_field": "response",
                                            "input_field": None,
                                            "seq_len": 64, "max_steps": 30, "warmup_steps": 2}})
    assert check_main([str(path)]) == 0
    out, err = capsys.readouterr()
    assert "world size 8" in out and "tokens after formatting" in out
    # 30 steps x 64 blocks on a few hundred blocks (world size 8 x micro-batch 4 per round): several epochs.
    assert "epochs" in out.splitlines()[-1] and "job.max_epochs_warning=3" in err


# ---- sharding --------------------------------------------------------------------------------------


def _packed(n_blocks: int, seq_len: int = 4) -> data.PackedDataset:
    # Row i holds the value i everywhere, so a batch's rows say which blocks it holds.
    ids = np.repeat(np.arange(n_blocks, dtype=np.int64)[:, None], seq_len, axis=1)
    return data.PackedDataset(ids, ids.copy())


def _rows(batch) -> list[int]:
    assert batch["input_ids"].dtype.is_floating_point is False
    assert (batch["input_ids"] == batch["labels"]).all()
    return batch["input_ids"][:, 0].tolist()


def _take(loader, n):
    it = iter(loader)
    return [_rows(next(it)) for _ in range(n)]


def test_shards_are_disjoint_equal_and_cover_the_epoch_minus_remainder():
    dataset = _packed(103)
    world, mb = 4, 3
    loaders = [data.ShardedBatches(dataset, rank=r, world_size=world, micro_batch_size=mb, seed=1)
               for r in range(world)]
    bpe = loaders[0].batches_per_epoch
    assert bpe == 103 // world // mb == 8
    shards = [[row for batch in _take(loader, bpe) for row in batch] for loader in loaders]
    assert all(len(s) == bpe * mb for s in shards)
    seen = [row for s in shards for row in s]
    assert len(set(seen)) == len(seen) == world * bpe * mb  # disjoint
    order = np.random.default_rng([1, 0]).permutation(103)
    assert set(seen) == set(order[: world * bpe * mb].tolist())  # exactly the epoch minus its remainder
    batch = next(iter(loaders[0]))
    assert batch["input_ids"].shape == (mb, 4) and str(batch["input_ids"].dtype) == "torch.int64"


def test_shuffle_is_deterministic_by_seed_and_differs_by_epoch():
    dataset = _packed(64)
    make = lambda seed: data.ShardedBatches(dataset, rank=1, world_size=2, micro_batch_size=4, seed=seed)
    bpe = make(0).batches_per_epoch
    run = _take(make(0), 3 * bpe)  # epochs continue past the end
    assert run == _take(make(0), 3 * bpe)
    epochs = [sorted(sum(run[e * bpe:(e + 1) * bpe], [])) != sum(run[e * bpe:(e + 1) * bpe], []) for e in range(3)]
    assert all(epochs)  # each epoch is shuffled
    assert run[:bpe] != run[bpe:2 * bpe] != run[2 * bpe:]
    assert sorted(sum(run[:bpe], [])) != sorted(sum(run[bpe:2 * bpe], []))  # a rank's share changes too
    assert _take(make(1), bpe) != run[:bpe]


@pytest.mark.parametrize("consumed", [0, 1, 5, 7, 8, 13])
def test_resume_from_state_dict_yields_exactly_the_remaining_batches(consumed):
    dataset = _packed(70)
    make = lambda: data.ShardedBatches(dataset, rank=0, world_size=2, micro_batch_size=4, seed=3)
    reference = _take(make(), 24)  # 8 per epoch: the cases cross epoch boundaries
    first = make()
    it = iter(first)
    for _ in range(consumed):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))  # survives a checkpoint's serialisation
    assert set(state) == {"epoch", "position"}
    resumed = make()
    resumed.load_state_dict(state)
    assert _take(resumed, 24 - consumed) == reference[consumed:]
    assert first.state_dict() == {"epoch": consumed // 8, "position": consumed % 8}


def test_sharding_refuses_what_cannot_be_split():
    with pytest.raises(JobSettingError) as info:
        data.ShardedBatches(_packed(7), rank=0, world_size=4, micro_batch_size=2, seed=0)
    assert info.value.field == "micro_batch_size" and "7 packed blocks" in info.value.message
    with pytest.raises(ValueError):
        data.ShardedBatches(_packed(8), rank=2, world_size=2, micro_batch_size=1, seed=0)
    loader = data.ShardedBatches(_packed(8), rank=0, world_size=2, micro_batch_size=1, seed=0)
    with pytest.raises(ValueError):
        loader.load_state_dict({"epoch": 0, "position": 9})


# ---- evaluation ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_evaluate_scores_a_real_model(assets, tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    from workloads.fsdp_finetune.evaluate import evaluate

    model = AutoModelForCausalLM.from_pretrained(assets.model_dir)
    model.train()
    records = assets.eval_records[:6]
    result = evaluate(model, tokenizer, records, max_new_tokens=4)
    assert model.training  # mode restored
    assert result["count"] == 6 and 0.0 <= result["exact_match"] <= 1.0 and np.isfinite(result["loss"])

    # The loss is the mean response-token loss: the same number HF computes for one example.
    one = evaluate(model, tokenizer, records[:1], max_new_tokens=1)
    ids, labels = data.tokenize_example(tokenizer, records[0]["instruction"], records[0]["response"])
    model.eval()
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([ids]), labels=torch.tensor([labels])).loss.item()
    assert one["loss"] == pytest.approx(expected, rel=1e-4)

    # Exact match compares the greedy answer: references equal to the model's own answers score 1.
    mimic = [{"q": s["instruction"], "a": f" {s['answer']} "} for s in result["samples"]]
    assert evaluate(model, tokenizer, mimic, instruction_field="q", response_field="a",
                    max_new_tokens=4)["exact_match"] == 1.0
    assert evaluate(model, tokenizer, [{"instruction": "1 + 1 = ?", "response": "never the answer"}],
                    max_new_tokens=4)["exact_match"] == 0.0
