"""Suggestions that turn an error into its fix: the nearest valid name for a typo (standard library `difflib`)."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable

from pydantic import BaseModel


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The closest of `choices` to `word` (difflib's ratio at least 0.6), else None."""
    close = difflib.get_close_matches(str(word), sorted(set(choices)), n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`" (did you mean 'x'?)"` for the closest of `choices` to `word`, else `""`."""
    close = closest(word, choices)
    return f" (did you mean '{close}'?)" if close else ""


def fields_at(model: type[BaseModel], path: Iterable[str | int]) -> list[str]:
    """The field names of the section model found at `path` below `model` (list items and optional values
    looked through); [] where the path leaves the models."""
    current: object = model
    for part in path:
        current = _section(current)
        if current is None:
            return []
        if isinstance(part, int):
            continue
        field = current.model_fields.get(part)
        if field is None:
            return []
        current = field.annotation
    section = _section(current)
    return list(section.model_fields) if section else []


def _section(annotation: object) -> type[BaseModel] | None:
    """The model inside `annotation` (`Model`, `list[Model]`, `Model | None`), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (list, tuple, typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _section(arg)
            if found:
                return found
    return None
