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


def test_pack_loses_and_duplicates_no_token_and_keeps_labels_aligned():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 40, size=60).tolist()
    prompts = [int(rng.integers(0, n + 1)) for n in lengths]  # includes fully masked examples
    examples = _examples(lengths, prompts)
    seq_len = 32
    input_ids, labels = data.pack(examples, seq_len, EOS)
    assert input_ids.dtype == np.int64 and labels.dtype == np.int64
    assert input_ids.shape == labels.shape == (input_ids.shape[0], seq_len)

    # The expected stream, built independently: each example then its EOS, EOS labelled unless
    # the example ended masked.
    stream_ids, stream_labels = [], []
    for ids, labs in examples:
        stream_ids += ids + [EOS]
        stream_labels += labs + [EOS if labs[-1] != IGNORE_INDEX else IGNORE_INDEX]
    total = len(stream_ids)
    assert input_ids.shape[0] == total // seq_len  # only the partial tail block is dropped
    assert input_ids.ravel().tolist() == stream_ids[: input_ids.size]
    assert labels.ravel().tolist() == stream_labels[: labels.size]

    kept = input_ids.ravel()
    tokens = kept[kept != EOS]
    assert len(np.unique(tokens)) == len(tokens)  # nothing duplicated
    assert set(tokens.tolist()) == set(range(1, int(tokens.max()) + 1))  # nothing skipped before the tail
    # Labels: a token is trained iff it is not in its example's prompt, i.e. label == id or IGNORE.
    flat_labels = labels.ravel()
    assert np.all((flat_labels == kept) | (flat_labels == IGNORE_INDEX))
    masked = {tok for (ids, _), p in zip(examples, prompts, strict=True) for tok in ids[:p]}
    for token, label in zip(kept.tolist(), flat_labels.tolist(), strict=True):
        if token != EOS:
            assert (label == IGNORE_INDEX) == (token in masked)


def test_pack_puts_eos_between_examples_and_spans_blocks():
    examples = _examples([3, 10, 2], [1, 4, 0])
    input_ids, labels = data.pack(examples, 4, EOS)
    # 3 + 1 + 10 + 1 + 2 + 1 = 18 tokens -> 4 blocks of 4, 2 dropped (the last example's tail).
    assert input_ids.tolist() == [[1, 2, 3, EOS], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, EOS, 14]]
    assert labels.tolist() == [[-100, 2, 3, EOS], [-100, -100, -100, -100], [8, 9, 10, 11], [12, 13, EOS, 14]]


def test_pack_edge_cases():
    ids, labels = data.pack([], 8, EOS)
    assert ids.shape == labels.shape == (0, 8)
    ids, labels = data.pack(_examples([2], [2]), 3, EOS)  # a fully masked example: its EOS is not trained
    assert ids.tolist() == [[1, 2, EOS]] and labels.tolist() == [[-100, -100, -100]]
    with pytest.raises(JobSettingError) as info:
        data.pack(_examples([2], [0]), 0, EOS)
    assert info.value.field == "seq_len"


def test_build_datasets_splits_deterministically_and_packs(assets, tokenizer, cache):
    settings = job(dataset=str(assets.dataset_path), eval_fraction=0.05, seq_len=64)
    train, held_out = data.build_datasets(settings, tokenizer, cache_dir=cache)
    again_train, again_held_out = data.build_datasets(settings, tokenizer, cache_dir=cache)
    assert held_out == again_held_out and np.array_equal(train.input_ids, again_train.input_ids)
    assert len(held_out) == 20 and set(held_out[0]) == {"instruction", "response"}
    assert train.num_examples == 380 and train.seq_len == 64 and len(train) == train.input_ids.shape[0]
    assert 0 <= train.dropped_tokens < 64
    assert train.trained_tokens < train.input_ids.size  # prompts masked
    # One EOS per example, except those in the dropped tail (examples here are > 10 tokens).
    eos_count = int((train.input_ids == tokenizer.eos_token_id).sum())
    assert train.num_examples - train.dropped_tokens // 10 - 1 <= eos_count <= train.num_examples

    other_train, other_held_out = data.build_datasets(job(dataset=str(assets.dataset_path), seed=8), tokenizer,
                                                      cache_dir=cache)
    assert other_held_out != held_out  # the split follows the seed
    tiny = job(dataset=str(assets.dataset_path), eval_fraction=0.001)
    assert len(data.build_datasets(tiny, tokenizer, cache_dir=cache)[1]) == 1  # at least one held out
    none = job(dataset=str(assets.dataset_path), eval_fraction=0.0)
    assert data.build_datasets(none, tokenizer, cache_dir=cache)[1] == []

    with pytest.raises(JobSettingError) as info:
        data.build_datasets(job(dataset=str(assets.dataset_path), seq_len=10**6), tokenizer, cache_dir=cache)
    assert info.value.field == "seq_len"


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
