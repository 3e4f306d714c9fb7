"""Before any GPU work: the Hub lets this job read its model (and its Hub dataset) with the token it has.

One metadata request per repository (`config.hub.hub_access`, the Hub's auth-check), each bounded by
`HUB_TIMEOUT_S`; with the Secrets Manager read before it (`workloads.hf_token`, 2 x 10 s at worst)
a missing or refused token stops the job well within a minute, naming `job.hf_token_secret`.
A Hub that does not answer is only noted: the workers' own downloads will say more, and an offline
cache (`HF_HUB_OFFLINE=1`) skips the check.
"""

from __future__ import annotations

import logging
import os

from config.hub import HUB_TIMEOUT_S, hub_access

log = logging.getLogger(__name__)


def hub_repositories(job) -> list[tuple[str, str, str]]:
    """(field, repo id, repo type) of the job's inputs that come from the Hub (not a local path, not s3://)."""
    from workloads.fsdp_finetune.data import JobSettingError, _classify
    from workloads.fsdp_finetune.model import is_local_path

    repos = []
    if not is_local_path(job.model) and not job.model.startswith("s3://"):
        repos.append(("model", job.model, "model"))
    try:
        if _classify(job.dataset).kind == "hub":
            repos.append(("dataset", job.dataset, "dataset"))
    except JobSettingError:
        pass  # a missing local path: validate_job reports it
    return repos


def hub_problems(job, *, token: str | None, timeout_s: float = HUB_TIMEOUT_S) -> list[tuple[str, str]]:
    """(field, message) for each Hub repository of the job that `token` (None: anonymous) may not read."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        log.info("HF_HUB_OFFLINE is set: Hub access not checked")
        return []
    problems = []
    for field, repo, repo_type in hub_repositories(job):
        access = hub_access(repo, token=token, repo_type=repo_type, timeout_s=timeout_s, field=f"job.{field}")
        if access.status in ("needs_token", "denied"):
            problems.append(("hf_token_secret", access.message))
        elif not access.ok:
            log.warning("%s; the workers will try", access.message)
            if access.status == "unreachable":
                _offline_here()
                break  # the other inputs would only wait for the same timeout
    return problems


def _offline_here() -> None:
    """No more Hub requests from this process (the driver's own dataset and tokenizer checks would each retry
    for about half a minute); the workers, other processes, still try. huggingface_hub and datasets read their
    offline switch at call time from these module constants (huggingface_hub constants.py, datasets config.py)."""
    import sys

    from huggingface_hub import constants

    constants.HF_HUB_OFFLINE = True
    if "datasets" in sys.modules:
        sys.modules["datasets"].config.HF_HUB_OFFLINE = True
    else:
        import datasets

        datasets.config.HF_HUB_OFFLINE = True
