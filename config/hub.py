"""Gated and private Hugging Face models: the token's secret, the known gated families, the Hub probe.

The token itself never appears in the variable file: `job.hf_token_secret` names an AWS Secrets
Manager secret (its ARN or its name) whose value is the token; the Ray pods read it at start with
their Pod Identity credentials (`workloads.hf_token`). This module knows only the names:

* `SECRET_ARN_RE`, `SECRET_NAME_RE`, `KMS_KEY_ARN_RE`: the forms the fields accept.
* `secret_iam_resource`: the IAM resource that matches exactly that secret (a name needs
  Secrets Manager's `-??????` suffix; an ARN is complete and used as it is).
* `GATED_FAMILIES` and `token_warnings`: `config check` says a token is needed for a model in a
  family the Hub gates, and which field sets it.
* `hub_access`: one metadata request to the Hub (opt-in: `workloads.plan --online`, the preflight),
  bounded in time, classified as ok / needs a token / not found / unreachable.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass
from pathlib import Path

from config.base import Problem

TOKEN_FIELD = "job.hf_token_secret"
KMS_FIELD = "job.hf_token_kms_key_arn"
DOCS = "docs/gated-models.md"

# CreateSecret's `Name`: NameType, 1-512 characters (botocore data/secretsmanager/2017-10-17/service-2.json,
# botocore 1.44.8), "ASCII letters, numbers, and the following characters: /_+=.@-" (same model's doc).
SECRET_NAME_MAX = 512
SECRET_NAME_RE = re.compile(rf"[A-Za-z0-9/_+=.@-]{{1,{SECRET_NAME_MAX}}}")
# A secret's complete ARN: the name, then the '-' and six random characters Secrets Manager appends
# (Secrets Manager user guide, "Secret ARN": arn:aws:secretsmanager:<Region>:<AccountId>:secret:<Name>-<6 chars>).
_PARTITION = r"aws(?:-cn|-us-gov|-iso(?:-[a-z])?)?"
_REGION = r"[a-z]{2}(?:-gov|-iso[a-z]*)?-[a-z]+-\d"
SECRET_ARN_RE = re.compile(
    rf"arn:(?P<partition>{_PARTITION}):secretsmanager:(?P<region>{_REGION}):(?P<account>\d{{12}}):secret:"
    rf"(?P<name>[A-Za-z0-9/_+=.@-]{{1,{SECRET_NAME_MAX}}})-(?P<suffix>[A-Za-z0-9]{{6}})")
# A KMS key ARN (key id a UUID, or mrk-<32 hex> for a multi-Region key). An alias ARN cannot be an
# IAM resource for kms:Decrypt (KMS developer guide, "Using aliases to control access": aliases in
# a policy's Resource element do not control access to the key).
KMS_KEY_ARN_RE = re.compile(
    rf"arn:(?P<partition>{_PARTITION}):kms:(?P<region>{_REGION}):(?P<account>\d{{12}}):"
    r"key/(?P<id>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|mrk-[0-9a-f]{32})")


def check_secret_id(value: str) -> str:
    """`value` if it is a complete secret ARN or a valid secret name; else ValueError saying which form."""
    if value.startswith("arn:"):
        if not SECRET_ARN_RE.fullmatch(value):
            raise ValueError(
                f"'{value}' is not a complete Secrets Manager secret ARN; copy the ARN from the console or "
                "`aws secretsmanager describe-secret --secret-id NAME --query ARN` (it ends in the name, '-' and "
                "six characters), or give the secret's name instead")
        return value
    if not SECRET_NAME_RE.fullmatch(value):
        raise ValueError(f"'{value}' is not a Secrets Manager secret name (1-{SECRET_NAME_MAX} ASCII letters, "
                         "digits and /_+=.@-) nor an ARN (arn:aws:secretsmanager:...)")
    return value


def check_kms_key_arn(value: str) -> str:
    """`value` if it is a KMS key ARN; else ValueError."""
    if not KMS_KEY_ARN_RE.fullmatch(value):
        raise ValueError(f"'{value}' is not a KMS key ARN (arn:aws:kms:REGION:ACCOUNT:key/KEY-ID); an alias or a "
                         "bare key id cannot scope kms:Decrypt: use the key's ARN (`aws kms describe-key --key-id "
                         "alias/NAME --query KeyMetadata.Arn`)")
    return value


def secret_region(secret: str) -> str | None:
    """The region of a secret given by ARN; None for a name (it lives in the job's region)."""
    match = SECRET_ARN_RE.fullmatch(secret)
    return match.group("region") if match else None


def secret_iam_resource(secret: str, *, partition: str, region: str, account: str) -> str:
    """The IAM resource that matches exactly this secret.

    An ARN is complete (its random suffix included) and used as it is. A name gets the
    `-??????` wildcard: six characters, exactly the suffix Secrets Manager appends, so
    `name-??????` matches this secret and not `name-other` or `name2` (Secrets Manager user guide,
    "Permissions policy examples": "use ?????? ... to match exactly the six random characters").
    `partition`, `region` and `account` may be CloudFormation tokens.
    """
    if SECRET_ARN_RE.fullmatch(secret):
        return secret
    return f"arn:{partition}:secretsmanager:{region}:{account}:secret:{secret}-??????"


# Families whose repositories the Hub gates (each needs the user to accept the licence on the
# model's page, then a token of that user). Checked 2025: every meta-llama/* and google/gemma*
# repository is gated, and so are the mistralai/* releases since mid-2024 (older ones are not,
# and a token does no harm there). Matched case-insensitively with fnmatch on `job.model`.
GATED_FAMILIES: dict[str, str] = {
    "meta-llama/*": "Meta Llama (Llama 2, 3, 3.1, 3.2, 3.3, 4)",
    "google/*gemma*": "Google Gemma (Gemma, CodeGemma, PaliGemma, RecurrentGemma)",
    "mistralai/*": "Mistral AI",
}


def gated_family(model: str) -> str | None:
    """The `GATED_FAMILIES` description `model` (a Hub id) falls in, else None."""
    lowered = model.lower()
    for pattern, family in GATED_FAMILIES.items():
        if fnmatch.fnmatchcase(lowered, pattern):
            return family
    return None


def needs_token_message(model: str, reason: str) -> str:
    """The one wording every check uses: why a token is needed, and which field sets it."""
    return (f"'{model}' {reason}; create a Secrets Manager secret holding a Hugging Face token with access to it "
            f"and set {TOKEN_FIELD} to its name or ARN ({DOCS})")


def token_warnings(job, *, base: Path | None = None) -> list[Problem]:
    """A warning (not an error: the model may be on this machine or in the job's S3 copy) for a model in a
    gated family with no `job.hf_token_secret`. Silent for a local directory and for `s3://`."""
    model = job.model
    if job.hf_token_secret or model.startswith("s3://") or (Path(base or ".") / model).is_dir():
        return []
    family = gated_family(model)
    if family is None:
        return []
    return [Problem(path="job.model", message=needs_token_message(
        model, f"is gated on the Hugging Face Hub ({family}): the workers get HTTP 401 without a token"))]


def token_problems(job) -> list[Problem]:
    """Errors: a KMS key for a secret that is not configured."""
    if job.hf_token_kms_key_arn and not job.hf_token_secret:
        return [Problem(path=KMS_FIELD, message=f"set only with {TOKEN_FIELD} (the key encrypts that secret); "
                        f"set {TOKEN_FIELD} or remove {KMS_FIELD}")]
    return []


HUB_TIMEOUT_S = 10.0
"""Seconds one Hub metadata request may take (connect and read) before the check gives up."""


@dataclass(frozen=True)
class HubAccess:
    """What the Hub said about one repository: `status` is ok, needs_token, denied, not_found or unreachable."""

    status: str
    message: str

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def hub_access(repo: str, *, token: str | None, repo_type: str = "model", endpoint: str | None = None,
               timeout_s: float = HUB_TIMEOUT_S, field: str = "job.model") -> HubAccess:
    """One metadata request for `repo` (the Hub's auth-check, as `HfApi.auth_check`), bounded by `timeout_s`.

    `token=None` asks anonymously (what a job without `job.hf_token_secret` sees), never with the
    token of whoever runs this. The endpoint is `endpoint`, else $HF_ENDPOINT read now (huggingface_hub
    reads it once, at import). The token never reaches the returned message.
    """
    # huggingface_hub 1.33 (utils/_http.py, hf_raise_for_status): 403 + X-Error-Code GatedRepo is
    # GatedRepoError; 401 on a repo URL, or RepoNotFound, is RepositoryNotFoundError (the Hub answers
    # 401 to an anonymous request for a private or gated repo as for a missing one). One GET, no retries.
    import httpx
    from huggingface_hub import constants
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
    where = f"{field} '{repo}'"
    try:
        # HfApi.auth_check's request (huggingface_hub 1.33 hf_api.py: GET {endpoint}/api/{type}s/{repo}/auth-check,
        # then hf_raise_for_status), sent here with a timeout, which auth_check does not take. Not repo_info:
        # a gated repository's metadata is public, only auth-check says whether this token may read its files.
        response = get_session().get(f"{endpoint}/api/{repo_type}s/{repo}/auth-check",
                                     headers=build_hf_headers(token=token if token else False), timeout=timeout_s)
        hf_raise_for_status(response)
    except GatedRepoError:
        if token:
            return HubAccess("denied", f"{where}: the token in {TOKEN_FIELD} may not read this gated repository; "
                             "accept its licence on the model's Hub page with the token's account, or use a token "
                             "of an account that has")
        return HubAccess("needs_token", needs_token_message(repo, "is gated on the Hub (HTTP 403 without a token)"))
    except RepositoryNotFoundError as exc:
        status = http_status(exc)
        if token:
            return HubAccess("denied", f"{where}: the Hub answers HTTP {status} with the token in {TOKEN_FIELD}: "
                             "the token is invalid or may not read the repository (or it does not exist); "
                             "put a valid token with access in the secret")
        return HubAccess("needs_token", needs_token_message(
            repo, f"is refused without a token (HTTP {status}: private, gated or missing)"))
    except HfHubHTTPError as exc:
        status = http_status(exc)
        if status in (401, 403):
            if token:
                return HubAccess("denied", f"{where}: the Hub refuses the token in {TOKEN_FIELD} (HTTP {status}); "
                                 "put a valid token with access to the repository in the secret")
            return HubAccess("needs_token", needs_token_message(repo, f"is refused without a token (HTTP {status})"))
        return HubAccess("unreachable", f"{where}: the Hub answered HTTP {status}")
    except (httpx.HTTPError, OSError) as exc:
        return HubAccess("unreachable", f"{where}: the Hub did not answer within {timeout_s:g} s "
                         f"({type(exc).__name__})")
    return HubAccess("ok", f"{where}: readable{' with the token' if token else ' without a token'}")


def http_status(exc: Exception) -> int | None:
    """The HTTP status of a huggingface_hub error (None when it carries no response)."""
    return getattr(getattr(exc, "response", None), "status_code", None)
