"""The variable file: its typed model, the instance catalog and the one loader.

The bottom floor: every other folder may import it; it imports (and reads the files of) none of them.
"""

from config.catalog import InstanceType, load_catalog
from config.loader import DEFAULT_FILE, ConfigError, load_config, load_or_exit, resolve_path
from config.model import ClusterConfig, PodResources, Problem, WorkerGroup

__all__ = [
    "DEFAULT_FILE",
    "ClusterConfig",
    "ConfigError",
    "InstanceType",
    "PodResources",
    "Problem",
    "WorkerGroup",
    "load_catalog",
    "load_config",
    "load_or_exit",
    "resolve_path",
]
