"""Instance catalog: hardware facts per EC2 instance type (and AZs per region), loaded from `instances.yaml`.

The catalog is data, not code, so adding an instance type is a one-line change that every
derived value (pod sizes, EFA devices, cost, MFU) picks up.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

CATALOG_FILE = Path(__file__).with_name("instances.yaml")


class InstanceType(BaseModel):
    """One EC2 instance type as the project needs to know it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="EC2 instance type, e.g. g6.12xlarge.")
    gpus: int = Field(ge=0, description="NVIDIA GPUs on the instance.")
    gpu_model: str | None = Field(default=None, description="GPU model name (None for CPU types).")
    gpu_memory_gib: int = Field(default=0, ge=0, description="Memory per GPU, GiB.")
    gpu_visible_memory_mib: int = Field(
        default=0, ge=0, description="Memory CUDA reports per GPU (nvidia-smi's total, below the nominal), MiB."
    )
    gpu_bf16_tflops: float = Field(default=0.0, ge=0, description="Dense bf16 peak per GPU, TFLOP/s.")
    vcpus: int = Field(gt=0, description="vCPUs.")
    memory_gib: int = Field(gt=0, description="Nominal memory, GiB.")
    efa_interfaces: int = Field(ge=0, description="Maximum EFA interfaces (0: no EFA).")
    gpudirect_rdma: bool = Field(description="EFA can access GPU memory directly (GPUDirect RDMA).")
    network_gbps: float = Field(gt=0, description="Nominal network bandwidth, Gbit/s.")
    nvme_gib: int = Field(ge=0, description="Total local NVMe instance store, GiB (0: none).")
    usd_per_hour: float = Field(gt=0, description="On-demand list price, USD per hour.")

    @property
    def has_efa(self) -> bool:
        """Whether the type supports at least one EFA interface."""
        return self.efa_interfaces > 0


class Catalog(BaseModel):
    """All supported instance types, keyed by name, and the date of their prices."""

    model_config = ConfigDict(frozen=True)

    price_date: str = Field(description="Date (ISO) the prices were read.")
    instances: dict[str, InstanceType] = Field(description="Instance types by name.")
    regions: dict[str, list[str]] = Field(default_factory=dict, description="AZ letters by region name.")

    def get(self, name: str) -> InstanceType | None:
        """The instance type called `name`, or None when the catalog does not list it."""
        return self.instances.get(name)

    def availability_zones(self, region: str) -> list[str] | None:
        """The region's AZ names (e.g. us-east-2a), or None when the catalog does not list the region."""
        letters = self.regions.get(region)
        return None if letters is None else [f"{region}{letter}" for letter in letters]


@cache
def load_catalog(path: Path = CATALOG_FILE) -> Catalog:
    """Parse the catalog file once per process; GPU-model facts are folded into each type."""
    raw = yaml.safe_load(path.read_text())
    models = raw["gpu_models"]
    instances = {}
    for name, fields in raw["instances"].items():
        extra = models[fields["gpu_model"]] if fields.get("gpu_model") else {}
        instances[name] = InstanceType(name=name, **extra, **fields)
    regions = {region: [str(letter) for letter in letters] for region, letters in (raw.get("regions") or {}).items()}
    return Catalog(price_date=str(raw["price_date"]), instances=instances, regions=regions)
