"""The variable file's `job` section: model, data, batch, optimiser, checkpoints, sharding, RayJob limits.

Every field states its constraint and its unit; the README's reference table is generated from these
descriptions (`config/reference.py`).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from config.base import INT32_MAX, _Strict, limit
from config.hub import SECRET_NAME_MAX, check_kms_key_arn, check_secret_id
from config.s3 import S3Location, parse_s3_uri

# A name or column the job passes on as written: not empty, no leading or trailing whitespace.
NON_BLANK = r"^\S(.*\S)?$"
# Counts of steps, tokens and sequences: no upper limit of their own; bounded so that products of them
# stay far inside int64 and the RayJob's JSON numbers stay exact (2**53).
STEPS_MAX = 10**9
# The longest packed sequence the job will build, tokens (a 1M-token context; the model's own limit is
# checked when it loads).
SEQ_LEN_MAX = 2**20
# RayJob activeDeadlineSeconds and ttlSecondsAfterFinished are `format: int32` seconds
# (../shared/kuberay/ray.io_rayjobs.yaml); the fields below are hours.
INT32_HOURS_MAX = INT32_MAX // 3600


# The module names PEFT matches `target_modules` against are Python identifiers, optionally dotted
# (a suffix of the module's qualified name: peft 0.21.2 tuners/tuners_utils.py `check_target_module_exists`).
MODULE_NAME = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
# Every linear layer of a Qwen2/Llama decoder layer: attention projections and the SwiGLU MLP.
LLAMA_LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraConfig(_Strict):
    """Low-rank adapters (LoRA, Hu et al. 2021) as PEFT builds them; used when `job.method` is lora."""

    rank: int = Field(
        default=16, gt=0, le=1024,
        description="Rank r of each adapter: A is r x in_features, B is out_features x r; trainable parameters "
        "grow linearly with it.",
        json_schema_extra=limit("peft LoraConfig(r) > 0; project bound 1024 (past the hidden size of the models "
                                "planned here, LoRA is no longer low-rank)"),
    )
    alpha: float = Field(
        default=32.0, gt=0, le=65536, allow_inf_nan=False,
        description="LoRA alpha: the adapter's output is scaled by alpha / rank.",
        json_schema_extra=limit("peft LoraConfig(lora_alpha); finite, positive; project bound"),
    )
    dropout: float = Field(
        default=0.0, ge=0, lt=1, allow_inf_nan=False,
        description="Dropout on the adapter's input (0: none; then every rank computes the same function).",
        json_schema_extra=limit("torch.nn.Dropout(p): [0, 1)"),
    )
    target_modules: list[str] = Field(
        default_factory=lambda: list(LLAMA_LINEAR_MODULES), min_length=1, max_length=64,
        description="Module names (or dotted name suffixes) that get adapters; each must name at least one "
        "linear layer of the model, which the plan and the workers check against the real architecture "
        "(refused with the names that exist). Default: every linear layer of a Qwen2/Llama decoder layer.",
        json_schema_extra=limit("peft LoraConfig(target_modules): suffixes of module names; the architecture's "
                                "linear layers (plan, workers)"),
    )

    @field_validator("target_modules")
    @classmethod
    def _module_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not re.fullmatch(MODULE_NAME, name):
                raise ValueError(f"'{name}' is not a module name; write names like "
                                 f"{', '.join(LLAMA_LINEAR_MODULES[:3])} (letters, digits, _ and dots)")
        duplicates = sorted({name for name in value if value.count(name) > 1})
        if duplicates:
            raise ValueError(f"{', '.join(duplicates)} listed twice; list each module once")
        return value


class ExportConfig(_Strict):
    """What the end of a run writes to the export location."""

    merge: bool = Field(
        default=True,
        description="With job.method lora: also write the base model with the adapters merged in (W + "
        "alpha/rank x B A), a plain Hugging Face model at the export location; the adapter folder (PEFT's format) "
        "is always written, under adapter/. Full fine-tuning always exports the whole model.",
    )


class JobConfig(_Strict):
    """The fine-tuning job."""

    method: Literal["full", "lora"] = Field(
        default="full",
        description="full: train every weight (fp32 master weights, 16 bytes a parameter sharded across the mesh); "
        "lora: freeze the base model (bf16 on GPU) and train low-rank adapters only (job.lora). "
        "`python -m workloads.plan` prices both and names LoRA when full fine-tuning does not fit.",
    )
    lora: LoraConfig = Field(default_factory=LoraConfig, description="The adapters, when job.method is lora.")
    export: ExportConfig = Field(default_factory=ExportConfig, description="The final export.")

    model: str = Field(min_length=1, max_length=1024, pattern=NON_BLANK,
        default="Qwen/Qwen2.5-1.5B",
        description="Hugging Face model id, local path or s3://bucket/prefix (the pods get read access to it).",
        json_schema_extra=limit("Hugging Face repo id (huggingface_hub validate_repo_id), path or s3:// URI")
    )
    dataset: str = Field(min_length=1, max_length=1024, pattern=NON_BLANK,
        default="yahma/alpaca-cleaned",
        description="Dataset: hub id, local path, s3://bucket/prefix (read access granted), or a .jsonl/.parquet file.",
        json_schema_extra=limit("Hugging Face repo id (huggingface_hub validate_repo_id), path or s3:// URI")
    )
    hf_token_secret: str | None = Field(
        default=None, max_length=2048,
        description="AWS Secrets Manager secret (its name, or its complete ARN) whose value is a Hugging Face "
        "token, for gated or private models and datasets (docs/gated-models.md). The Ray pods may read this "
        "secret and no other; the token reaches only the job's processes, never a manifest. A name is "
        f"1-{SECRET_NAME_MAX} ASCII letters, digits and /_+=.@- (botocore's secretsmanager NameType); an ARN "
        "ends in the name, '-' and the six characters Secrets Manager appends (None: no token).",
        json_schema_extra=limit("botocore secretsmanager CreateSecret.Name (NameType, 1-512); secret ARN format"),
    )
    hf_token_kms_key_arn: str | None = Field(
        default=None,
        description="ARN of the customer managed KMS key that encrypts job.hf_token_secret, when it is not "
        "Secrets Manager's default aws/secretsmanager key: the pods get kms:Decrypt on it through Secrets "
        "Manager only (None: the default key, which needs no grant).",
        json_schema_extra=limit("KMS key ARN (arn:PARTITION:kms:REGION:ACCOUNT:key/UUID or mrk-...)"),
    )
    dataset_split: str = Field(
        pattern=r"^\w+(\.\w+)*(\[[^\]]*\])?(\+\w+(\.\w+)*(\[[^\]]*\])?)*$", default="train",
        description="Dataset split to train on (datasets' split syntax: name, name[slice], a+b).",
        json_schema_extra=limit("datasets split names (datasets.splits: ^\\w+(\\.\\w+)*$), with slices and '+'")
    )
    instruction_field: str = Field(
        min_length=1, pattern=NON_BLANK, default="instruction", description="Dataset column with the prompt.",
        json_schema_extra=limit("a dataset column name: not blank")
    )
    response_field: str = Field(
        min_length=1, pattern=NON_BLANK, default="output", description="Dataset column with the answer.",
        json_schema_extra=limit("a dataset column name: not blank")
    )
    input_field: str | None = Field(min_length=1, pattern=NON_BLANK,
        default=None, description="Optional dataset column appended to the prompt (Alpaca's `input`; None: none).",
        json_schema_extra=limit("a dataset column name: not blank")
    )
    eval_fraction: float = Field(allow_inf_nan=False,
        default=0.01, ge=0, lt=0.5,
        description="Fraction held out from training: its loss is computed across all ranks every "
        "eval_every steps and after the last (0: none).",
        json_schema_extra=limit("a fraction below half: most of the data must train")
    )
    seq_len: int = Field(
        le=SEQ_LEN_MAX, default=2048, gt=0, description="Packed sequence length, tokens.",
        json_schema_extra=limit("project bound (1M tokens); the model's max positions at load")
    )
    micro_batch_size: int = Field(
        le=STEPS_MAX, default=4, gt=0, description="Sequences per GPU per forward pass.",
        json_schema_extra=limit("positive count; project bound")
    )
    global_batch_size: int = Field(le=STEPS_MAX,
        default=64, gt=0, description="Sequences per optimizer step across all GPUs (sets gradient accumulation).",
        json_schema_extra=limit("a multiple of micro_batch_size x world size (rule)")
    )
    learning_rate: float = Field(
        allow_inf_nan=False, le=1, default=2e-5, gt=0, description="Peak learning rate (AdamW).",
        json_schema_extra=limit("finite, (0, 1]: torch.optim.AdamW refuses lr < 0")
    )
    weight_decay: float = Field(
        allow_inf_nan=False, le=1, default=0.0, ge=0, description="AdamW weight decay.",
        json_schema_extra=limit("finite, [0, 1]: torch.optim.AdamW refuses < 0")
    )
    warmup_steps: int = Field(
        le=STEPS_MAX, default=20, ge=0, description="Linear warm-up, optimizer steps.",
        json_schema_extra=limit("below max_steps (rule)")
    )
    max_steps: int = Field(
        le=STEPS_MAX, default=500, gt=0, description="Optimizer steps to train.",
        json_schema_extra=limit("positive count; project bound")
    )
    max_epochs_warning: float = Field(allow_inf_nan=False,
        default=3, gt=0,
        description="Epochs of the training split that max_steps may run before the driver warns (overfitting), "
                    "epochs.",
        json_schema_extra=limit("finite, positive")
    )
    grad_clip: float = Field(
        allow_inf_nan=False, default=1.0, gt=0, description="Gradient-norm clip.",
        json_schema_extra=limit("finite, positive: torch.nn.utils.clip_grad_norm_")
    )
    mask_prompt: bool = Field(default=True, description="Exclude prompt tokens from the loss.")
    checkpoint_every: int = Field(
        le=STEPS_MAX, default=100, gt=0, description="Checkpoint interval, optimizer steps.",
        json_schema_extra=limit("positive count of optimizer steps")
    )
    keep_checkpoints: int = Field(
        le=STEPS_MAX, default=2, gt=0, description="Checkpoints kept by Ray.",
        json_schema_extra=limit("Ray CheckpointConfig(num_to_keep) must be >= 1")
    )
    report_every: int = Field(
        le=STEPS_MAX, default=10, gt=0, description="Metrics report interval, optimizer steps.",
        json_schema_extra=limit("positive count of optimizer steps")
    )
    eval_every: int = Field(le=STEPS_MAX,
        default=100, gt=0,
        description="Held-out loss and perplexity interval, optimizer steps (also after the last step).",
        json_schema_extra=limit("positive count of optimizer steps")
    )
    mlflow_tracking_uri: str | None = Field(max_length=2048,
        default=None,
        description="MLflow tracking URI (http(s)://server, sqlite:///file.db, ...) that rank 0 also sends the "
        "metrics and the job's settings to (None: TensorBoard and metrics.jsonl only).",
        json_schema_extra=limit("an MLflow tracking URI: scheme://... or databricks")
    )
    collective_timeout_minutes: float = Field(allow_inf_nan=False, le=10080,
        default=10, gt=0,
        description="Minutes a collective may wait before the process group fails it (PyTorch's default: 30); "
        "the NCCL flight recorder dumps its trace then.",
        json_schema_extra=limit("finite, positive, at most a week")
    )
    max_failures: int = Field(
        le=STEPS_MAX, default=3, ge=-1, description="Worker-group restarts before giving up (-1: unlimited).",
        json_schema_extra=limit("Ray FailureConfig(max_failures): -1 (unlimited) or more")
    )
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
    seed: int = Field(
        ge=0, le=2**32 - 1, default=42, description="Seed for data order and initialisation.",
        json_schema_extra=limit("numpy.random.seed range 0..2**32-1")
    )
    run_name: str = Field(max_length=200,
        default="qwen2.5-1.5b-sft", pattern=r"^[A-Za-z0-9_.-]+$", description="Stable run name; a rerun resumes it.",
        json_schema_extra=limit("a directory name under storage (255 bytes), Ray Train run name")
    )
    timeout_hours: float = Field(
        allow_inf_nan=False, le=INT32_HOURS_MAX, default=12, gt=0,
        description="Hours the whole job may take, retries included: each attempt's RayJob activeDeadlineSeconds, "
        "and the driver's own deadline across attempts (KubeRay restarts its clock at every retry).",
        json_schema_extra=limit("RayJob activeDeadlineSeconds: int32 seconds, at least 1 (rule)"),
    )
    retries: int = Field(
        le=INT32_MAX, default=2, ge=0, description="RayJob backoffLimit: resubmissions (each resumes).",
        json_schema_extra=limit("RayJob backoffLimit: int32"),
    )
    ttl_hours: float = Field(
        allow_inf_nan=False, le=INT32_HOURS_MAX, default=1, ge=0,
        description="Hours a finished RayJob's head (Ray dashboard, driver log) is kept; its GPU workers go "
        "as soon as the job ends (KubeRay deletionRules).",
        json_schema_extra=limit("RayJob ttlSecondsAfterFinished: int32 seconds"),
    )
    start_deadline_minutes: float = Field(
        allow_inf_nan=False, default=30, gt=0, le=24 * 60,
        description="RayJob preRunningDeadlineSeconds, minutes: how long one attempt may wait for its whole Ray "
        "cluster (GPU nodes from zero, image pull) before it fails as PreRunningDeadlineExceeded, e.g. with no "
        "GPU capacity or too small a quota. KubeRay 1.7.0 retries that failure (job.retries).",
        json_schema_extra=limit("RayJob preRunningDeadlineSeconds (int32 seconds); project bound: one day"),
    )
    watchdog: bool = Field(
        default=True,
        description="Deploy the run's watchdog (dist/ray-watchdog.k8s.yaml, `python -m workloads.watchdog`): it "
        "deletes a RayJob whose submitter cannot start or whose head crash-loops, deletes the RayCluster of a run "
        "ended by a raw `ray job stop`, and force-deletes Ray pods stuck Terminating on a lost node: the failures "
        "KubeRay 1.7.0 leaves holding GPU nodes for hours (docs/failure-handling.md).",
    )
    watchdog_period_seconds: int = Field(
        default=30, ge=5, le=600,
        description="Seconds between two looks of the watchdog at the RayJob, its cluster, pods and nodes, seconds.",
        json_schema_extra=limit("project bound: 5 s (API server load) to 10 min"),
    )
    submitter_start_minutes: float = Field(
        allow_inf_nan=False, default=3, gt=0, le=24 * 60,
        description="Minutes the RayJob's submitter pod may stay not Running (unschedulable, image pull failing) "
        "before the watchdog deletes the RayJob, minutes: KubeRay 1.7.0 counts the RayJob Running once the "
        "submitter Job exists, and then only activeDeadlineSeconds (job.timeout_hours) would end it.",
        json_schema_extra=limit("project bound: one day"),
    )
    head_restart_limit: int = Field(
        default=3, ge=1, le=1000,
        description="Restarts of the Ray head's container after which the watchdog deletes the RayJob (a crash "
        "loop; KubeRay 1.7.0 would wait out job.start_deadline_minutes, times job.retries + 1).",
        json_schema_extra=limit("positive count; project bound"),
    )
    head_ready_minutes: float = Field(
        allow_inf_nan=False, default=10, gt=0, le=24 * 60,
        description="Minutes the Ray head pod may stay not Ready before the watchdog deletes the RayJob, minutes; "
        "below job.start_deadline_minutes (when job.watchdog is on), so the watchdog acts first.",
        json_schema_extra=limit("below job.start_deadline_minutes with job.watchdog (rule); project bound: one day"),
    )

    @field_validator("mlflow_tracking_uri")
    @classmethod
    def _tracking_uri(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*://.+|databricks", value):
            raise ValueError(f"'{value}' is not an MLflow tracking URI; use http(s)://host:port of a tracking "
                             "server, sqlite:///path.db, file:///path or databricks (or null for none)")
        return value

    @field_validator("hf_token_secret")
    @classmethod
    def _token_secret(cls, value: str | None) -> str | None:
        return None if value is None else check_secret_id(value)

    @field_validator("hf_token_kms_key_arn")
    @classmethod
    def _token_key(cls, value: str | None) -> str | None:
        return None if value is None else check_kms_key_arn(value)

    @field_validator("model", "dataset")
    @classmethod
    def _s3_uri(cls, value: str) -> str:
        if parse_s3_uri(value) is None and _looks_like_hub_id(value):
            _check_hub_id(value)
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


def _looks_like_hub_id(value: str) -> bool:
    """Whether a model or dataset reads as a Hugging Face repo id (`name` or `owner/name`) rather than a path."""
    return (not value.startswith(("/", ".", "~")) and value.count("/") <= 1
            and not value.endswith((".jsonl", ".json", ".parquet", ".csv", ".txt")))


def _check_hub_id(value: str) -> None:
    """Refuse what the Hub would refuse, with huggingface_hub's own validator (huggingface_hub/utils/_validators.py
    `validate_repo_id`: [\\w.-] in one or two parts, no '--' or '..', at most 96 characters)."""
    try:
        from huggingface_hub.utils import HFValidationError, validate_repo_id
    except ImportError:  # the deploy toolchain without the Hub client: the pods check again when they load it
        return
    try:
        validate_repo_id(value)
    except HFValidationError as exc:
        raise ValueError(f"'{value}' is neither a Hugging Face repo id nor a path ({exc}); write OWNER/NAME, "
                         "./local/path or s3://bucket/prefix") from exc
