"""Set-up tools that serve the whole repository: the one table of pinned upstream artifacts and their fetcher
(`pins.py`, `python -m tools.pins`) and the venv installer (`install.py`).

One floor above `config`: `charts` and `stacks` read their pins from here, so this folder may import `config` only.
"""
