"""The pipeline's parameters as `ampbench submit` options, one per parameter, made from the
compiled pipeline's own inputs so that a parameter the pipeline gains is an option at once."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ampbench.argtypes import number, whole_number


@dataclass(frozen=True)
class PipelineParameter:
    """One input of the pipeline function, as the compiled pipeline declares it."""

    name: str
    type: str  # kfp's type name: String, Integer, Float, Boolean, List, Dict
    default: Any
    description: str | None

    @property
    def dest(self) -> str:
        return f"pipeline_param_{self.name}"


# Flags named otherwise than the parameter: `experiment` is MLflow's, not KFP's.
RENAMED_FLAGS = {"experiment": "mlflow-experiment"}


def pipeline_parameters() -> list[PipelineParameter]:
    """The pipeline's parameters (not artifacts), in the order of its signature."""
    from ampbench.pipelines.pipeline import build_pipeline

    inputs = build_pipeline().component_spec.inputs or {}
    return [
        PipelineParameter(name, spec.type, spec.default, spec.description)
        for name, spec in inputs.items()
        if spec.type in _KINDS
    ]


def pipeline_description() -> str | None:
    from ampbench.pipelines.pipeline import build_pipeline

    return build_pipeline().description


def _scalar(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _list_parser(default: Any) -> Callable[[str], list]:
    """A comma-separated list (0,1,2) or a JSON list; of integers when the default is."""
    integers = isinstance(default, list) and bool(default)
    integers = integers and all(type(item) is int for item in default)

    def parse(text: str) -> list:
        text = text.strip()
        if text.startswith("["):
            try:
                items = json.loads(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"'{text}' is not a JSON list") from None
        else:
            items = [_scalar(part.strip()) for part in text.split(",") if part.strip()]
        if integers and not all(type(item) is int for item in items):
            raise argparse.ArgumentTypeError(f"'{text}' is not a list of integers, e.g. 0,1,2")
        return items

    return parse


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"'{text}' is not a JSON object")
    return value


_KINDS = {
    "String": "text",
    "Integer": "integer",
    "Float": "number",
    "Boolean": "true/false",
    "List": "comma-separated or JSON list",
    "Dict": "JSON object",
}


def add_pipeline_options(
    parser: argparse.ArgumentParser, parameters: list[PipelineParameter]
) -> None:
    group = parser.add_argument_group(
        "pipeline parameters",
        "Only those given are sent; the others keep the compiled pipeline's defaults.",
    )
    taken = {option for action in parser._actions for option in action.option_strings}
    for parameter in parameters:
        flag = "--" + RENAMED_FLAGS.get(parameter.name, parameter.name.replace("_", "-"))
        if flag in taken:
            flag = "--param-" + parameter.name.replace("_", "-")
        described = (parameter.description or f"pipeline parameter {parameter.name}").rstrip(".")
        shown = json.dumps(parameter.default) if parameter.type != "String" else parameter.default
        text = f"{described} ({_KINDS[parameter.type]}; pipeline default: {shown})"
        options: dict[str, Any] = {
            "dest": parameter.dest,
            "default": argparse.SUPPRESS,
            "help": text.replace("%", "%%"),
        }
        if parameter.type == "Boolean":
            options["action"] = argparse.BooleanOptionalAction
        else:
            options["metavar"] = flag.removeprefix("--").replace("-", "_").upper()
            options["type"] = {
                "String": str,
                "Integer": whole_number,
                "Float": number,
                "List": _list_parser(parameter.default),
                "Dict": _json_object,
            }[parameter.type]
        group.add_argument(flag, **options)
        taken.add(flag)
