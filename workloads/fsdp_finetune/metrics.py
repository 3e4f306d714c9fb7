"""Throughput, MFU and memory figures, plus the local run's metrics file and loss curve.

FLOPs per token follow the PaLM paper's appendix B accounting, the usual MFU convention:

    flops/token = 6 * N + 12 * L * d * T

N counts the parameters that take part in a matrix multiply (every parameter, with the input
embedding counted only when it is tied to the LM head, since the lookup itself is not a matmul),
L is the layer count, d the attention width (heads x head_dim, which is the hidden size in most
models but not all) and T the sequence length; the second term is attention's
QK^T and AV products (forward + backward, the full square as PaLM counts it). Recomputation under
activation checkpointing is *not* counted: MFU measures useful work, not work done.

On CPU there is no meaningful peak to compare against, so MFU is reported as null there.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path

import torch

METRICS_FILE = "metrics.jsonl"
"""Name of the JSON Lines metrics file in a run's folder (`tracking.RunTracker`)."""


def matmul_params(model_config) -> int:
    """Parameters that take part in a matmul per token (N above), from a Hugging Face config."""
    c = model_config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    d, kv = c.hidden_size, c.num_key_value_heads * head_dim
    q = c.num_attention_heads * head_dim
    attn = d * q + 2 * d * kv + q * d + (q + 2 * kv)  # q, k, v, o projections (+ qkv biases as in Qwen2)
    mlp = 3 * d * c.intermediate_size  # gate, up, down
    norms = 2 * d
    lm_head = c.vocab_size * d
    return c.num_hidden_layers * (attn + mlp + norms) + d + lm_head


def flops_per_token(model_config, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward), `6 N + 12 L d T` with d = heads x head_dim."""
    c = model_config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return 6.0 * matmul_params(c) + 12.0 * c.num_hidden_layers * c.num_attention_heads * head_dim * seq_len


def mfu(tokens_per_s_per_device: float, model_config, seq_len: int, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation (0..1) of one device, or None without a peak (CPU)."""
    if not peak_tflops:
        return None
    return tokens_per_s_per_device * flops_per_token(model_config, seq_len) / (peak_tflops * 1e12)


def peak_memory_gib(device: torch.device) -> float:
    """Peak memory so far, GiB: CUDA max allocated on a GPU, the process's max RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    # ru_maxrss is KiB on Linux, bytes on macOS.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (2**30 if sys.platform == "darwin" else 2**20)


class MetricsLog:
    """Append-only JSON Lines file of reported metrics, one object per report (rank 0 writes it).

    On resume the entries after the checkpoint's step are dropped first, so a replayed stretch of
    steps is not logged twice.
    """

    def __init__(self, path: str | os.PathLike, *, resume_step: int = 0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step] if resume_step else []
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))

    def write(self, record: dict) -> None:
        """Append one record and flush, so a crash loses nothing already reported."""
        with self.path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """Records of a metrics file ([] when it does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_loss(metrics_path: str | os.PathLike, png_path: str | os.PathLike, *, title: str = "") -> Path | None:
    """Draw training and held-out loss (log scale; held-out from step 0) and the learning rate (right axis)
    against step into a PNG, every line in one legend; None if there are no rows."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a worker or in CI
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    records = [r for r in rows if "loss" in r]
    if not records:
        return None
    steps = [r["step"] for r in records]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(steps, [r["loss"] for r in records], color="tab:blue", marker=".", label="training loss")
    held_out = [r for r in rows if r.get("eval_loss") is not None]  # step 0's row has no training loss
    if held_out:
        ax.plot([r["step"] for r in held_out], [r["eval_loss"] for r in held_out], color="tab:green", marker="o",
                label="held-out loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (mean token cross-entropy, log scale)")
    # Loss falls by orders of magnitude in a fine-tune; a linear axis squeezes the end into a few pixels.
    ax.set_yscale("log")
    ax.grid(alpha=0.3, which="both")
    lines = ax.get_lines()
    if all("lr" in r for r in records):
        ax2 = ax.twinx()
        lines += ax2.plot(steps, [r["lr"] for r in records], color="tab:orange", alpha=0.6, label="learning rate")
        ax2.set_ylabel("learning rate")
    ax.legend(lines, [line.get_label() for line in lines], loc="upper right")
    ax.set_title(title or "loss")
    fig.tight_layout()
    png_path = Path(png_path)
    fig.savefig(png_path)
    plt.close(fig)
    return png_path
