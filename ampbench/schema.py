"""Typed records from JSON: a strict loader for the dataclasses of ampbench/results.py.

The engine runs on bare GPU machines where only torch and its usual companions are installed
(no pydantic), so the schema is plain dataclasses and this loader is its validation: every
field is checked against its annotation, unknown and missing fields are errors, and an error
names the field (`memory.train_peak_mb: expected a number, not 'abc'`).
"""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from ampbench.errors import AmpbenchError

T = TypeVar("T")


class SchemaError(ValueError):
    """A value that does not fit the schema; the message starts with the field's path."""


def read_json(path: Path, what: str) -> Any:
    """The JSON in the file at `path`, or one line naming it as not a readable `what`."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise AmpbenchError(f"{path}: not a readable {what} ({error})") from None


def load(cls: type[T], data: Any) -> T:
    """`data` (parsed JSON) as an instance of the dataclass `cls`, or SchemaError."""
    return _convert(cls, data, "")


def dump(record: Any) -> dict[str, Any]:
    """A dataclass instance as plain JSON-ready data."""
    return dataclasses.asdict(record)


def _join(where: str, name: str | int) -> str:
    if isinstance(name, int):
        return f"{where}[{name}]"
    return f"{where}.{name}" if where else name


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _fail(where: str, expected: str, value: Any) -> SchemaError:
    return SchemaError(f"{where or 'the document'}: expected {expected}, not {_describe(value)}")


def _convert(annotation: Any, value: Any, where: str) -> Any:
    origin = get_origin(annotation)
    if annotation is Any:
        return value
    if origin in (Union, types.UnionType):
        options = [option for option in get_args(annotation) if option is not type(None)]
        if value is None:
            if len(options) < len(get_args(annotation)):
                return None
            raise _fail(where, "a value", value)
        errors = []
        for option in options:
            try:
                return _convert(option, value, where)
            except SchemaError as error:
                errors.append(error)
        raise errors[0]
    if origin is Literal:
        if value not in get_args(annotation):
            allowed = ", ".join(repr(v) for v in get_args(annotation))
            raise _fail(where, f"one of {allowed}", value)
        return value
    if dataclasses.is_dataclass(annotation):
        return _record(annotation, value, where)
    if origin is list:
        if not isinstance(value, list):
            raise _fail(where, "a list", value)
        (item,) = get_args(annotation)
        return [_convert(item, v, _join(where, i)) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise _fail(where, "an object", value)
        _, item = get_args(annotation)
        return {k: _convert(item, v, _join(where, k)) for k, v in value.items()}
    if annotation is bool:
        if not isinstance(value, bool):
            raise _fail(where, "true or false", value)
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(where, "a whole number", value)
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _fail(where, "a number", value)
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise _fail(where, "text", value)
        return value
    raise TypeError(f"{where}: the schema uses {annotation!r}, which this loader does not know")


def _record(cls: Any, value: Any, where: str) -> Any:
    if not isinstance(value, dict):
        raise _fail(where, "an object", value)
    hints = get_type_hints(cls)
    fields = {field.name: field for field in dataclasses.fields(cls)}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise SchemaError(f"{_join(where, unknown[0])}: not a field of this schema")
    values = {}
    for name, field in fields.items():
        if name in value:
            values[name] = _convert(hints[name], value[name], _join(where, name))
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise SchemaError(f"{_join(where, name)}: missing")
    return cls(**values)
