"""Sharded training checkpoints with `torch.distributed.checkpoint`, and the final Hugging Face export.

Layout of one checkpoint directory (as Ray Train assembles it in storage):

    .metadata              DCP index, written by rank 0
    __<rank>_0.distcp      each rank's shards of the model and optimizer state (fp32)
    trainer_<rank>.pt      each rank's scheduler, step, data position and RNG states

Each rank writes into its own local directory and reports it with `ray.train.report`; Ray copies
every rank's files into the one checkpoint folder in storage, and the file names never collide.
DCP needs no shared file system for this: plans and metadata travel over the process group.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

TRAINER_FILE = "trainer_{rank}.pt"
_OPTIONS = StateDictOptions(ignore_frozen_params=True)


def tied_aliases(model) -> dict[str, str]:
    """`{alias: kept name}` for every parameter registered under several names (tied weights).

    Found from the live module, so it holds only when the weights really are tied (Qwen2.5-1.5B's
    `lm_head.weight` is its `model.embed_tokens.weight`; FSDP2 keeps the two names on one
    parameter). The kept name is the one Hugging Face loads into, not one of the model's declared
    tie targets (`_tied_weights_keys`), so `from_pretrained` reties the alias from it.
    """
    declared = set(getattr(model, "_tied_weights_keys", None) or {})
    if hasattr(model, "get_expanded_tied_weights_keys"):
        declared |= set(model.get_expanded_tied_weights_keys())
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    aliases = {}
    for group in names.values():
        if len(group) > 1:
            kept = next((n for n in group if n not in declared), group[0])
            aliases.update({n: kept for n in group if n != kept})
    return aliases


def _model_state(model, optimizer) -> tuple[dict, dict, dict[str, str]]:
    """The (sharded) model and optimizer state, each tied weight once, and the aliases left out."""
    # Frozen parameters are left out: under LoRA (`lora.py`) the whole base model is frozen and comes from
    # job.model again at resume, so a checkpoint holds the adapters and their AdamW state only; a full fine-tune
    # has no frozen parameter, so nothing changes for it.
    model_sd, optim_sd = get_state_dict(model, optimizer, options=_OPTIONS)
    aliases = tied_aliases(model)
    return {k: v for k, v in model_sd.items() if k not in aliases}, optim_sd, aliases


def rng_state(device: torch.device) -> dict:
    """Every random generator the training step may draw from on this rank."""
    state = {"python": random.getstate(), "torch": torch.get_rng_state(), "numpy": np.random.get_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    """Restore what `rng_state` captured."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def save_checkpoint(directory: str | os.PathLike, *, model, optimizer, scheduler, step: int, data_state: dict,
                    device: torch.device) -> None:
    """Write this rank's part of a checkpoint into `directory` (collective: every rank must call it)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model_sd, optim_sd, _ = _model_state(model, optimizer)  # a tied weight once, not twice (0.93 GB fp32 for 1.5B)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(directory))
    rank = dist.get_rank() if dist.is_initialized() else 0
    torch.save(
        {"step": step, "scheduler": scheduler.state_dict(), "data": data_state, "rng": rng_state(device)},
        directory / TRAINER_FILE.format(rank=rank),
    )


def saved_world_size(directory: str | os.PathLike) -> int:
    """The world size that wrote a checkpoint (one trainer file per rank)."""
    return len(list(Path(directory).glob(TRAINER_FILE.format(rank="*"))))


def rescale_data_state(data: dict, *, saved_world: int, world: int) -> dict:
    """A data position written by `saved_world` ranks, for `world` ranks.

    `ShardedBatches` deals an epoch's permutation out round-robin, so after position p on every
    rank the first p x world x micro-batch blocks are consumed whatever the world size: the same
    prefix is position p x saved_world / world under the new world size. The global batch is a
    multiple of both, so at a step boundary this is exact; otherwise it rounds down (a few blocks
    are seen twice, none skipped).
    """
    return {"epoch": int(data["epoch"]), "position": int(data["position"]) * saved_world // world}


@contextlib.contextmanager
def node_copy(checkpoint, *, local_rank: int) -> Iterator[str]:
    """A Ray Train checkpoint as one local folder per node: local rank 0 downloads it, every rank reads it.

    Collective: every rank must enter and leave it. Not Ray's `Checkpoint.as_directory`, which is unsafe for ranks of
    one node that do not arrive together (ray 2.58.0, ray/train/_checkpoint.py `to_directory`): its file lock, taken
    with timeout 0, only keeps two downloads from running at once, so a rank that arrives after the first download
    ended downloads again into the same folder and truncates the files another rank is reading. Seen on the EC2
    tier's resume with two ranks in one container (DCP: "global metadata read failed: Ran out of input"); each
    g6.12xlarge worker pod holds 4 ranks. A checkpoint already on a local file system is read where it is."""
    import pyarrow.fs

    if isinstance(checkpoint.filesystem, pyarrow.fs.LocalFileSystem):
        yield checkpoint.path
        return
    # The same name on every rank of the node (they share /tmp: one pod, one container, or the local demo's host).
    folder = Path(tempfile.gettempdir()) / f"resume-{hashlib.sha256(checkpoint.path.encode()).hexdigest()[:16]}"
    try:
        if local_rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
            checkpoint.to_directory(str(folder))
        _barrier()  # every node's copy is complete before any rank reads
        yield str(folder)
        _barrier()  # every rank has read it before local rank 0 removes it
    finally:
        if local_rank == 0:
            shutil.rmtree(folder, ignore_errors=True)


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def load_checkpoint(directory: str | os.PathLike, *, model, optimizer, scheduler, device: torch.device) -> dict:
    """Restore model, optimizer, scheduler and RNG from a checkpoint; return `{"step", "data"}` for this rank.

    Collective: every rank must call it. DCP reshards the model and optimizer state onto whatever
    mesh `model` now has, so a checkpoint written under full sharding resumes under hybrid (and
    back), and under another world size. With the same world size each rank takes its own data
    position and RNG states; with another, every rank takes rank 0's scheduler and step, the data
    position is rescaled (`rescale_data_state`), and the RNG states start afresh (they belong to
    ranks that no longer exist; nothing that must agree across ranks draws from them).
    A tied weight is read once, under its kept name, which checkpoints written before tied weights
    were stored once also hold (their extra alias is not read).
    """
    directory = Path(directory)
    model_sd, optim_sd, aliases = _model_state(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=str(directory))
    # strict load; a frozen tied weight (LoRA's base) is in neither
    state["model"].update({alias: state["model"][kept] for alias, kept in aliases.items() if kept in state["model"]})
    # With frozen parameters (LoRA) the model's own load_state_dict must not be strict: the frozen base is not in
    # the checkpoint. dcp.load above is strict about every key the state dict asks for (the adapters) either way.
    frozen = any(not p.requires_grad for p in model.parameters())
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                   options=StateDictOptions(ignore_frozen_params=True, strict=not frozen))
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    saved_world = saved_world_size(directory)
    if saved_world == 0:
        raise FileNotFoundError(f"no {TRAINER_FILE.format(rank='*')} in {directory}: not a complete checkpoint")
    same_world = saved_world == world
    # Our own file (RNG states are numpy/python objects, not just tensors).
    extra = torch.load(directory / TRAINER_FILE.format(rank=rank if same_world else 0), weights_only=False)
    scheduler.load_state_dict(extra["scheduler"])
    if not same_world:
        return {"step": extra["step"],
                "data": rescale_data_state(extra["data"], saved_world=saved_world, world=world)}
    set_rng_state(extra["rng"], device)
    return {"step": extra["step"], "data": extra["data"]}


def export_hf_model(model, tokenizer, destination: str, *, dtype: torch.dtype | None = None,
                    max_shard_size: str = "5GB") -> None:
    """Write the full model (safetensors) and tokenizer in Hugging Face format to `destination`.

    Collective: every rank takes part in gathering the full state dict; with `cpu_offload` each
    layer is gathered and moved to CPU one at a time, and only rank 0 keeps the full copy, so
    no GPU ever holds the whole model. Rank 0 writes to a local temporary folder and copies it to
    `destination` (a local path or any URI pyarrow understands, such as `s3://bucket/key`). A tied
    weight is written once (`tied_aliases`).
    `dtype` (the original model's, `model.saved_dtype`) is what the weights are written in: the
    fp32 master weights of a bf16 model go back to bf16, half the size, loading like the original.
    """
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        # The gathered copies of a tied weight are separate tensors, which save_pretrained would
        # write twice (467 MB extra in bf16 for 1.5B); from_pretrained reties the alias.
        aliases = tied_aliases(model)
        state = {k: v.to(dtype) if dtype is not None and v.is_floating_point() else v
                 for k, v in state.items() if k not in aliases}
        with tempfile.TemporaryDirectory(prefix="hf-export-") as tmp:
            write_hf_folder(tmp, model, state, tokenizer, dtype=dtype, max_shard_size=max_shard_size)
            copy_tree(tmp, destination)
    # No barrier after the write: it would be a collective bounded by job.collective_timeout_minutes, so an
    # export slower than that (gather, safetensors, upload) would fail a finished run, and every retry would
    # resume at max_steps and fail the same way. Nothing collective follows, and Ray Train ends the run only
    # once every worker's function has returned (tests/test_export.py).


def write_hf_folder(folder: str, model, state: dict, tokenizer, *, dtype: torch.dtype | None,
                    max_shard_size: str) -> None:
    """A Hugging Face model folder in `folder`: `state` (already gathered, in `dtype`, each tied weight once) as
    safetensors with `model`'s config and generation config, and the tokenizer. The one writer of both exports:
    the full fine-tune's (`export_hf_model`) and LoRA's merged model (`lora.export_lora`)."""
    # save_pretrained on the unwrapped module: the config and generation config come along.
    model.save_pretrained(folder, state_dict=state, safe_serialization=True, max_shard_size=max_shard_size)
    if dtype is not None:
        # save_pretrained records the dtype of the live (fp32) parameters; record the written one.
        config = copy.deepcopy(model.config)
        config.dtype = dtype
        config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


# Seconds an S3 request may go without a byte before it fails, and to connect. The AWS C++ SDK inside pyarrow
# defaults to 3 s (ClientConfiguration.requestTimeoutMs, which Arrow maps from S3Options.request_timeout and curl
# enforces as "Less than 1 bytes/sec transferred the last 3 seconds"): a node whose CPUs are all training, or a
# checkpoint part queued behind others, stalls that long and the whole fit fails in Ray's checkpoint upload.
S3_REQUEST_TIMEOUT_S = 60.0
S3_CONNECT_TIMEOUT_S = 10.0


def patient(fs):
    """`fs` with S3's request and connect timeouts raised (above); any other filesystem as it is.

    Rebuilt from the options pyarrow itself pickles it with (`S3FileSystem.__reduce__`), so the region,
    endpoint and credentials that `FileSystem.from_uri` resolved are kept.
    """
    import pyarrow.fs as pafs

    if not isinstance(fs, pafs.S3FileSystem):
        return fs
    rebuild, (options,) = fs.__reduce__()
    return rebuild({**options, "request_timeout": S3_REQUEST_TIMEOUT_S, "connect_timeout": S3_CONNECT_TIMEOUT_S})


def filesystem(location: str):
    """(pyarrow filesystem, path) for a local path or a URI: pyarrow's own (s3://..., `patient`), else fsspec's
    (memory://...)."""
    import pyarrow as pa
    import pyarrow.fs as pafs

    if "://" in location:
        try:
            fs, path = pafs.FileSystem.from_uri(location)
            return patient(fs), path
        except pa.ArrowInvalid:  # a scheme pyarrow lacks: through fsspec, as Ray Train's storage does
            import fsspec

            fs, path = fsspec.core.url_to_fs(location)
            return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path
    return pafs.LocalFileSystem(), str(Path(location).resolve())


def copy_tree(local_dir: str, destination: str) -> None:
    """Copy a local folder to a local path or a URI (s3://...), replacing files of the same name."""
    import pyarrow.fs as pafs

    fs, path = filesystem(destination)
    fs.create_dir(path, recursive=True)
    pafs.copy_files(local_dir, path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
