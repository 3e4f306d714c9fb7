"""The one error the charts raise for input they cannot turn into valid manifests."""

from __future__ import annotations

from config.errors import UserError


class ChartError(UserError):
    """Manifests cannot be produced; `str()` names the file or object and says what to change (exit 2)."""
