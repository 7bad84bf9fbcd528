"""argparse value types shared by the commands (each refuses a bad value with a usage error
that says what is wrong), and the help format that shows every option's default."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any

from ampbench.errors import AmpbenchError
from ampbench.image_reference import check_image_reference
from ampbench.settings import number, whole_number


def positive_int(text: str) -> int:
    value = whole_number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def non_negative_int(text: str) -> int:
    value = whole_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def non_negative_number(text: str) -> float:
    value = number(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def accuracy_drop(text: str) -> float:
    """Percentage points of accuracy, or -1: no limit (a pipeline parameter cannot be None)."""
    value = number(text)
    if not (value >= 0 or value == -1):
        raise argparse.ArgumentTypeError(f"must be 0 or more (or -1: off), not {text}")
    return value


def positive_number(text: str) -> float:
    value = number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return value


def one_of(choices: Sequence[str]) -> Callable[[str], str]:
    """A value among `choices`."""

    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"'{text}' is not one of {', '.join(choices)}")
        return text

    return parse


def _json_of(kind: type, name: str) -> Callable[[str], Any]:
    """A JSON value of `kind` (list, dict), named so in its error."""

    def parse(text: str) -> Any:
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if not isinstance(value, kind):
            raise argparse.ArgumentTypeError(f"'{text}' is not a {name}")
        return value

    return parse


json_list = _json_of(list, "JSON list")  # e.g. [{"model": "resnet18", ...}]
json_object = _json_of(dict, "JSON object")  # e.g. {"nvidia.com/gpu.product": "..."}


def seed_list(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a comma-separated list of integers"
        ) from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"'{text}': give one or more distinct seeds, e.g. 0,1,2")
    return seeds


def _distinct(text: str, items: list) -> list:
    if not items or len(set(items)) != len(items):
        raise argparse.ArgumentTypeError(f"'{text}': give one or more distinct values, a,b,c")
    return items


def batch_size_list(text: str) -> list[int]:
    """`128,512`: distinct batch sizes of at least 1."""
    sizes = _distinct(
        text, [positive_int(part.strip()) for part in text.split(",") if part.strip()]
    )
    return sizes


def name_list(text: str) -> list[str]:
    """`resnet18,vit-s`: distinct names."""
    return _distinct(text, [part.strip() for part in text.split(",") if part.strip()])


def precision_list(text: str) -> list[str]:
    """`tf32,fp16,bf16`: distinct precision names, each one ampbench knows."""
    from ampbench.train import PRECISIONS

    names = name_list(text)
    for name in names:
        if name not in PRECISIONS:
            raise argparse.ArgumentTypeError(f"'{name}' is not one of {', '.join(PRECISIONS)}")
    return names


def model_name(text: str) -> str:
    """A --model value: a usage error, like any other malformed option. Only a name that is
    neither built in nor of the factory form costs an import (torchvision's list)."""
    from ampbench.train.config import model_name_problem

    problem = model_name_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"'{text}' is {problem}")
    return text


def model_list(text: str) -> list[str]:
    """`resnet18,vit-s`: distinct model names, each as --model takes it."""
    return [model_name(name) for name in name_list(text)]


def image_reference(text: str) -> str:
    try:
        return check_image_reference(text)
    except AmpbenchError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("--image").strip(": ")) from None


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, where it has one to show."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "%(default)" in text
            or "default" in text
            or action.default in (None, argparse.SUPPRESS)
            or isinstance(action.default, bool)
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"
