"""The one error the charts raise for input they cannot turn into valid manifests."""

from __future__ import annotations


class ChartError(Exception):
    """Manifests cannot be produced; `str()` names the file or object and says what to change."""
