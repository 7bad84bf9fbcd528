"""A setting: a dataclass field that also states what it means and how a command line reads
it, so that options, pipeline parameters and their help come from one definition."""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class Setting:
    """One described field as a command-line option (and, in an experiment, a parameter)."""

    name: str
    type: type
    default: Any
    description: str
    parse: Callable[[str], Any]  # an option's text to its value
    flag: str  # the option, less its "--"


def setting(
    default: Any,
    description: str,
    *,
    parse: Callable[[str], Any] | None = None,
    flag: str | None = None,
) -> Any:
    """A field with its default (copied per instance where mutable), what it means, and as an
    option, how its text is read (default: its default's type) and its flag (default: its
    name)."""
    metadata = {"doc": description, "parse": parse, "flag": flag}
    if isinstance(default, list | dict):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def same_as(owner: type, name: str, *, default: Any = MISSING) -> Any:
    """A field that is `owner`'s setting of that name: the same description, parsing, flag
    and, unless another is given, default."""
    source = owner.__dataclass_fields__[name]  # type: ignore[attr-defined]
    value = _default(source) if default is MISSING else default
    return setting(value, source.metadata["doc"], **_option_metadata(source))


def described(cls: type) -> list[Setting]:
    """The settings of a dataclass: its fields that have a description, in order."""
    return [_as_setting(each) for each in fields(cls) if "doc" in each.metadata]


def _default(each: Field[Any]) -> Any:
    return each.default_factory() if each.default is MISSING else each.default  # type: ignore[misc,operator]


def _option_metadata(each: Field[Any]) -> dict[str, Any]:
    return {"parse": each.metadata["parse"], "flag": each.metadata["flag"]}


def whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None


def _as_setting(each: Field[Any]) -> Setting:
    default = _default(each)
    # Numbers are read by parsers whose error says what is wrong in words ("'x' is not a
    # number"), not argparse's "invalid float value".
    read = {int: whole_number, float: number}.get(type(default), type(default))
    return Setting(
        each.name,
        type(default),
        default,
        each.metadata["doc"],
        each.metadata["parse"] or read,
        each.metadata["flag"] or each.name.replace("_", "-"),
    )
