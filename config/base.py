"""What every part of the variable file's model shares: the strict base model and `Problem`."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=False)


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One thing wrong with a variable file: where (dotted path) and what to do."""

    path: str
    message: str


# Where a field's limit comes from, or why any value of its type is fine: kept in the field's
# `json_schema_extra`, shown in the README's field reference and required of every field by
# tests/test_config_limits.py (a field with neither a constraint nor a reason fails that test).
def limit(source: str) -> dict[str, str]:
    """`json_schema_extra` naming the source of a field's limit (the API or artifact that parses the value)."""
    return {"limit_source": source}


def minutes_up_to_a_day(*, default: float, description: str, source: str = "project bound: one day"):
    """A field of minutes: finite, above zero, at most one day (1440), which every Kubernetes seconds field it
    becomes (int32) holds; `source` names any tighter limit."""
    return Field(allow_inf_nan=False, default=default, gt=0, le=24 * 60, description=description,
                 json_schema_extra=limit(source))


def any_value(reason: str) -> dict[str, str]:
    """`json_schema_extra` saying why every value of the field's type is acceptable."""
    return {"any_value": reason}


# The largest value of a 32-bit signed integer: CloudFormation and Kubernetes `format: int32` fields,
# botocore `integer` shapes (Smithy's 32-bit integer).
INT32_MAX = 2**31 - 1
