"""The pipeline's parameters as `ampbench submit` options, one per leaf of the experiment
(ampbench/experiment.py), whose leaves the compiled pipeline's parameters are: a parameter the
pipeline gains is an option at once, read by the leaf's own parser."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from ampbench.experiment import Parameter

KINDS = {
    str: "text",
    int: "integer",
    float: "number",
    bool: "true/false",
    list: "JSON list",
    dict: "JSON object",
}


def dest(parameter: Parameter) -> str:
    """Where a parameter's option lands in the parsed arguments (only where it was given)."""
    return f"pipeline_param_{parameter.name}"


def add_pipeline_options(parser: argparse.ArgumentParser, parameters: Sequence[Parameter]) -> None:
    group = parser.add_argument_group(
        "pipeline parameters",
        "Only those given are sent; the others keep the compiled pipeline's defaults.",
    )
    taken = {option for action in parser._actions for option in action.option_strings}
    for parameter in parameters:
        flag = "--" + parameter.flag
        if flag in taken:
            flag = "--param-" + parameter.name.replace("_", "-")
        # `run`'s flag first; the parameter's own name stays an option where it differs.
        named = "--" + parameter.name.replace("_", "-")
        flags = [flag] if named in taken | {flag} else [flag, named]
        shown = parameter.default if parameter.type is str else json.dumps(parameter.default)
        kind = KINDS[parameter.type]
        text = f"{parameter.description.rstrip('.')} ({kind}; pipeline default: {shown})"
        options: dict[str, Any] = {
            "dest": dest(parameter),
            "default": argparse.SUPPRESS,
            "help": text.replace("%", "%%"),
        }
        if parameter.type is bool:
            options["action"] = argparse.BooleanOptionalAction
        else:
            options["metavar"] = flag.removeprefix("--").replace("-", "_").upper()
            options["type"] = parameter.parse
        group.add_argument(*flags, **options)
        taken.update(flags)
