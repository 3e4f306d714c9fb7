"""The tier's fine-tune across both containers (issue 34 point 3): what the test watches in S3 and on the hosts.

`Watch` polls, once a second on a thread of its own, what a user could see of the run: the checkpoints Ray's
checkpoint manager has registered (its snapshot in S3), the steps in rank 0's metrics.jsonl in S3, whether the
worker host runs a Ray container, whether `ray job logs --follow` has ended. Each change becomes a line of the
timeline, with its time since the submission. The kill itself is ordered by the test (the first checkpoint
registered in S3), not by this thread.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import dataclass, field

SNAPSHOT = "checkpoint_manager_snapshot.json"  # ray/train/v2/_internal/constants.py, Ray 2.58.0
METRICS = "metrics.jsonl"  # workloads/fsdp_finetune/metrics.py METRICS_FILE


def s3_key(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key.rstrip("/")


@dataclass
class RunInS3:
    s3: object
    run_dir: str
    """s3://bucket/.../<run_name>: Ray's checkpoints, its snapshot, rank 0's metrics.jsonl."""
    export_uri: str

    def _get(self, uri: str) -> str | None:
        bucket, key = s3_key(uri)
        try:
            return self.s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode()
        except self.s3.exceptions.NoSuchKey:
            return None

    def latest_checkpoint(self) -> str | None:
        from workloads.fsdp_finetune.train_hooks import latest_in_snapshot

        return latest_in_snapshot(self._get(f"{self.run_dir}/{SNAPSHOT}"))

    def metrics(self) -> list[dict]:
        text = self._get(f"{self.run_dir}/{METRICS}") or ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def exported_weights(self) -> dict | None:
        from safetensors.torch import load

        bucket, key = s3_key(f"{self.export_uri}/model.safetensors")
        try:
            return load(self.s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        except self.s3.exceptions.NoSuchKey:
            return None


@dataclass
class Watch:
    run: RunInS3
    worker: object  # tests.ec2_tier.hosts.Host
    follow: object | None = None  # the `ray job logs --follow` process
    events: list[tuple[float, str]] = field(default_factory=list)
    steps: list[tuple[float, int, bool]] = field(default_factory=list)
    """(time, last step in metrics.jsonl, whether a resumed attempt wrote it), at each change."""
    start: float = field(default_factory=time.monotonic)

    def __post_init__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._lock = threading.Lock()

    def mark(self, text: str) -> float:
        t = time.monotonic() - self.start
        with self._lock:
            self.events.append((t, text))
        return t

    def begin(self) -> Watch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        with contextlib.suppress(Exception):
            self._observe({})

    def _loop(self) -> None:
        seen: dict = {}
        while not self._stop.wait(1.0):
            with contextlib.suppress(Exception):
                self._observe(seen)

    def _observe(self, seen: dict) -> None:
        latest = self.run.latest_checkpoint()
        if latest and latest != seen.get("latest"):
            seen["latest"] = latest
            self.mark(f"checkpoint registered in S3: {latest}")
        rows = [r for r in self.run.metrics() if "loss" in r]
        if rows:
            step = max(r["step"] for r in rows)
            if step != seen.get("step"):
                seen["step"] = step
                resumed = {r.get("resumed_from_step") for r in rows if r.get("resumed_from_step")}
                self.steps.append((time.monotonic() - self.start, step, bool(resumed)))
                self.mark(f"metrics.jsonl in S3 up to step {step}"
                          + (f" (resumed from step {min(resumed)})" if resumed else ""))
        running = self.worker.containers() == ["ray_container"]
        if running != seen.get("worker"):
            seen["worker"] = running
            self.mark("worker host: Ray container running" if running else "worker host: no Ray container")
        if self.follow is not None and self.follow.poll() is not None and not seen.get("ended"):
            seen["ended"] = True
            self.mark(f"`ray job logs --follow` ended (exit {self.follow.returncode})")

    def first(self, prefix: str, after: float = 0.0) -> float | None:
        with self._lock:
            return next((t for t, text in self.events if t >= after and text.startswith(prefix)), None)

    def render(self, title: str) -> str:
        with self._lock:
            lines = [f"{t:7.1f} s  {text}" for t, text in sorted(self.events)]
        return f"timeline: {title}\n" + "\n".join(lines)
