"""Assets for the local CPU mode and the tests, made on the spot (nothing is downloaded).

Local mode must exercise the same code as a cluster run: a Hugging Face tokenizer directory with a
ChatML chat template, a `Qwen2ForCausalLM` checkpoint in safetensors, and an instruction dataset in
JSONL read back through `datasets.load_dataset`. Only the sizes differ. Everything here is
deterministic given the seed, so two runs (or two test sessions) produce identical files.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

# Qwen2.5's special tokens, so the chat template and the stop tokens match the real model's.
EOS_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [EOS_TOKEN, IM_START, IM_END]

# Qwen2.5's ChatML layout without its default system prompt (a tiny model gains nothing from
# reading it). The user turn rendered with `add_generation_prompt=True` is a textual prefix of the
# full conversation, which `data.tokenize_example` relies on to mask the prompt.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# A small vocabulary: the arithmetic corpus needs the 256 byte symbols plus a few hundred merges
# for the words; a larger one only makes the tiny model's embedding the bulk of its parameters.
DEFAULT_VOCAB_SIZE = 384

_QUESTION_FORMS = ("What is {a} + {b}?", "Compute {a} + {b}.", "{a} + {b} = ?", "Add {a} and {b}.")


@dataclass(frozen=True, kw_only=True)
class LocalAssets:
    """Paths of the generated local assets and the held-out evaluation records."""

    model_dir: Path
    """Tiny `Qwen2ForCausalLM` saved with `save_pretrained` (tokenizer saved alongside)."""
    tokenizer_dir: Path
    """Tokenizer directory for `AutoTokenizer.from_pretrained` (the model directory)."""
    dataset_path: Path
    """Training records, JSONL with `instruction` and `response` fields."""
    eval_records: list[dict]
    """Held-out `{"instruction", "response"}` records, disjoint from the training file's questions."""


def make_arithmetic_records(n: int, seed: int, *, max_operand: int = 9) -> list[dict]:
    """`n` addition questions `{"instruction": "What is 3 + 4?", "response": "7"}`, deterministic in `seed`.

    Operands are drawn from 0..`max_operand`. The default (single digits: 100 facts, answers of
    one or two digits) is what a ~0.33M-parameter model visibly learns within a minute on two CPU
    cores; raise it for a harder task. Several phrasings keep the prompt from being a constant.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if max_operand < 0:
        raise ValueError(f"max_operand must be >= 0, got {max_operand}")
    rng = random.Random(seed)
    records = []
    for _ in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        form = rng.choice(_QUESTION_FORMS)
        records.append({"instruction": form.format(a=a, b=b), "response": str(a + b)})
    return records


def write_jsonl(records: list[dict], path: str | os.PathLike) -> Path:
    """Write `records` as JSON Lines (one object per line, UTF-8), atomically; return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write then rename, so a reader (or an interrupted run) never sees half a file.
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for record in records:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def make_tokenizer(out_dir: str | os.PathLike, corpus: list[str], *, vocab_size: int = DEFAULT_VOCAB_SIZE):
    """Train a byte-level BPE tokenizer on `corpus`, save it in Hugging Face format to `out_dir`, return it.

    Digits are split before BPE, so every digit is its own token (as in Qwen2.5), which is what
    lets a small model learn arithmetic digit by digit. Byte-level coverage means any text encodes
    and decodes back unchanged. `<|endoftext|>` is eos and pad; `<|im_start|>`/`<|im_end|>` frame
    the chat turns of the ChatML template.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus, trainer=trainer)

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        additional_special_tokens=[IM_START, IM_END],
        model_max_length=4096,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out_dir)
    return tokenizer


def make_tiny_model(
    out_dir: str | os.PathLike,
    tokenizer,
    seed: int,
    *,
    hidden_size: int = 128,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 256,
    max_position_embeddings: int = 1024,
) -> Path:
    """Save a randomly initialised `Qwen2ForCausalLM` (safetensors) sized for CPU; return `out_dir`.

    Same architecture as Qwen2.5 (GQA, RoPE, tied embeddings like the 1.5B model), so FSDP wrapping,
    checkpointing and loading follow the real path. Initialisation is seeded.
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    # Seed the global generator the init draws from, then restore it: the caller's RNG stream
    # (e.g. a test's) must not depend on whether assets were built.
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    finally:
        torch.random.set_rng_state(state)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    return out_dir


def prepare_local_assets(
    root_dir: str | os.PathLike,
    *,
    seed: int = 0,
    n_train: int = 4000,
    n_eval: int = 50,
    max_operand: int = 9,
) -> LocalAssets:
    """Create (or reuse) the tokenizer, tiny model and arithmetic JSONL under `root_dir`.

    Idempotent: a complete set from an earlier call with the same arguments is reused, so every
    Ray worker and every rerun reads identical files. A marker written last records the
    arguments; a partial set (interrupted run) or one made with other arguments is rebuilt.
    """
    root = Path(root_dir)
    model_dir = root / "model"
    dataset_path = root / "data" / "train.jsonl"
    eval_path = root / "data" / "eval.jsonl"
    marker = root / "assets.json"
    params = {"seed": seed, "n_train": n_train, "n_eval": n_eval, "max_operand": max_operand, "version": 1}

    if not _marker_matches(marker, params):
        # Draw train and eval from one stream, then hold out by question: an eval question never
        # appears verbatim in the training file (with single digits the sums themselves repeat,
        # in other phrasings; that is the task, not a leak of the exact prompt).
        pool = make_arithmetic_records(n_train + n_eval * 4, seed, max_operand=max_operand)
        eval_records: list[dict] = []
        seen_eval: set[str] = set()
        for record in pool:
            if len(eval_records) == n_eval:
                break
            if record["instruction"] not in seen_eval:
                seen_eval.add(record["instruction"])
                eval_records.append(record)
        train_records = [r for r in pool if r["instruction"] not in seen_eval][:n_train]
        if len(train_records) < n_train:
            # The question space is small; top up with fresh draws outside the held-out set.
            extra_seed = seed + 1
            while len(train_records) < n_train:
                more = make_arithmetic_records(n_train, extra_seed, max_operand=max_operand)
                train_records += [r for r in more if r["instruction"] not in seen_eval]
                extra_seed += 1
            train_records = train_records[:n_train]

        # Train on the rendered conversations, so the template's words ("user", "assistant") get
        # merges too and a prompt costs a few tokens rather than one per letter.
        corpus = [_render_chatml(r["instruction"], r["response"]) for r in train_records + eval_records]
        tokenizer = make_tokenizer(model_dir, corpus)
        make_tiny_model(model_dir, tokenizer, seed)
        write_jsonl(train_records, dataset_path)
        write_jsonl(eval_records, eval_path)
        marker.write_text(json.dumps(params, sort_keys=True))

    eval_records = [json.loads(line) for line in eval_path.read_text(encoding="utf-8").splitlines() if line]
    return LocalAssets(model_dir=model_dir, tokenizer_dir=model_dir, dataset_path=dataset_path,
                       eval_records=eval_records)


def _render_chatml(instruction: str, response: str) -> str:
    return f"{IM_START}user\n{instruction}{IM_END}\n{IM_START}assistant\n{response}{IM_END}\n"


def _marker_matches(marker: Path, params: dict) -> bool:
    try:
        return json.loads(marker.read_text()) == json.loads(json.dumps(params, sort_keys=True))
    except (OSError, ValueError):
        return False
