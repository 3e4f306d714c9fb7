"""Building the model on a worker: weights fetched once per node, loaded in fp32, sharded with FSDP2."""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

# Files `from_pretrained` needs; skips the .bin/.pth/.gguf copies some repositories also carry.
# *.jinja: transformers 5 saves the chat template as chat_template.jinja beside tokenizer_config.json
# (transformers 5.13 utils/hub.py, CHAT_TEMPLATE_FILE); without it the tokenizer has no chat template.
_WEIGHT_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja", "tokenizer*"]


def is_local_path(model: str) -> bool:
    """Whether `model` names a directory on this machine (no download needed)."""
    return os.path.isdir(model)


def fetch_weights(model: str, *, local_rank: int, cache_dir: str | None = None) -> str:
    """Make `model` available on this node's disk, downloading once per node; return a local path.

    Local rank 0 of each node downloads (hub id via `snapshot_download`, `s3://` prefix via boto3)
    into the node-local cache; every rank then waits on a barrier, and the other ranks resolve
    the same cached files without network access. A local directory is used as it is. Must be
    called by every rank (it contains a collective).
    """
    if is_local_path(model):
        return model
    path = None
    if local_rank == 0:
        path = _download(model, cache_dir)
    if dist.is_initialized():
        # Every node's local rank 0 has finished its download once the barrier releases.
        dist.barrier()
    if path is None:
        path = _download(model, cache_dir, offline=True)
    return path


def _download(model: str, cache_dir: str | None, *, offline: bool = False) -> str:
    if model.startswith("s3://"):
        # Offline (every rank but local rank 0): the files are in the node's cache already; only
        # local rank 0 lists and reads the bucket.
        return str(_s3_cache_root(model, cache_dir)) if offline else _download_s3(model, cache_dir)
    from huggingface_hub import snapshot_download

    return snapshot_download(model, cache_dir=cache_dir, allow_patterns=_WEIGHT_PATTERNS, local_files_only=offline)


def _s3_cache_root(uri: str, cache_dir: str | None) -> Path:
    """The node-local folder an `s3://bucket/prefix` model is copied into."""
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    return Path(cache_dir or Path.home() / ".cache" / "fsdp_finetune") / "s3" / bucket / prefix.rstrip("/")


def _download_s3(uri: str, cache_dir: str | None) -> str:
    """Copy an `s3://bucket/prefix` model directory into the cache (skipping files already there)."""
    import boto3

    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    prefix = prefix.rstrip("/")
    root = _s3_cache_root(uri, cache_dir)
    s3 = boto3.client("s3")
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            target = root / obj["Key"][len(prefix) + 1 :]
            if target.exists() and target.stat().st_size == obj["Size"]:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, obj["Key"], str(target))
    return str(root)


def resolve_attn_implementation(requested: str, device: torch.device) -> str:
    """The attention kernel to use: flash-attention 2 only on CUDA with `flash_attn` installed, else sdpa."""
    if requested == "flash_attention_2" and (device.type != "cuda" or importlib.util.find_spec("flash_attn") is None):
        log.warning("flash_attention_2 needs CUDA and the flash_attn package; using sdpa")
        return "sdpa"
    return requested


def build_model(path: str, *, attn_implementation: str, device: torch.device, dtype: torch.dtype = torch.float32):
    """Load a causal LM from a local path with fp32 master weights (on CPU; sharding moves it).

    The fp32 copy is what the optimizer updates; on GPU the forward/backward run in bf16 through
    FSDP2's mixed-precision policy, so no precision is lost across many small updates (the
    walkthrough's pure-bf16 weights drop updates smaller than bf16's 8-bit mantissa can hold).
    `dtype` bf16 is for a frozen base (LoRA, `lora.py`): nothing updates it, so no master copy is needed.
    """
    from transformers import AutoModelForCausalLM

    attn = resolve_attn_implementation(attn_implementation, device)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn)
    # The KV cache is for generation; in training it only costs memory.
    model.config.use_cache = False
    # from_pretrained returns the model in eval mode, and Hugging Face layers only recompute under
    # activation checkpointing when `self.training` (dropout too depends on it): train mode here.
    model.train()
    return model


def saved_dtype(path: str) -> torch.dtype:
    """The dtype the model's weights were published in (`config.dtype`, bf16 for Qwen2.5); fp32 if unset.

    Training keeps fp32 master weights; the exported model goes back to this dtype (half the size
    for a bf16 model), so it loads like the original.
    """
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32


def decoder_layers(model) -> torch.nn.ModuleList:
    """The transformer blocks (`model.model.layers` in Llama/Qwen-style Hugging Face models)."""
    return model.model.layers


REDUCE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def mixed_precision(device: torch.device, reduce_dtype: str | torch.dtype = "float32"):
    """FSDP2's policy: on GPU bf16 compute with gradients reduced in `reduce_dtype`; on CPU all fp32.

    On CPU everything stays fp32 (gloo has no fast bf16 path, and CPU bf16 matmuls are slow).
    bf16 reduction halves the gradient traffic (the cross-node all-reduce of hybrid sharding
    included), but every partial sum of the reduction is rounded to bf16 (8 significant bits,
    about 2-3 decimal digits), so small gradient components lose precision; float32 is the default.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if device.type != "cuda":
        return MixedPrecisionPolicy()
    dtype = REDUCE_DTYPES[reduce_dtype] if isinstance(reduce_dtype, str) else reduce_dtype
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=dtype)


def shard_model(
    model,
    *,
    device: torch.device,
    mesh=None,
    reduce_dtype: str | torch.dtype = "float32",
    activation_checkpointing: bool = False,
    compile: bool = False,
    reshard_after_forward: bool = True,
    root_reshard_after_forward: bool = False,
):
    """Apply activation checkpointing, per-layer compile and FSDP2 `fully_shard` (each layer, then root).

    One FSDP unit per decoder layer lets the all-gather of layer i+1 overlap layer i's compute and
    frees each layer's full parameters right after use; the root unit holds the embeddings, final
    norm and (tied) LM head. `mesh` (`topology.build_mesh`) decides who shards with whom: None or a
    1-D mesh shards over all ranks, a 2-D ("replicate", "shard") mesh shards within a node and
    replicates across nodes (HSDP). Mixed precision: `mixed_precision`. Activation checkpointing
    uses Hugging Face's per-layer implementation (non-reentrant), which keeps parameter names
    unchanged, so checkpoints and the exported model need no renaming.
    `reshard_after_forward=False` keeps each layer's gathered parameters from forward to backward
    (no second all-gather, at the cost of holding every layer's full bf16 parameters, 3 GB for
    1.5B): right at world size 1, where there is nothing to gather and resharding only makes
    backward redo every layer's cast-and-copy. The root unit is never resharded after forward (as
    in torchtitan): its last use in forward is the LM head and its first in backward is the LM
    head again, so resharding would only re-gather the 233M-parameter embedding at the start of
    backward, where no compute overlaps it (0.47 GB held in bf16 for 1.5B);
    `root_reshard_after_forward=True` restores the old behaviour (bench/comm_volume.py measures it).
    The root also gets the chunked loss method (`loss.install_fsdp_loss`), compiled under `compile`.
    Returns the model, sharded in place, in train mode.
    """
    from torch.distributed.fsdp import fully_shard

    from workloads.fsdp_finetune.loss import install_fsdp_loss

    model.train()  # checkpointing (and dropout) only act in train mode; see build_model
    if activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mp_policy = mixed_precision(device, reduce_dtype)
    for layer in decoder_layers(model):
        if compile:
            # In-place compile keeps the module (and its parameter names) as it is.
            layer.compile()
        fully_shard(layer, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=root_reshard_after_forward)
    install_fsdp_loss(model, compile=compile)
    return model


def count_params(model) -> int:
    """Total parameter count (of the full, unsharded model)."""
    return sum(p.numel() for p in model.parameters())
