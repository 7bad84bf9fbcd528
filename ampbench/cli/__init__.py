"""The `ampbench` command: run the pipeline locally, compile it, or run one step by itself.

Each command's parser and handler live in a module of this package; this one puts them together
and runs the one the command line names.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from ampbench import __version__
from ampbench.argtypes import DefaultsHelpFormatter
from ampbench.cli.mlflow_commands import add_report, add_ui
from ampbench.cli.pipeline_commands import add_compile, add_kfp, add_run
from ampbench.cli.step_commands import add_compare, add_prepare
from ampbench.cli.train_command import add_train
from ampbench.errors import AmpbenchError
from ampbench.logs import setup_logging
from ampbench.process import skip_final_collection

Handler = Callable[[argparse.Namespace], int]

# Each command's parser, by the names it adds: only the one run is built (submit's and
# upload's import KFP).
COMMAND_PARSERS: list[tuple[tuple[str, ...], Callable[[argparse._SubParsersAction], None]]] = [
    (("run",), add_run),
    (("compile",), add_compile),
    (("submit", "upload"), add_kfp),
    (("prepare",), add_prepare),
    (("train",), add_train),
    (("compare",), add_compare),
    (("report",), add_report),
    (("ui",), add_ui),
]


def command_in(argv: Sequence[str]) -> str | None:
    """The command an argument list names: its first word that is no option (the top-level
    options take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line; with `only` a command's name, that command's parser alone (any other
    word, or None, builds them all: for the list of commands, or argparse's error naming them)."""
    parser = argparse.ArgumentParser(
        prog="ampbench",
        description="What does mixed precision buy us? AMP against FP32 training: speed, "
        "memory, accuracy, as a Kubeflow pipeline tracked in MLflow.",
    )
    parser.add_argument("--version", action="version", version=f"ampbench {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")
    known = only in {name for names, _ in COMMAND_PARSERS for name in names}
    for names, add in COMMAND_PARSERS:
        if not known or only in names:
            add(commands)
    for command in commands.choices.values():
        command.formatter_class = DefaultsHelpFormatter
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    skip_final_collection()
    parser = build_parser(only=command_in(sys.argv[1:] if argv is None else argv))
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
