"""Set-up tools that serve the whole repository: the one table of pinned upstream artifacts and their fetcher
(`pins.py`, `python -m tools.pins`), the KubeRay CRDs the charts validate against (`crds.py`) and the venv
installer (`install.py`). `pins.py` and `install.py` run under the system Python before the venv exists, so they
use the standard library only.

One floor above `config`: `charts` and `stacks` read their pins from here, so this folder may import `config` only.
"""
