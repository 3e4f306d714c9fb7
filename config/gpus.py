"""The GPU model and its dense bf16 peak from a CUDA device name, through the instance catalog.

Needs only PyYAML (no pydantic), so `bench/gpu_throughput.py` can load it on a bare GPU machine.
"""

from __future__ import annotations

from pathlib import Path

import yaml

CATALOG_FILE = Path(__file__).with_name("instances.yaml")


def gpu_peak_for_device(device_name: str, path: Path = CATALOG_FILE) -> tuple[str, float] | None:
    """(catalog GPU model, dense bf16 TFLOP/s) for a `torch.cuda.get_device_name()`, or None if unlisted."""
    raw = yaml.safe_load(Path(path).read_text())
    for entry in raw.get("gpu_device_names") or []:
        if entry["contains"] in device_name:
            return entry["model"], float(raw["gpu_models"][entry["model"]]["gpu_bf16_tflops"])
    return None
