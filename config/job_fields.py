"""The variable file's `job` section: model, data, batch, optimiser, checkpoints, sharding, RayJob limits.

Every field states its constraint and its unit; the README's reference table is generated from these
descriptions (`config/reference.py`).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from config.base import _Strict
from config.s3 import S3Location, parse_s3_uri


class JobConfig(_Strict):
    """The fine-tuning job."""

    model: str = Field(
        default="Qwen/Qwen2.5-1.5B",
        description="Hugging Face model id, local path or s3://bucket/prefix (the pods get read access to it).",
    )
    dataset: str = Field(
        default="yahma/alpaca-cleaned",
        description="Dataset: hub id, local path, s3://bucket/prefix (read access granted), or a .jsonl/.parquet file.",
    )
    dataset_split: str = Field(default="train", description="Dataset split to train on.")
    instruction_field: str = Field(default="instruction", description="Dataset column with the prompt.")
    response_field: str = Field(default="output", description="Dataset column with the answer.")
    input_field: str | None = Field(
        default=None, description="Optional dataset column appended to the prompt (Alpaca's `input`; None: none)."
    )
    eval_fraction: float = Field(
        default=0.01, ge=0, lt=0.5,
        description="Fraction held out from training: its loss is computed across all ranks every "
        "eval_every steps and after the last (0: none).",
    )
    seq_len: int = Field(default=2048, gt=0, description="Packed sequence length, tokens.")
    micro_batch_size: int = Field(default=4, gt=0, description="Sequences per GPU per forward pass.")
    global_batch_size: int = Field(
        default=64, gt=0, description="Sequences per optimizer step across all GPUs (sets gradient accumulation)."
    )
    learning_rate: float = Field(default=2e-5, gt=0, description="Peak learning rate (AdamW).")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    warmup_steps: int = Field(default=20, ge=0, description="Linear warm-up, optimizer steps.")
    max_steps: int = Field(default=500, gt=0, description="Optimizer steps to train.")
    max_epochs_warning: float = Field(
        default=3, gt=0,
        description="Epochs of the training split that max_steps may run before the driver warns (overfitting), "
                    "epochs.",
    )
    grad_clip: float = Field(default=1.0, gt=0, description="Gradient-norm clip.")
    mask_prompt: bool = Field(default=True, description="Exclude prompt tokens from the loss.")
    checkpoint_every: int = Field(default=100, gt=0, description="Checkpoint interval, optimizer steps.")
    keep_checkpoints: int = Field(default=2, gt=0, description="Checkpoints kept by Ray.")
    report_every: int = Field(default=10, gt=0, description="Metrics report interval, optimizer steps.")
    eval_every: int = Field(
        default=100, gt=0,
        description="Held-out loss and perplexity interval, optimizer steps (also after the last step).",
    )
    mlflow_tracking_uri: str | None = Field(
        default=None,
        description="MLflow tracking URI (http(s)://server, sqlite:///file.db, ...) that rank 0 also sends the "
        "metrics and the job's settings to (None: TensorBoard and metrics.jsonl only).",
    )
    collective_timeout_minutes: float = Field(
        default=10, gt=0,
        description="Minutes a collective may wait before the process group fails it (PyTorch's default: 30); "
        "the NCCL flight recorder dumps its trace then.",
    )
    max_failures: int = Field(default=3, ge=-1, description="Worker-group restarts before giving up (-1: unlimited).")
    activation_checkpointing: bool = Field(default=True, description="Recompute activations in backward.")
    compile: bool = Field(default=False, description="torch.compile each decoder layer and the chunked loss.")
    sharding: Literal["auto", "full", "hybrid"] = Field(
        default="auto",
        description=("FSDP2 sharding: full (one group over all ranks), hybrid (shard within a node, replicate "
                     "across nodes: only one gradient all-reduce per step crosses the network) or auto (hybrid "
                     "when the job spans several nodes of more than one rank each, else full)."),
    )
    reduce_dtype: Literal["float32", "bfloat16"] = Field(
        default="float32",
        description=("Gradient reduction dtype on GPU: float32 (exact sums) or bfloat16 (half the gradient "
                     "traffic, sums rounded to 8 mantissa bits); CPU runs always reduce in float32."),
    )
    attn_implementation: Literal["flash_attention_2", "sdpa", "eager"] = Field(
        default="sdpa", description="Attention kernel (flash_attention_2 is in the DLC image)."
    )
    seed: int = Field(default=42, description="Seed for data order and initialisation.")
    run_name: str = Field(
        default="qwen2.5-1.5b-sft", pattern=r"^[A-Za-z0-9_.-]+$", description="Stable run name; a rerun resumes it."
    )
    timeout_hours: float = Field(
        default=12, gt=0,
        description="Hours the whole job may take, retries included: each attempt's RayJob activeDeadlineSeconds, "
        "and the driver's own deadline across attempts (KubeRay restarts its clock at every retry).",
    )
    retries: int = Field(default=2, ge=0, description="RayJob backoffLimit: resubmissions (each resumes).")
    ttl_hours: float = Field(
        default=1, ge=0,
        description="Hours a finished RayJob's head (Ray dashboard, driver log) is kept; its GPU workers go "
        "as soon as the job ends (KubeRay deletionRules).",
    )
    start_deadline_minutes: float = Field(
        default=30, gt=0, le=24 * 60,
        description="RayJob preRunningDeadlineSeconds, minutes: how long one attempt may wait for its whole Ray "
        "cluster (GPU nodes from zero, image pull) before it fails as PreRunningDeadlineExceeded, e.g. with no "
        "GPU capacity or too small a quota. KubeRay 1.7.0 retries that failure (job.retries).",
    )

    @field_validator("mlflow_tracking_uri")
    @classmethod
    def _tracking_uri(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*://.+|databricks", value):
            raise ValueError(f"'{value}' is not an MLflow tracking URI; use http(s)://host:port of a tracking "
                             "server, sqlite:///path.db, file:///path or databricks (or null for none)")
        return value

    @field_validator("model", "dataset")
    @classmethod
    def _s3_uri(cls, value: str) -> str:
        parse_s3_uri(value)
        return value

    @property
    def s3_sources(self) -> dict[str, S3Location]:
        """The `s3://` inputs the job reads, by field name (`model`, `dataset`); the pods get read access to each."""
        found = {name: parse_s3_uri(getattr(self, name)) for name in ("model", "dataset")}
        return {name: location for name, location in found.items() if location is not None}

    def batch_problems(self, world_size: int) -> list[tuple[str, str]]:
        """(field, message) for a batch that does not split across `world_size` ranks, or warm-up that eats
        the run; the loader checks the cluster's world size, the workload rechecks the one it runs with."""
        problems = []
        per_step = self.micro_batch_size * world_size
        if self.global_batch_size % per_step:
            problems.append(("global_batch_size", f"{self.global_batch_size} is not a multiple of micro_batch_size x "
                             f"world size = {self.micro_batch_size} x {world_size} = {per_step}; "
                             f"use a multiple of {per_step}"))
        if self.warmup_steps >= self.max_steps:
            problems.append(("warmup_steps", f"{self.warmup_steps} warm-up steps leave none of "
                             f"max_steps={self.max_steps}; lower job.warmup_steps"))
        return problems

    def grad_accumulation(self, world_size: int) -> int:
        """Micro-batches per optimizer step on each of `world_size` workers."""
        return self.global_batch_size // (self.micro_batch_size * world_size)
