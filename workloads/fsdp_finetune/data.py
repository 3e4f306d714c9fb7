"""The data path of the fine-tuning job: load, check, format, tokenize, pack, shard.

`datasets.load_dataset` reads a Hugging Face hub id, a local directory, an `s3://` path, or a
JSONL/JSON/Parquet/CSV file. Each row's instruction and response (columns named in the variable
file) are rendered with the tokenizer's chat template, tokenized, and packed whole into `seq_len`
blocks by best fit (`pack`: EOS after each example, `position_ids` restarting at each one, so
attention stays inside an example; the rest of a block is ignored padding); prompt tokens can be
masked from the loss. `dataset_epochs` counts the formatted tokens and the epochs `max_steps`
implies, for the driver and `config check`. `ShardedBatches`
gives each rank a disjoint shard of a per-epoch shuffle that depends only on (seed, epoch), and its
position is a two-integer state that goes into the checkpoint, so a resumed run continues at
exactly the next micro-batch.

Bad settings raise `JobSettingError` naming the `job.<field>` to fix; `check_dataset` runs the
cheap checks in the driver before any worker starts.
"""

from __future__ import annotations

import csv
import json
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

IGNORE_INDEX = -100
"""Label value that `torch.nn.functional.cross_entropy` (and HF causal LMs) skip."""

# File suffix -> `datasets` packaged builder that reads it.
FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}

# Remote filesystems `datasets` reaches through fsspec (s3 needs `s3fs` in the image).
_REMOTE_PREFIXES = ("s3://",)


class JobSettingError(ValueError):
    """A job setting that cannot work; `str()` is `job.<field>: <message>`, naming what to fix."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"job.{field}: {message}")

    def __reduce__(self):
        # Raised on a Ray worker and unpickled in the driver: rebuild from both arguments.
        return type(self), (self.field, self.message)


# ---- locating and loading ----------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    kind: str  # "file", "saved" (save_to_disk dir), "dir", "s3", "hub"
    location: str


def _classify(dataset: str) -> _Source:
    """Decide how `job.dataset` is read; raise for a local path that is not there."""
    if dataset.startswith(_REMOTE_PREFIXES):
        return _Source("s3", dataset.rstrip("/"))
    raw = dataset[len("file://"):] if dataset.startswith("file://") else dataset
    path = Path(raw).expanduser()
    if path.is_file():
        if path.suffix.lower() not in FILE_BUILDERS:
            raise JobSettingError("dataset", f"{raw}: unsupported file type '{path.suffix}'; "
                                  f"use one of {sorted(FILE_BUILDERS)}, a directory, a hub id or an s3:// path")
        return _Source("file", str(path))
    if path.is_dir():
        saved = (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()
        return _Source("saved" if saved else "dir", str(path))
    # Not on disk. A hub id is `name` or `owner/name`; anything else shaped like a path is a
    # local path that is missing, and saying so beats a confusing hub lookup error.
    looks_local = (
        dataset.startswith(("/", "./", "../", "~", "file://"))
        or path.suffix.lower() in FILE_BUILDERS
        or raw.count("/") > 1
        or os.sep != "/" and os.sep in raw
    )
    if looks_local:
        raise JobSettingError("dataset", f"local path {raw} does not exist; check the path (relative paths "
                              f"are resolved from {Path.cwd()})")
    return _Source("hub", dataset)


def _require_s3fs(dataset: str) -> None:
    import importlib.util

    # fsspec resolves s3:// through s3fs; without it `datasets` fails deep inside with an
    # ImportError on every worker, so say what to install before anything starts.
    if importlib.util.find_spec("s3fs") is None:
        raise JobSettingError("dataset", f"{dataset}: reading s3:// needs the s3fs package; add \"s3fs\" to "
                              "ray.extra_pip_packages (or install it in the image)")


def _builder_for(location: str) -> str | None:
    return FILE_BUILDERS.get(Path(location.split("?", 1)[0]).suffix.lower())


def _s3_data_files(prefix: str) -> tuple[str, list[str]]:
    """Data files under an s3:// prefix, all of the most common supported type, and their builder."""
    import fsspec  # a dependency of `datasets`; the s3 protocol needs `s3fs`

    fs, _, _ = fsspec.get_fs_token_paths(prefix)
    found = [p for p in fs.find(prefix) if _builder_for(p)]
    if not found:
        raise JobSettingError("dataset", f"no {sorted(FILE_BUILDERS)} files under {prefix}")
    by_builder: dict[str, list[str]] = {}
    for p in sorted(found):
        by_builder.setdefault(_builder_for(p), []).append(f"s3://{p}" if not p.startswith("s3://") else p)
    builder = max(by_builder, key=lambda b: len(by_builder[b]))
    return builder, by_builder[builder]


def _required_columns(job) -> dict[str, str]:
    """Column names the job reads, by the job field that names them."""
    columns = {"instruction_field": job.instruction_field, "response_field": job.response_field}
    input_field = getattr(job, "input_field", None)
    if input_field:
        columns["input_field"] = input_field
    return columns


def _check_columns(job, found: Sequence[str], where: str) -> None:
    found = list(found)
    for job_field, column in _required_columns(job).items():
        if column not in found:
            raise JobSettingError(job_field, f"column '{column}' is not in {where}; columns found: {found}")


def _split_error(job, exc: Exception) -> JobSettingError | None:
    text = str(exc)
    if "split" in text.lower() and ("unknown" in text.lower() or "should be one of" in text.lower()):
        return JobSettingError("dataset_split", f"'{job.dataset_split}' is not a split of {job.dataset}: {text}")
    return None


def load_records(job, *, cache_dir: str | os.PathLike | None = None):
    """Load split `job.dataset_split` of `job.dataset` as a `datasets.Dataset` and check its columns.

    `job.dataset` may be a hub id, a local directory (data files or a `save_to_disk` directory),
    an `s3://` file or prefix (read through fsspec; credentials come from the environment, e.g. EKS
    Pod Identity), or a `.jsonl`/`.json`/`.parquet`/`.csv` file. A single file or an s3 prefix has
    one split, `train` (slices such as `train[:1000]` work). `cache_dir` overrides the `datasets`
    cache (the Arrow copy of file data goes there).
    """
    import datasets

    source = _classify(job.dataset)
    split = job.dataset_split
    kwargs: dict[str, Any] = {"cache_dir": str(cache_dir) if cache_dir else None}
    try:
        if source.kind == "file":
            ds = datasets.load_dataset(_builder_for(source.location), data_files=source.location, split=split,
                                       **kwargs)
        elif source.kind == "saved":
            ds = _select_split(datasets.load_from_disk(source.location), split, job)
        elif source.kind == "s3":
            _require_s3fs(job.dataset)
            builder = _builder_for(source.location)
            files: str | list[str] = source.location
            if builder is None:
                builder, files = _s3_data_files(source.location)
            ds = datasets.load_dataset(builder, data_files=files, split=split, **kwargs)
        else:  # local directory of data files, or hub id
            ds = datasets.load_dataset(source.location, split=split, **kwargs)
    except JobSettingError:
        raise
    except FileNotFoundError as exc:
        raise JobSettingError("dataset", f"{job.dataset} not found: {exc}") from exc
    except ValueError as exc:
        err = _split_error(job, exc)
        if err is not None:
            raise err from exc
        raise
    if isinstance(ds, datasets.DatasetDict):  # defensive: a split=None-like result
        raise JobSettingError("dataset_split", f"'{split}' selected several splits of {job.dataset}")
    _check_columns(job, ds.column_names, job.dataset)
    return ds


def _file_columns(path: Path) -> list[str]:
    """Column names of a local data file, reading only its head (schema for Parquet)."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    if suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as fh:
            return next(csv.reader(fh), [])
    # JSON Lines, or a JSON document (list of rows, or a dict of columns).
    with path.open(encoding="utf-8") as fh:
        first = ""
        for line in fh:
            if line.strip():
                first = line
                break
    if not first:
        raise JobSettingError("dataset", f"{path} is empty")
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        row = None
    if isinstance(row, dict):
        return list(row)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise JobSettingError("dataset", f"{path} is neither JSON Lines nor JSON: {exc}") from None
    if isinstance(document, list) and document and isinstance(document[0], dict):
        return list(document[0])
    if isinstance(document, dict):
        return list(document)
    raise JobSettingError("dataset", f"{path} holds no rows (expected objects, one per line)")


def check_dataset(job) -> None:
    """Cheap pre-flight for the driver: the dataset exists and has the named columns.

    Local files are checked from their first row (the schema for Parquet), a `save_to_disk`
    directory from its memory-mapped table, a directory of data files from its first file, and a
    hub id from its published features when online. An s3:// path is checked for existence (its
    columns are left to the workers). Raises `JobSettingError` naming the field.
    """
    source = _classify(job.dataset)  # raises for a missing local path
    split_base = job.dataset_split.split("[", 1)[0]
    if source.kind == "file":
        if split_base != "train":
            raise JobSettingError("dataset_split", f"'{job.dataset_split}': a single file has one split, 'train'")
        _check_columns(job, _file_columns(Path(source.location)), job.dataset)
    elif source.kind == "saved":
        import datasets

        loaded = _select_split(datasets.load_from_disk(source.location), split_base, job)
        _check_columns(job, loaded.column_names, job.dataset)
    elif source.kind == "dir":
        files = sorted(p for p in Path(source.location).rglob("*") if p.is_file() and _builder_for(p.name))
        if not files:
            raise JobSettingError("dataset", f"{job.dataset} holds no {sorted(FILE_BUILDERS)} files")
        _check_columns(job, _file_columns(files[0]), str(files[0]))
    elif source.kind == "hub":
        _check_hub_dataset(job, split_base)
    else:
        _require_s3fs(job.dataset)
        check_remote_exists(source.location)
        log.info("dataset %s: s3 path, columns are checked by the workers", job.dataset)


def check_remote_exists(location: str) -> None:
    """Raise `JobSettingError('dataset')` when a remote (fsspec) path such as `s3://...` is not there.

    The driver runs with the same credentials as the workers (EKS Pod Identity), so a typo in the
    bucket or prefix is caught before any worker starts. Anything other than a clear "not there"
    (no credentials on this machine, no network) is logged and left to the workers.
    """
    try:
        import fsspec

        fs, path = fsspec.core.url_to_fs(location)
        exists = fs.exists(path)
    except Exception as exc:  # noqa: BLE001 - offline or no credentials: the workers will see
        log.warning("dataset %s: could not check that it exists (%s); the workers will", location, exc)
        return
    if not exists:
        raise JobSettingError("dataset", f"{location} does not exist (no such object or prefix); check the "
                              "bucket and path")


def _select_split(loaded, split: str, job):
    """The `split` of a `load_from_disk` result (a `DatasetDict` has several; a `Dataset` is one)."""
    import datasets

    if not isinstance(loaded, datasets.DatasetDict):
        return loaded
    if split not in loaded:
        raise JobSettingError("dataset_split", f"'{job.dataset_split}' is not a split of {job.dataset}; "
                              f"splits: {sorted(loaded)}")
    return loaded[split]


def _check_hub_dataset(job, split_base: str) -> None:
    import datasets

    if datasets.config.HF_HUB_OFFLINE:
        log.info("dataset %s: offline, hub dataset not checked", job.dataset)
        return
    try:
        builder = datasets.load_dataset_builder(job.dataset)
    except datasets.exceptions.DatasetNotFoundError as exc:
        raise JobSettingError("dataset", f"'{job.dataset}' is neither a local path nor a dataset on the hub "
                              f"({exc})") from None
    except Exception as exc:  # noqa: BLE001 - network trouble must not block a run the workers may manage
        log.warning("dataset %s: could not check on the hub (%s); the workers will", job.dataset, exc)
        return
    info = builder.info
    if info.splits and split_base not in info.splits:
        raise JobSettingError("dataset_split", f"'{job.dataset_split}' is not a split of {job.dataset}; "
                              f"splits: {sorted(info.splits)}")
    if info.features is not None:
        _check_columns(job, list(info.features), job.dataset)


# ---- formatting and tokenization ------------------------------------------------------------


def render_chat(tokenizer, instruction: str, response: str | None) -> str:
    """The chat-template text of one turn; with `response=None`, the prompt the model answers (training and eval)."""
    messages = [{"role": "user", "content": instruction}]
    if response is None:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    messages.append({"role": "assistant", "content": response})
    return tokenizer.apply_chat_template(messages, tokenize=False)


def tokenize_examples(
    tokenizer, pairs: Sequence[tuple[str, str]], *, mask_prompt: bool = True
) -> list[tuple[list[int], list[int]]]:
    """`tokenize_example` for many (instruction, response) pairs, tokenizing in one batched call."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise JobSettingError("model", "the tokenizer has no chat_template; use a model whose tokenizer has one")
    prompts = [render_chat(tokenizer, i, None) for i, _ in pairs]
    fulls = [render_chat(tokenizer, i, r) for i, r in pairs]
    # The template already writes any BOS/special tokens as text: add none on top.
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"] if pairs else []
    full_ids = tokenizer(fulls, add_special_tokens=False)["input_ids"] if pairs else []
    out = []
    for prompt_text, full_text, p_ids, f_ids in zip(prompts, fulls, prompt_ids, full_ids, strict=True):
        p_ids, f_ids = list(p_ids), list(f_ids)
        if f_ids[: len(p_ids)] != p_ids:
            # The prompt's last token merged with the response's first (BPE across the boundary).
            # Masking needs a clean cut, so tokenize the response text on its own after the prompt.
            if not full_text.startswith(prompt_text):
                raise JobSettingError("model", "the chat template renders the user turn differently with and "
                                      "without the assistant's reply, so the prompt cannot be masked")
            f_ids = p_ids + list(tokenizer(full_text[len(prompt_text):], add_special_tokens=False)["input_ids"])
        labels = list(f_ids)
        if mask_prompt:
            labels[: len(p_ids)] = [IGNORE_INDEX] * len(p_ids)
        out.append((f_ids, labels))
    return out


def tokenize_example(tokenizer, instruction: str, response: str, *, mask_prompt: bool = True
                     ) -> tuple[list[int], list[int]]:
    """Token ids and labels of one conversation (user = `instruction`, assistant = `response`).

    Rendered with the tokenizer's chat template. `labels` is a copy of `ids`, with the prompt
    (everything up to and including the assistant header) set to `IGNORE_INDEX` when
    `mask_prompt`. The prompt tokens are guaranteed to be a prefix of `ids`.
    """
    return tokenize_examples(tokenizer, [(instruction, response)], mask_prompt=mask_prompt)[0]


# ---- packing -------------------------------------------------------------------------------------


@dataclass
class PackedDataset:
    """Packed training blocks: `input_ids`, `labels` and `position_ids`, int64 arrays of shape `[N, seq_len]`.

    Without `position_ids`, every block is one sequence (positions 0..seq_len-1).
    """

    input_ids: np.ndarray
    labels: np.ndarray
    position_ids: np.ndarray | None = None
    num_examples: int = 0
    """Examples packed into the blocks."""
    truncated_examples: int = 0
    """Examples longer than `seq_len` (EOS included), cut to their first `seq_len` tokens."""
    truncated_tokens: int = 0
    """Tokens those cuts removed."""
    padding_tokens: int = 0
    """Positions filled with padding (ignored labels) after the last example of a block."""

    def __post_init__(self):
        if self.input_ids.shape != self.labels.shape or self.input_ids.ndim != 2:
            raise ValueError(f"input_ids {self.input_ids.shape} and labels {self.labels.shape} must be equal [N, seq]")
        if self.position_ids is None:
            self.position_ids = np.broadcast_to(np.arange(self.input_ids.shape[1], dtype=np.int64),
                                                self.input_ids.shape)
        if self.position_ids.shape != self.input_ids.shape:
            raise ValueError(f"position_ids {self.position_ids.shape} must match input_ids {self.input_ids.shape}")

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        """Block length, tokens."""
        return int(self.input_ids.shape[1])

    @property
    def trained_tokens(self) -> int:
        """Positions with a label (not `IGNORE_INDEX`)."""
        return int((self.labels != IGNORE_INDEX).sum())

    @property
    def example_tokens(self) -> int:
        """Positions holding example tokens (EOS included), not padding: the useful part of the compute."""
        return int(self.input_ids.size - self.padding_tokens)

    @property
    def fill(self) -> float:
        """Useful / computed tokens: `example_tokens` over all positions."""
        return self.example_tokens / self.input_ids.size if self.input_ids.size else 0.0


def best_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins (lists of item indices) holding items of `lengths`, each bin at most `capacity`.

    Best-fit decreasing: items from the longest down (ties by index, so the result is
    deterministic), each into the open bin it fills the most, a new bin when none has room. The
    open bins are counted by remaining space in a segment tree, so each placement costs
    O(log capacity) rather than a scan of the bins. Every length must be in 1..capacity.
    """
    size = 1 << int(capacity).bit_length()  # leaves 0..capacity (remaining space)
    tree = [0] * (2 * size)  # tree[size + c]: open bins with c tokens of room; inner nodes: sums
    open_with = [[] for _ in range(capacity + 1)]
    bins: list[list[int]] = []

    def add(space: int, delta: int) -> None:
        node = space + size
        while node:
            tree[node] += delta
            node >>= 1

    def tightest(need: int) -> int:
        """The least remaining space >= need among open bins, or -1."""
        node = need + size
        while tree[node] == 0:
            while node & 1:  # a right child: climb until a left child, whose right sibling comes next
                node >>= 1
            if node == 0:
                return -1
            node += 1
        while node < size:
            node = 2 * node if tree[2 * node] else 2 * node + 1
        return node - size

    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        need = int(lengths[index])
        if not 1 <= need <= capacity:
            raise ValueError(f"item {index} has length {need}, outside 1..{capacity}")
        space = tightest(need)
        if space < 0:
            space, target = capacity, len(bins)
            bins.append([])
        else:
            target = open_with[space].pop()
            add(space, -1)
        bins[target].append(index)
        if space > need:
            open_with[space - need].append(target)
            add(space - need, 1)
    return bins


def pack(examples: Sequence[tuple[Sequence[int], Sequence[int]]], seq_len: int, eos_id: int, *,
         pad_id: int | None = None) -> PackedDataset:
    """Pack whole (ids, labels) examples into `seq_len` blocks by best fit; never split one across blocks.

    Each example is followed by one EOS, labelled `eos_id` so the model learns to stop after an
    answer, unless the example's last label is `IGNORE_INDEX` (nothing trained on, e.g. an empty
    response under a masked prompt): the EOS then belongs to that masked span. An example (with its
    EOS) longer than `seq_len` keeps its first `seq_len` tokens; `truncated_examples` and
    `truncated_tokens` count that. The examples are placed by `best_fit_decreasing`, and the rest of
    each block is padding (`pad_id`, default `eos_id`) labelled `IGNORE_INDEX`, counted in
    `padding_tokens`.

    `position_ids` restart at 0 at every example and again at the padding, which transformers reads
    as separate sequences: a block-causal mask under sdpa/eager (`masking_utils.find_packed_sequence_indices`),
    `cu_seq_lens` under flash attention (`varlen_kwargs`), so attention never crosses an example
    boundary and the padding sees only padding. The first label of every example is `IGNORE_INDEX`:
    the position before it belongs to the previous example, which cannot see it. Labels are not
    shifted (HF causal LMs shift inside their loss), so an example's loss is the one it has alone.
    """
    if seq_len <= 0:
        raise JobSettingError("seq_len", f"must be positive, got {seq_len}")
    pad = eos_id if pad_id is None else pad_id
    rows: list[tuple[np.ndarray, np.ndarray]] = []
    truncated_examples = truncated_tokens = 0
    for ids, labels in examples:
        if len(labels) != len(ids):
            raise ValueError(f"an example has {len(ids)} ids but {len(labels)} labels")
        trained = len(ids) > 0 and labels[-1] != IGNORE_INDEX
        row_ids = np.empty(len(ids) + 1, dtype=np.int64)
        row_labels = np.empty(len(ids) + 1, dtype=np.int64)
        row_ids[:-1], row_ids[-1] = ids, eos_id
        row_labels[:-1], row_labels[-1] = labels, eos_id if trained else IGNORE_INDEX
        row_labels[0] = IGNORE_INDEX
        if len(row_ids) > seq_len:
            truncated_examples += 1
            truncated_tokens += len(row_ids) - seq_len
            row_ids, row_labels = row_ids[:seq_len], row_labels[:seq_len]
        rows.append((row_ids, row_labels))
    bins = best_fit_decreasing([len(ids) for ids, _ in rows], seq_len)
    input_ids = np.full((len(bins), seq_len), pad, dtype=np.int64)
    labels = np.full((len(bins), seq_len), IGNORE_INDEX, dtype=np.int64)
    position_ids = np.empty((len(bins), seq_len), dtype=np.int64)
    positions = np.arange(seq_len, dtype=np.int64)
    for block, members in enumerate(bins):
        start = 0
        for index in members:
            row_ids, row_labels = rows[index]
            end = start + len(row_ids)
            input_ids[block, start:end] = row_ids
            labels[block, start:end] = row_labels
            position_ids[block, start:end] = positions[: end - start]
            start = end
        position_ids[block, start:] = positions[: seq_len - start]
    return PackedDataset(input_ids, labels, position_ids, num_examples=len(rows),
                         truncated_examples=truncated_examples, truncated_tokens=truncated_tokens,
                         padding_tokens=input_ids.size - sum(len(ids) for ids, _ in rows))


def uses_varlen(attn_implementation: str) -> bool:
    """Whether the attention kernel takes packed sequences as `cu_seq_lens` (flash attention 2/3)."""
    return attn_implementation.startswith("flash_attention")


def varlen_kwargs(position_ids: np.ndarray) -> dict:
    """Flash attention's padding-free arguments for a batch of packed blocks, computed on the host.

    The blocks are flattened row-major (as transformers flattens query/key/value), and a sequence
    starts wherever a position is 0. Passing these to the model makes every layer call the varlen
    kernel with them as they are; without them transformers would derive them from `position_ids`
    in every layer, a device-to-host sync (`.item()` of the longest sequence) per layer, and with a
    micro-batch above one it would not detect the packing at all.
    """
    import torch

    flat = position_ids.reshape(-1)
    cu = np.append(np.flatnonzero(flat == 0), flat.size).astype(np.int32)
    longest = int(np.diff(cu).max()) if cu.size > 1 else 0
    cu_t = torch.from_numpy(cu)
    return {"cu_seq_lens_q": cu_t, "cu_seq_lens_k": cu_t, "max_length_q": longest, "max_length_k": longest}


def make_batch(input_ids: np.ndarray, labels: np.ndarray, position_ids: np.ndarray, *, varlen: bool = False) -> dict:
    """A micro-batch as `train_step` and `evaluate` take it: tensors, plus flash's varlen arguments if `varlen`."""
    import torch

    batch = {"input_ids": torch.from_numpy(np.ascontiguousarray(input_ids)),
             "labels": torch.from_numpy(np.ascontiguousarray(labels)),
             "position_ids": torch.from_numpy(np.ascontiguousarray(position_ids))}
    if varlen:
        batch.update(varlen_kwargs(position_ids))
    return batch


def to_device(batch: dict, device) -> dict:
    """The batch with its tensors moved to `device` (non-blocking); the flash max lengths stay ints."""
    return {k: v.to(device, non_blocking=True) if hasattr(v, "to") else v for k, v in batch.items()}


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)


def extract_pairs(job, records) -> list[tuple[str, str]]:
    """(instruction, response) strings from loaded records; rows without a response are skipped.

    With `job.input_field` set (Alpaca's `input`), a non-empty input is appended to the
    instruction after a blank line, as the Alpaca format intends.
    """
    instructions = list(records[job.instruction_field])
    responses = list(records[job.response_field])
    input_field = getattr(job, "input_field", None)
    inputs = list(records[input_field]) if input_field else [None] * len(instructions)
    pairs = []
    for instruction, extra, response in zip(instructions, inputs, responses, strict=True):
        instruction, extra, response = _text(instruction), _text(extra), _text(response)
        if instruction is None or response is None or not response.strip():
            continue  # nothing to learn from
        if extra and extra.strip():
            instruction = f"{instruction}\n\n{extra}"
        pairs.append((instruction, response))
    return pairs


def split_pairs(pairs: Sequence[tuple[str, str]], *, seed: int, eval_fraction: float
                ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Deterministic (train, eval) split: a seeded permutation, the first `eval_fraction` held out.

    At least one example is held out when `eval_fraction > 0`; train keeps the permuted order.
    """
    n = len(pairs)
    if n == 0:
        raise JobSettingError("dataset", "no usable rows (every row lacks an instruction or a response)")
    if not 0 <= eval_fraction < 1:
        raise JobSettingError("eval_fraction", f"must be in [0, 1), got {eval_fraction}")
    n_eval = 0 if eval_fraction == 0 else max(1, round(n * eval_fraction))
    if n_eval >= n:
        raise JobSettingError("eval_fraction", f"{eval_fraction} of {n} rows leaves nothing to train on")
    order = np.random.default_rng(_seed_words(seed)).permutation(n)
    return [pairs[i] for i in order[n_eval:]], [pairs[i] for i in order[:n_eval]]


def build_datasets(job, tokenizer, *, cache_dir: str | os.PathLike | None = None
                   ) -> tuple[PackedDataset, list[dict]]:
    """Load, split, tokenize and pack (`pack`): the packed training set and the raw held-out records.

    Eval records are `{"instruction": ..., "response": ...}` dicts (these key names, whatever the
    dataset's columns; an Alpaca input is already folded into the instruction), for `evaluate`.
    Deterministic given the job, so every rank builds the same blocks.
    """
    records = load_records(job, cache_dir=cache_dir)
    pairs = extract_pairs(job, records)
    train_pairs, eval_pairs = split_pairs(pairs, seed=job.seed, eval_fraction=job.eval_fraction)
    examples = tokenize_examples(tokenizer, train_pairs, mask_prompt=job.mask_prompt)
    eos_id = tokenizer.eos_token_id
    if eos_id is None:
        raise JobSettingError("model", "the tokenizer has no eos_token; packing needs one after each example")
    dataset = pack(examples, job.seq_len, eos_id, pad_id=tokenizer.pad_token_id)
    log.info("packed %d examples (%d tokens) into %d blocks of %d, %.1f%% filled; %d truncated (%d tokens cut); "
             "%d held out", dataset.num_examples, dataset.example_tokens, len(dataset), job.seq_len,
             100 * dataset.fill, dataset.truncated_examples, dataset.truncated_tokens, len(eval_pairs))
    eval_records = [{"instruction": i, "response": r} for i, r in eval_pairs]
    return dataset, eval_records


def dataset_epochs(job, *, world_size: int, tokenizer=None, local_only: bool = False) -> float | None:
    """Print how many tokens the training split holds after formatting and the epochs `max_steps` implies.

    Builds the packed training set exactly as every worker will (`build_datasets`), so the figures
    are the run's: examples, formatted tokens (chat template + EOS, before any truncation), blocks,
    and `max_steps x global_batch_size` over the blocks one epoch hands out at this world size.
    Above `job.max_epochs_warning` a warning goes to stderr. `local_only` skips (returning None) a
    dataset that is not on this machine. Nothing here stops a run: when the tokenizer or the data
    cannot be read from here (offline, credentials), a note says so, and None is returned.
    """
    import sys

    try:
        if local_only and _classify(job.dataset).kind not in ("file", "saved", "dir"):
            return None
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(job.model)
        dataset, _ = build_datasets(job, tokenizer)
    except Exception as exc:  # noqa: BLE001 - a figure for the log; the workers report real failures
        print(f"note: dataset tokens and epochs not counted here ({exc})", file=sys.stderr)
        return None
    per_epoch = len(dataset) // (world_size * job.micro_batch_size) * world_size * job.micro_batch_size
    epochs = job.max_steps * job.global_batch_size / per_epoch if per_epoch else float("inf")
    tokens = dataset.example_tokens + dataset.truncated_tokens
    print(f"data: {dataset.num_examples:,} training examples, {tokens:,} tokens after formatting "
          f"({dataset.trained_tokens:,} trained), packed whole into {len(dataset):,} blocks of {job.seq_len} "
          f"({dataset.fill:.1%} filled, {dataset.truncated_examples:,} truncated); max_steps={job.max_steps} x "
          f"global_batch_size={job.global_batch_size} = {epochs:.2f} epochs", flush=True)
    if epochs > job.max_epochs_warning:
        steps = job.max_steps / epochs
        print(f"warning: job.max_steps={job.max_steps} trains {epochs:.1f} epochs of {job.dataset}, over "
              f"job.max_epochs_warning={job.max_epochs_warning:g} (overfitting); one epoch is about "
              f"{steps:.0f} steps: lower max_steps or use more data", file=sys.stderr, flush=True)
    return epochs


# ---- sharding --------------------------------------------------------------------------------


def _seed_words(seed: int, *more: int) -> list[int]:
    # SeedSequence takes non-negative words; the job's seed may be any int.
    return [seed % 2**64, *more]


class ShardedBatches:
    """This rank's micro-batches: a per-epoch shuffle by (seed, epoch), split across ranks.

    Epoch `e` permutes the blocks with a generator seeded by `(seed, e)`, keeps the largest prefix
    that gives every rank the same whole number of micro-batches, and hands rank `r` positions
    `r, r + world_size, ...` of it: shards are disjoint, equal in length, and ranks never desync.
    Iteration never ends (the trainer stops by steps). Batches are `make_batch` dicts (with flash
    attention's varlen arguments when `varlen`). `state_dict()` is the position of the next
    micro-batch; restoring it (with the same world size and micro-batch size) continues exactly.
    """

    def __init__(self, dataset: PackedDataset, *, rank: int, world_size: int, micro_batch_size: int, seed: int,
                 varlen: bool = False):
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        if micro_batch_size < 1:
            raise JobSettingError("micro_batch_size", f"must be positive, got {micro_batch_size}")
        self.dataset = dataset
        self.rank = rank
        self.world_size = world_size
        self.micro_batch_size = micro_batch_size
        self.seed = seed
        self.varlen = varlen
        if self.batches_per_epoch == 0:
            raise JobSettingError("micro_batch_size", f"{len(dataset)} packed blocks cannot give each of "
                                  f"{world_size} ranks a micro-batch of {micro_batch_size}; use more data, "
                                  "a smaller micro_batch_size or a smaller seq_len")
        self._epoch = 0
        self._position = 0

    @property
    def batches_per_epoch(self) -> int:
        """Micro-batches each rank gets per epoch."""
        return len(self.dataset) // self.world_size // self.micro_batch_size

    @property
    def epoch(self) -> int:
        """Epoch of the next micro-batch."""
        return self._epoch

    @property
    def position(self) -> int:
        """Index of the next micro-batch within the epoch."""
        return self._position

    def epoch_indices(self, epoch: int) -> np.ndarray:
        """Block indices this rank reads in `epoch`, in order."""
        usable = self.batches_per_epoch * self.micro_batch_size * self.world_size
        order = np.random.default_rng(_seed_words(self.seed, epoch)).permutation(len(self.dataset))
        return order[:usable][self.rank :: self.world_size]

    def __iter__(self) -> Iterator[dict]:
        mb = self.micro_batch_size
        while True:
            indices = self.epoch_indices(self._epoch)
            while self._position < self.batches_per_epoch:
                rows = indices[self._position * mb : (self._position + 1) * mb]
                ds = self.dataset
                batch = make_batch(ds.input_ids[rows], ds.labels[rows], ds.position_ids[rows], varlen=self.varlen)
                # Advance before yielding: a checkpoint taken after this batch was consumed must
                # point at the next one (code after `yield` only runs on the following next()).
                self._position += 1
                yield batch
            self._epoch += 1
            self._position = 0

    def state_dict(self) -> dict:
        """`{"epoch", "position"}` of the next micro-batch (an epoch's end is the next one's start)."""
        if self._position >= self.batches_per_epoch:
            return {"epoch": self._epoch + 1, "position": 0}
        return {"epoch": self._epoch, "position": self._position}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a `state_dict()`; the next micro-batch is the one after the saved run's last."""
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self.batches_per_epoch:
            raise ValueError(f"data position epoch={epoch} position={position} is outside this run's "
                             f"0..{self.batches_per_epoch} micro-batches per epoch (world size or batch changed?)")
        self._epoch, self._position = epoch, position
