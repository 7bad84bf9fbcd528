"""The `ampbench` command: run the pipeline locally, compile it, or run one step by itself.

Each command's parser and handler live in a module of this package; this one puts them together
and runs the one the command line names.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from ampbench import __version__
from ampbench.argtypes import DefaultsHelpFormatter
from ampbench.errors import AmpbenchError
from ampbench.logs import setup_logging
from ampbench.process import skip_final_collection

Handler = Callable[[argparse.Namespace], int]

# Each command: its line in `ampbench --help`, and the function that adds its options and
# handler. That function's module is imported only for the command run (submit's and upload's
# import KFP, report's and ui's MLflow).
COMMANDS: dict[str, tuple[str, str]] = {
    "run": (
        "run the whole pipeline here with the KFP local runner",
        "pipeline_commands:add_run",
    ),
    "compile": ("write the pipeline YAML for Kubeflow", "pipeline_commands:add_compile"),
    "submit": ("run the pipeline on Kubeflow Pipelines", "kfp_commands:add_submit"),
    "upload": (
        "store the pipeline (or a new version of it) on Kubeflow Pipelines",
        "kfp_commands:add_upload",
    ),
    "prepare": ("run the prepare step by itself", "step_commands:add_prepare"),
    "train": ("run the train step by itself", "train_command:add_train"),
    "compare": ("run the compare step by itself", "step_commands:add_compare"),
    "report": ("rebuild a pipeline run's report from MLflow alone", "mlflow_commands:add_report"),
    "ui": ("browse the runs in the MLflow UI", "mlflow_commands:add_ui"),
}


def command_in(argv: Sequence[str]) -> str | None:
    """The command an argument list names: its first word that is no option (the top-level
    options take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line. Every command is listed; with `only` None all get their options, with
    `only` a command's name that command alone, with any other word none (the list of
    commands, or argparse's error naming them, needs no command's options)."""
    parser = argparse.ArgumentParser(
        prog="ampbench",
        description="What does mixed precision buy us? AMP against FP32 training: speed, "
        "memory, accuracy, as a Kubeflow pipeline tracked in MLflow.",
    )
    parser.add_argument("--version", action="version", version=f"ampbench {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")
    for name, (line, adds) in COMMANDS.items():
        command = commands.add_parser(name, help=line, formatter_class=DefaultsHelpFormatter)
        if only is None or only == name:
            module, function = adds.split(":")
            getattr(importlib.import_module(f"{__name__}.{module}"), function)(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    skip_final_collection()
    parser = build_parser(only=command_in(sys.argv[1:] if argv is None else argv) or "")
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        setup_logging(args.verbose)  # a malformed $RANK is one line too
        return handler(args)
    except AmpbenchError as error:
        print(f"ampbench: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("ampbench: interrupted", file=sys.stderr)
        return 130
