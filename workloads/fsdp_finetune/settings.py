"""Settings checks in the driver: every bad setting refused before a worker starts, as `SOURCE: job.<field>: ...`.

`validate_job` (batch split, dataset), `token_problems` (the Hub token), `resume_problem` (a rerun past
`max_steps`) list the problems; `refuse` raises them as one `UserError` (exit 2), secrets scrubbed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from config.errors import UserError
from config.model import JobConfig
from workloads.fsdp_finetune.run_plan import RunPlan

LOCAL_SOURCE = "local job"


@dataclass(frozen=True)
class SettingProblem:
    """A job setting refused before training starts."""

    source: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}: job.{self.field}: {self.message}"


def validate_job(job: JobConfig, *, world_size: int, source: str) -> list[SettingProblem]:
    """Every check that can run in the driver: batch split for this world size, dataset and columns.

    The loader already refuses zero or negative sizes and checks the batch split for the cluster's
    world size; this rechecks the split for the world size actually used (2 locally) and looks at
    the dataset (path exists, the named columns are there) through the data module's `check_dataset`.
    """
    from workloads.fsdp_finetune.data import JobSettingError, check_dataset

    problems = [SettingProblem(source, field, message) for field, message in job.batch_problems(world_size)]
    if job.attn_implementation == "flash_attention_2" and source == LOCAL_SOURCE:
        problems.append(SettingProblem(source, "attn_implementation", "flash_attention_2 needs a GPU; use sdpa"))
    try:
        check_dataset(job)
    except JobSettingError as exc:
        problems.append(SettingProblem(source, exc.field, exc.message))
    return problems


def latest_checkpoint_step(storage_path: str, run_name: str) -> int | None:
    """The step of the run's latest checkpoint in storage (`<storage>/<run>/checkpoint_step_NNNNNNN`), or None.

    Reads only the folder names (local path or any URI pyarrow understands, such as s3://); the
    names are the `checkpoint_dir_name` that `train_func` reports each checkpoint under.
    """
    import pyarrow.fs as pafs

    from workloads.fsdp_finetune.checkpoint import filesystem
    from workloads.fsdp_finetune.train import CHECKPOINT_PREFIX

    fs, root = filesystem(storage_path)
    run_dir = f"{root.rstrip('/')}/{run_name}"
    infos = fs.get_file_info(pafs.FileSelector(run_dir, allow_not_found=True))
    steps = [int(info.base_name.removeprefix(CHECKPOINT_PREFIX)) for info in infos
             if info.type == pafs.FileType.Directory and info.base_name.startswith(CHECKPOINT_PREFIX)
             and info.base_name.removeprefix(CHECKPOINT_PREFIX).isdigit()]
    return max(steps, default=None)


def resume_problem(plan: RunPlan, *, source: str) -> SettingProblem | None:
    """A rerun under the same name whose checkpoint is past `max_steps` would export the old model: refuse it.

    Checked in the driver before any worker starts (`train_func` checks again at resume). When the
    storage cannot be read from here (no credentials on this machine), the workers' check stands.
    """
    from workloads.fsdp_finetune.train import resume_conflict

    try:
        step = latest_checkpoint_step(plan.storage_path, plan.job.run_name)
    except Exception as exc:  # noqa: BLE001 - unreadable storage: the workers check at resume
        print(f"note: could not list checkpoints in {plan.storage_path} ({exc}); checked at resume",
              file=sys.stderr)
        return None
    conflict = None if step is None else resume_conflict(step, plan.job.max_steps, plan.job.run_name)
    return SettingProblem(source, "max_steps", f"{conflict} (in {plan.storage_path})") if conflict else None


def refuse(problems: list[SettingProblem]) -> None:
    """Raise the problems as one `UserError` (exit 2, the loader's convention) when there are any, secrets scrubbed."""
    from workloads.hf_token import scrub

    if problems:
        raise UserError.of([scrub(str(problem)) for problem in problems])


def with_secret_arn(job: JobConfig) -> JobConfig:
    """`job` with `hf_token_secret` as the complete ARN the driver read (the workers then need no region)."""
    from workloads.hf_token import secret_arn

    arn = secret_arn(job.hf_token_secret)
    return job if arn == job.hf_token_secret else job.model_copy(update={"hf_token_secret": arn})


def token_problems(job: JobConfig, *, source: str, region: str | None) -> list[SettingProblem]:
    """Fetch `job.hf_token_secret` into this process ($HF_TOKEN, `workloads.hf_token`), then one bounded
    metadata request per Hub input (`workloads.preflight.hub`): a missing, unreadable or refused token is
    reported before any worker starts (within a minute: 2 x 10 s for Secrets Manager, 10 s per request)."""
    from workloads.hf_token import TokenError, current_token, install_token
    from workloads.preflight.hub import hub_problems

    try:
        install_token(job.hf_token_secret, region=region)
    except TokenError as exc:
        return [SettingProblem(source, "hf_token_secret", str(exc).removeprefix("job.hf_token_secret: "))]
    return [SettingProblem(source, field, message) for field, message in hub_problems(job, token=current_token())]
