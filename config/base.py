"""What every part of the variable file's model shares: the strict base model and `Problem`."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=False)


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One thing wrong with a variable file: where (dotted path) and what to do."""

    path: str
    message: str
