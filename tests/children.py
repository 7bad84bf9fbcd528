"""A child process's output read as it comes, so that a test can act on a line (kill the
child once it has written a checkpoint), and the check that a resumed run began mid-epoch."""

from __future__ import annotations

import queue
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from ampbench.train.checkpoint import NAME

CHECKPOINT_LOGGED = re.compile(r" DEBUG (?:\[rank 0/\d+\] )?checkpoint (\S+)$")


class ChildOutput:
    """A child's output, read line by line as it comes, so that a test can wait for a line."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, args=(process.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        """The first line from here on that matches; fails at the end of the output, or after
        `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                message = f"no {pattern.pattern!r} in {timeout} s:\n{self.text()}"
                raise AssertionError(message) from None
            if line is None:
                raise AssertionError(f"output ended without {pattern.pattern!r}:\n{self.text()}")
            self.lines.append(line)
            if found := pattern.search(line.rstrip("\n")):
                return found

    def rest(self, timeout: float = 120) -> str:
        """The whole output, once the child has closed it."""
        self._reader.join(timeout)
        while not self._queue.empty():
            line = self._queue.get_nowait()
            if line is not None:
                self.lines.append(line)
        return self.text()

    def text(self) -> str:
        return "".join(self.lines)


def wait_for_checkpoint(output: ChildOutput, timeout: float = 240) -> Path:
    """The first checkpoint the child logs as written; it is on disk then."""
    path = Path(output.wait_for(CHECKPOINT_LOGGED, timeout)[1])
    assert NAME.match(path.name) and path.is_file(), path
    return path


def assert_resumed_mid_epoch(output: str) -> None:
    """The resumed run's log names the checkpoint it continued from: not an epoch's end."""
    found = re.search(r"resume: \S+ \(epoch (\d+), step (\d+)\)", output)
    assert found, output
    assert int(found[2]) != 0, f"resumed at an epoch boundary: {found[0]}"
