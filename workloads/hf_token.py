"""The Hugging Face token of `job.hf_token_secret`, fetched at start and kept in the process.

Every process that talks to the Hub (the driver, each Ray Train worker) calls `install_token(job)`:
it reads the secret from AWS Secrets Manager through boto3's default credential chain (on EKS: the
Pod Identity agent, the same path the checkpoints take to S3; on EC2: the instance profile) and
sets `HF_TOKEN` in this process's environment only. huggingface_hub reads `HF_TOKEN` on every
request (huggingface_hub 1.33, utils/_auth.py `get_token` -> `_get_token_from_environment`), so
`snapshot_download`, `AutoTokenizer`/`AutoModel.from_pretrained` and `datasets.load_dataset` all
send it, and nothing is written to disk (unlike `huggingface_hub.login`, which saves the token
under HF_HOME). The token never travels through Ray: not in the runtime env, not in the train loop
config, not in an object; each process fetches its own copy.

`scrub(text)` replaces the token in any text (an exception message, say) with `***`.
"""

from __future__ import annotations

import json
import os

from config.errors import FAILED, UserError

TOKEN_ENV = "HF_TOKEN"
MASK = "***"
SECRETS_TIMEOUT_S = 10
"""Seconds to connect to and to read from Secrets Manager (one attempt each, two in all)."""

_installed: set[str] = set()
_arns: dict[str, str] = {}  # secret id as configured -> the complete ARN Secrets Manager answered with


class TokenError(UserError, RuntimeError):
    """The token could not be fetched; the message names the secret and the field, never the value. Found while
    running (exit 1); a command that does not catch it prints it through `config.errors.run_cli`."""

    exit_code = FAILED


def token_from_secret_string(value: str) -> str:
    """The token from a secret's SecretString: the bare token, or a JSON object with an `HF_TOKEN` or
    `token` key (what the console's key/value editor writes)."""
    text = value.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if isinstance(data, dict):
            for key in (TOKEN_ENV, "token"):
                if isinstance(data.get(key), str) and data[key].strip():
                    return data[key].strip()
            raise TokenError(f"the secret is a JSON object without an '{TOKEN_ENV}' or 'token' key (keys: "
                             f"{', '.join(sorted(data)) or 'none'}); store the bare token, or "
                             f'{{"{TOKEN_ENV}": "hf_..."}}')
    if not text:
        raise TokenError("the secret's value is empty; store a Hugging Face token (hf_...) in it")
    return text


def fetch_token(secret_id: str, *, region: str | None = None) -> str:
    """The token stored in `secret_id` (name or ARN), through boto3's default credential chain.

    The region is the ARN's, else `region`, else boto3's default ($AWS_REGION, set in the pods).
    """
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    from config.hub import TOKEN_FIELD, secret_region

    region = secret_region(secret_id) or region
    cfg = Config(connect_timeout=SECRETS_TIMEOUT_S, read_timeout=SECRETS_TIMEOUT_S,
                 retries={"max_attempts": 2, "mode": "standard"})
    try:
        client = boto3.session.Session(region_name=region).client("secretsmanager", config=cfg)
        response = client.get_secret_value(SecretId=secret_id)
        if response.get("ARN"):
            _arns[secret_id] = response["ARN"]
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 403 and "AccessDenied" not in code:
            code = f"AccessDenied (HTTP 403, {code})"  # an error body botocore could not parse, e.g. from a proxy
        denied = ("the pods' role may not read it (redeploy the stacks after setting the field; a secret under a "
                  "customer managed KMS key also needs job.hf_token_kms_key_arn)")
        hint = {"AccessDeniedException": denied, "AccessDenied": denied,
                "ResourceNotFoundException": "no such secret in this account and region; create it "
                "(docs/gated-models.md) or fix the name"}.get(code.split(" ")[0], "")
        raise TokenError(f"{TOKEN_FIELD}: cannot read secret '{secret_id}': {code}"
                         f"{'; ' + hint if hint else ''}") from None
    except BotoCoreError as exc:
        raise TokenError(f"{TOKEN_FIELD}: cannot read secret '{secret_id}': {type(exc).__name__}: {exc}") from None
    if "SecretString" not in response:
        raise TokenError(f"{TOKEN_FIELD}: secret '{secret_id}' holds binary data; store the token as text")
    try:
        return token_from_secret_string(response["SecretString"])
    except TokenError as exc:
        raise TokenError(f"{TOKEN_FIELD}: secret '{secret_id}': {exc}") from None


def install_token(secret_id: str | None, *, region: str | None = None) -> bool:
    """Fetch the token of `secret_id` and set it as $HF_TOKEN in this process; False when there is none.

    Call once per process, before the first Hub request. Raises `TokenError` (no token value in it).
    """
    if not secret_id:
        return False
    token = fetch_token(secret_id, region=region)
    _installed.add(token)
    os.environ[TOKEN_ENV] = token
    return True


def secret_arn(secret_id: str | None) -> str | None:
    """The complete ARN of a secret this process has read (a name resolved: its region travels with it, so the
    workers, which read it again, need no region setting), else `secret_id` as it is."""
    return _arns.get(secret_id, secret_id) if secret_id else secret_id


def current_token() -> str | None:
    """The token `install_token` set in this process (None when none was installed)."""
    token = os.environ.get(TOKEN_ENV)
    return token if token in _installed else None


def scrub(text: str) -> str:
    """`text` with every token this process installed replaced by `***`."""
    for token in _installed:
        if token:
            text = text.replace(token, MASK)
    return text
