"""Errors that are the user's to fix: reported as one line, never as a traceback."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Set by `ampbench run` for the pipeline steps it launches: a step that fails on bad input
# writes its one-line message here so that the command can repeat it as its last word.
ERROR_FILE_ENV = "AMPBENCH_ERROR_FILE"


class AmpbenchError(Exception):
    """Bad input or an unusable environment, explained in one line that names what is wrong."""

    def __init__(self, message: str) -> None:
        # One line, whatever a file name or a member name brought into it: control
        # characters (a newline in a zip member's name) are shown escaped.
        super().__init__("".join(c if c.isprintable() else repr(c)[1:-1] for c in message))


def one_line(text: str) -> str:
    """Someone else's message (a library's, a server's) on one line, its white space single
    spaces, for an AmpbenchError or a log line."""
    return " ".join(text.split())


def record_step_error(step: str, message: str) -> None:
    """Leave a step's one-line error where the launching command can find it."""
    error_file = os.environ.get(ERROR_FILE_ENV)
    if error_file:
        with Path(error_file).open("a", encoding="utf-8") as f:
            f.write(f"{step}: {message}\n")


def step_error_message(line: str) -> str:
    """A recorded error's message, without the step name record_step_error put before it."""
    return line.split(": ", 1)[-1]


def read_step_errors(error_file: Path) -> list[str]:
    if not error_file.exists():
        return []
    return [line for line in error_file.read_text(encoding="utf-8").splitlines() if line]


@contextmanager
def reported_as_step(step: str) -> Iterator[None]:
    """Inside a pipeline step: an AmpbenchError becomes one log line and exit status 1, an
    interruption one line and 130.

    KFP would otherwise print a traceback for what is the user's input error. The step's
    process, which ends after it, skips the final garbage collections (skip_final_collection).
    """
    from ampbench.process import skip_final_collection  # which imports this module

    skip_final_collection()
    try:
        yield
    except AmpbenchError as error:
        print(f"ERROR: {step}: {error}", file=sys.stderr, flush=True)
        record_step_error(step, str(error))
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        # Ctrl-C, or a signal that stopped torchrun's processes: nothing for the user to fix.
        print(f"{step}: interrupted", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
