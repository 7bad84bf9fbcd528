"""The `ampbench` command: run the pipeline locally, compile it, or run one step by itself.

Each command's parser and handler live in a module of this package; this one puts them together
and runs the one the command line names.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Callable, Collection, Sequence
from typing import NamedTuple, NoReturn

from ampbench import __version__
from ampbench.argtypes import DefaultsHelpFormatter
from ampbench.errors import AmpbenchError
from ampbench.logs import setup_logging
from ampbench.process import skip_final_collection

Handler = Callable[[argparse.Namespace], int]


_INVALID_CHOICE = re.compile(r"invalid choice: (.*) \(choose from (.*)\)$")


class OneLineParser(argparse.ArgumentParser):
    """A parser whose every mistake is one line on stderr, exit status 2: the option, what is
    wrong, and where the help is. argparse's own prints the whole usage first."""

    def error(self, message: str) -> NoReturn:
        message = message.removeprefix("argument ")
        message = _INVALID_CHOICE.sub(
            lambda match: f"{match[1]} is not one of {match[2].replace(chr(39), '')}", message
        )
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")


class Command(NamedTuple):
    """A command: its line in `ampbench --help`, and where the function that adds its options
    and handler lives. That module is imported only for the command run (submit's and
    upload's import KFP, report's and ui's MLflow)."""

    help: str
    module: str  # of this package
    function: str

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        getattr(importlib.import_module(f"{__name__}.{self.module}"), self.function)(parser)


COMMANDS: dict[str, Command] = {
    "run": Command(
        "run the whole pipeline here with the KFP local runner", "pipeline_commands", "add_run"
    ),
    "compile": Command("write the pipeline YAML for Kubeflow", "pipeline_commands", "add_compile"),
    "submit": Command("run the pipeline on Kubeflow Pipelines", "kfp_commands", "add_submit"),
    "upload": Command(
        "store the pipeline (or a new version of it) on Kubeflow Pipelines",
        "kfp_commands",
        "add_upload",
    ),
    "prepare": Command("run the prepare step by itself", "step_commands", "add_prepare"),
    "train": Command("run the train step by itself", "train_command", "add_train"),
    "compare": Command("run the compare step by itself", "step_commands", "add_compare"),
    "report": Command(
        "rebuild a pipeline run's report from MLflow alone", "mlflow_commands", "add_report"
    ),
    "ui": Command("browse the runs in the MLflow UI", "mlflow_commands", "add_ui"),
}


def command_in(argv: Sequence[str]) -> str | None:
    """The command an argument list names: its first word that is no option (the top-level
    options take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(with_options: Collection[str] = tuple(COMMANDS)) -> argparse.ArgumentParser:
    """The command line. Every command is listed; those named in `with_options` get their
    options (the list of commands, or argparse's error naming them, needs none)."""
    parser = OneLineParser(
        prog="ampbench",
        description="What does mixed precision buy us? AMP against FP32 training: speed, "
        "memory, accuracy, as a Kubeflow pipeline tracked in MLflow.",
    )
    parser.add_argument("--version", action="version", version=f"ampbench {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        command_parser = commands.add_parser(
            name, help=command.help, formatter_class=DefaultsHelpFormatter
        )
        if name in with_options:
            command.add_options(command_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    skip_final_collection()
    named = command_in(sys.argv[1:] if argv is None else argv)
    parser = build_parser(with_options=[named] if named else [])
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named by the command's parser, whose help lists the options it has
        (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        named_by = parser if named is None else commands.choices[named]
        named_by.error(f"unrecognized arguments: {' '.join(unknown)}")
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
