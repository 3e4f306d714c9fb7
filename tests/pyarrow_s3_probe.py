"""Run by tests/test_pyarrow_s3.py under a given interpreter: one S3 round trip through pyarrow's own
filesystem (as Ray Train resolves its storage path), credentials from the environment only.

Prints one JSON line: {"pyarrow": version, "ok": bool, "error": str}. No imports from the project:
the interpreter may be a bare venv with pyarrow alone.
"""

import json
import sys

import pyarrow
import pyarrow.fs as pafs

uri = sys.argv[1]
out = {"pyarrow": pyarrow.__version__, "ok": False, "error": ""}
try:
    fs, path = pafs.FileSystem.from_uri(uri)
    with fs.open_output_stream(path) as stream:
        stream.write(b"probe")
    with fs.open_input_stream(path) as stream:
        out["ok"] = stream.read() == b"probe"
except Exception as exc:  # noqa: BLE001 - reported to the test
    out["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
