"""Write, read back and delete one object in the job's storage, the way Ray Train will reach it.

Ray Train 2.58 uploads every checkpoint through a pyarrow filesystem: the one `RunConfig` hands it (on S3,
`checkpoint.filesystem`'s: `FileSystem.from_uri` with longer timeouts), else the one it resolves itself with
`FileSystem.from_uri` (ray/train/v2/_internal/execution/storage.py `get_fs_and_path`), so its credentials
come from the AWS C++ SDK inside pyarrow, not from boto3: on EKS,
Pod Identity's container endpoint (AWS_CONTAINER_CREDENTIALS_FULL_URI + the token file), which an
old SDK does not know (apache/arrow#45603, ray#50823) and which has no IMDS fallback with a hop
limit of 1. Checking through the same call, before the preflight and before any training step,
turns a credentials or bucket-policy problem into a one-line refusal instead of a failure at the
first checkpoint upload, hours of GPU time later.
"""

from __future__ import annotations

import uuid

PROBE_DIR = ".storage-check"


def storage_problem(storage_path: str, run_name: str) -> str | None:
    """Why the job cannot write its checkpoints to `storage_path`, or None when a round trip works."""
    import pyarrow.fs as pafs

    from workloads.fsdp_finetune.checkpoint import filesystem

    try:
        fs, root = filesystem(storage_path) if "://" in storage_path else (pafs.LocalFileSystem(), storage_path)
    except Exception as exc:  # noqa: BLE001 - any resolution error is the answer
        return f"{storage_path}: cannot open ({type(exc).__name__}: {exc})"
    folder = f"{root.rstrip('/')}/{run_name}/{PROBE_DIR}"
    path = f"{folder}/{uuid.uuid4().hex}"
    payload = f"storage check {path}\n".encode()
    step = "write"
    try:
        if isinstance(fs, pafs.LocalFileSystem):
            fs.create_dir(folder, recursive=True)  # object stores need no folders
        with fs.open_output_stream(path) as out:
            out.write(payload)
        step = "read"
        with fs.open_input_stream(path) as stream:
            back = stream.read()
        if back != payload:
            return f"{storage_path}: read back {len(back)} bytes, wrote {len(payload)}"
        step = "delete"
        fs.delete_file(path)
    except Exception as exc:  # noqa: BLE001 - the error text names the cause (AccessDenied, no credentials, ...)
        return (f"{storage_path}: could not {step} {path} with the credentials Ray Train will use "
                f"(pyarrow {_pyarrow_version()}): {exc}")
    return None


def _pyarrow_version() -> str:
    import pyarrow

    return pyarrow.__version__
