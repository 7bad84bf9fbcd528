"""A step's process: its own start-up, as an arm's results record it (results.Startup), a
quicker exit, and environment variables set for a while.

The start-up is measured from the moment the kernel started the process, so that the
interpreter's start and every import count, which no clock started inside Python could see.
Standard library only: the engine records it on bare GPU machines too.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import time
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path

from ampbench.results import Startup

STARTTIME_FIELD = 22  # of /proc/<pid>/stat, counting from 1: start time in clock ticks since boot


def process_age_s(stat: Path = Path("/proc/self/stat")) -> float | None:
    """Seconds since this process started (to the kernel's clock tick, 10 ms), or None where
    there is no /proc to tell. Against CLOCK_BOOTTIME, the clock the kernel counts the start
    time on: the wall clock can be stepped (NTP) while a process runs."""
    try:
        raw = stat.read_text()
        # Field 2, the command name, is in parentheses and may itself hold spaces or ')'.
        from_third = raw[raw.rindex(")") + 2 :].split()
        started = int(from_third[STARTTIME_FIELD - 3]) / os.sysconf("SC_CLK_TCK")
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):  # AttributeError: no BOOTTIME
        return None


def proc_bytes(path: Path, field: str) -> int | None:
    """A "Field:  N kB" line of a /proc file (/proc/self/status, /proc/meminfo) in bytes;
    None where there is none (no such file or field)."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class StartupClock:
    """Marks the process's age at two moments of an arm's start-up: when it is made (imports
    done, the device initialised) and at `state_ready` (data on the device, model and
    optimizer built: the warm-up can start)."""

    def __init__(self) -> None:
        self.device_ready_s = process_age_s()
        self.state_ready_s: float | None = None

    def state_ready(self) -> None:
        self.state_ready_s = process_age_s()

    def record(self) -> Startup | None:
        """The start-up as results record it; None where the process's age is not known."""
        if self.device_ready_s is None or self.state_ready_s is None:
            return None
        return Startup(
            total_s=self.state_ready_s,
            imports_s=self.device_ready_s,
            state_s=self.state_ready_s - self.device_ready_s,
        )


@cache  # once per process
def skip_final_collection() -> None:
    """At exit, freeze every object (gc.freeze) once the other atexit handlers have run, so
    that the interpreter's final garbage collections do not walk the millions of objects that
    torch, sympy and MLflow leave (2 to 3 s of a pipeline step's exit).
    The handlers still run and objects are still released; only cycles among them are left to
    the operating system, as at any process's end."""
    # atexit runs the last registered first: called early, this runs after later ones.
    atexit.register(gc.freeze)


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """These environment variables set for the block (for the processes it starts, or a
    library that reads them), then as they were, unset where they were unset."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
