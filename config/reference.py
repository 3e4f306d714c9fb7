"""The variable-file reference table (docs/reference.md), generated from the model's field descriptions."""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from config.model import ClusterConfig

TARGET = "docs/reference.md"  # the page holding the table; `python -m config reference --write` updates it
BEGIN = "<!-- BEGIN FIELD REFERENCE (python -m config reference --write docs/reference.md) -->"
END = "<!-- END FIELD REFERENCE -->"


def _type_name(annotation) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(str(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is list:
        return f"list of {_type_name(typing.get_args(annotation)[0])}"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def _default(field) -> str:
    if field.default is not PydanticUndefined:
        value = field.default
    elif field.default_factory is not None:
        value = field.default_factory()
    else:
        return "required"
    if isinstance(value, BaseModel):
        return "(section)"
    return "null" if value is None else f"`{value}`"


def constraint_text(field) -> str:
    """The field's own constraints as written in the model: bounds, lengths, pattern, finiteness."""
    parts = []
    for meta in field.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"),
                           ("min_length", "length >="), ("max_length", "length <=")):
            value = getattr(meta, attr, None)
            if value is not None:
                parts.append(f"{sign} {value}")
        if getattr(meta, "pattern", None):
            parts.append(f"pattern `{meta.pattern}`")
        if getattr(meta, "allow_inf_nan", None) is False:
            parts.append("finite")
    return ", ".join(parts)


def limit_text(field) -> str:
    """`constraints (source)` for the reference table: what the model enforces and where the limit comes from."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    own = constraint_text(field)
    kinds = {a for a in _leaves(field.annotation) if a is not type(None)}
    if not own and "limit_source" not in extra and kinds:
        if all(typing.get_origin(k) is typing.Literal for k in kinds):
            return "one of the listed values"
        if kinds == {bool}:
            return "true or false"
    if "limit_source" in extra:
        return f"{own} ({extra['limit_source']})" if own else str(extra["limit_source"])
    if "any_value" in extra:
        return f"any: {extra['any_value']}"
    return own


def _leaves(annotation) -> list:
    """The member types of a union (or the type itself)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [leaf for arg in typing.get_args(annotation) for leaf in _leaves(arg)]
    return [annotation]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        annotation = field.annotation
        inner = typing.get_args(annotation)[0] if typing.get_origin(annotation) is list else annotation
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            rows.append(f"| `{path}` | {'list of ' if inner is not annotation else ''}section | "
                        f"{'required' if field.is_required() else ''} | {field.description} | "
                        f"{_cell(limit_text(field))} |")
            rows.extend(_rows(inner, f"{path}[].") if inner is not annotation else _rows(inner, f"{path}."))
        else:
            rows.append(f"| `{path}` | {_type_name(annotation)} | {_default(field)} | {field.description} | "
                        f"{_cell(limit_text(field))} |")
    return rows


def reference_table() -> str:
    """Markdown table of every variable-file field: path, type, default, meaning and unit, limit and its source."""
    header = ["| field | type | default | meaning (unit) | limit (source) |", "| --- | --- | --- | --- | --- |"]
    return "\n".join(header + _rows(ClusterConfig, ""))


def write_into(readme: Path) -> bool:
    """Replace the table between the markers in `readme` (a page such as TARGET); return whether it changed."""
    text = readme.read_text()
    block = f"{BEGIN}\n{reference_table()}\n{END}"
    new = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    if new != text:
        readme.write_text(new)
    return new != text


def table_in(readme: Path) -> str | None:
    """The table currently between the markers of `readme` (None when the markers are missing)."""
    match = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), readme.read_text(), flags=re.S)
    return match.group(1) if match else None
