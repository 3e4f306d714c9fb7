"""The model's architecture without its weights: `config.json` when it is on this machine, else a table.

Order: a local directory's `config.json`; the Hugging Face hub cache (`local_files_only`, never the
network); then `KNOWN`, the published `config.json` fields of a few well-known models, matched by
the last path component of `job.model` (so `Qwen/Qwen2.5-1.5B`, `Qwen/Qwen2.5-1.5B-Instruct` and
`s3://bucket/models/Qwen2.5-1.5B` all resolve). Only fields that change shapes or the memory of a
training step are kept; the rest take the model class's defaults.
"""

from __future__ import annotations

import copy
import re

from config.errors import UserError

_LLAMA32_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192}

# Values from each model's config.json on the Hugging Face Hub (the -Instruct variants share them).
KNOWN: dict[str, dict] = {
    "qwen2.5-0.5b": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                         max_position_embeddings=32768, tie_word_embeddings=True, rope_theta=1000000.0,
                         rms_norm_eps=1e-6),
    "qwen2.5-1.5b": dict(model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                         max_position_embeddings=131072, tie_word_embeddings=True, rope_theta=1000000.0,
                         rms_norm_eps=1e-6),
    "qwen2.5-3b": dict(model_type="qwen2", hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                       num_attention_heads=16, num_key_value_heads=2, vocab_size=151936,
                       max_position_embeddings=32768, tie_word_embeddings=True, rope_theta=1000000.0,
                       rms_norm_eps=1e-6),
    "qwen2.5-7b": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                       max_position_embeddings=131072, tie_word_embeddings=False, rope_theta=1000000.0,
                       rms_norm_eps=1e-6),
    # Qwen/Qwen2.5-14B and Qwen/Qwen2.5-32B config.json (base models; the -Instruct variants differ only in
    # max_position_embeddings 32768 and rms_norm_eps 1e-6, neither of which changes a shape or a step's memory).
    # Model cards: 14.7B parameters, 48 layers, 40 query / 8 KV heads; 32.5B, 64 layers, 40 / 8; context 131,072.
    "qwen2.5-14b": dict(model_type="qwen2", hidden_size=5120, intermediate_size=13824, num_hidden_layers=48,
                        num_attention_heads=40, num_key_value_heads=8, vocab_size=152064,
                        max_position_embeddings=131072, tie_word_embeddings=False, rope_theta=1000000.0,
                        rms_norm_eps=1e-5),
    "qwen2.5-32b": dict(model_type="qwen2", hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
                        num_attention_heads=40, num_key_value_heads=8, vocab_size=152064,
                        max_position_embeddings=131072, tie_word_embeddings=False, rope_theta=1000000.0,
                        rms_norm_eps=1e-5),
    "llama-3.2-1b": dict(model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
                         max_position_embeddings=131072, tie_word_embeddings=True, rope_theta=500000.0,
                         rms_norm_eps=1e-5, rope_scaling=_LLAMA32_ROPE),
    "llama-3.2-3b": dict(model_type="llama", hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                         num_attention_heads=24, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                         max_position_embeddings=131072, tie_word_embeddings=True, rope_theta=500000.0,
                         rms_norm_eps=1e-5, rope_scaling=_LLAMA32_ROPE),
}


class ArchitectureError(UserError, ValueError):
    """No architecture is known for `job.model` without the network."""


def table_key(model: str) -> str:
    """The `KNOWN` key `model` would match: its last path component, lower case, without -Instruct."""
    name = model.rstrip("/").rsplit("/", 1)[-1].lower()
    return re.sub(r"-instruct$", "", name)


def resolve_architecture(model: str, *, online: bool = False, token: str | None = None):
    """(Hugging Face config, where it came from) for `job.model`, with no weights.

    No network unless `online`: then a Hub id not in the cache is asked for its config.json, with
    `token` (the job's, from `job.hf_token_secret`) passed explicitly, before the table is tried.
    """
    from transformers import AutoConfig

    from workloads.fsdp_finetune.model import is_local_path

    if is_local_path(model):
        return AutoConfig.from_pretrained(model), f"{model}/config.json"
    if not model.startswith("s3://"):
        try:
            return AutoConfig.from_pretrained(model, local_files_only=True), "hub cache"
        except (OSError, ValueError):
            pass  # not cached here: fall through to the Hub (online) or the table
        if online:
            # token=False: no token of whoever runs the plan, only the job's (what the pods will have).
            return (AutoConfig.from_pretrained(model, token=token or False),
                    f"the Hub's config.json{' (with the job token)' if token else ''}")
    fields = KNOWN.get(table_key(model))
    if fields is None:
        raise ArchitectureError(
            f"no architecture known for '{model}' without the network (not a local directory, not in the "
            f"Hugging Face cache, not in the table of {', '.join(sorted(KNOWN))}); run the plan with --online "
            f"(a gated model with the token of job.hf_token_secret, docs/gated-models.md), or `hf download {model} "
            f"config.json` once (the plan reads the hub cache), or point job.model at a local directory holding it")
    fields = copy.deepcopy(fields)  # the config may rewrite rope_scaling in place
    return AutoConfig.for_model(fields.pop("model_type"), **fields), "table (published config.json)"
