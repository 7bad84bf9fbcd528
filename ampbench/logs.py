"""Logging and progress that suit both a terminal and a KFP pod, and know their rank.

Under torchrun (ampbench.world) only rank 0 draws progress and logs
at INFO, so that N processes do not print N copies of the same lines.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from types import TracebackType
from typing import TextIO

from tqdm import tqdm

from ampbench.world import world_from_env

log = logging.getLogger("ampbench")


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is when a line is logged: a handler that kept the stream
    of its set-up would write to a closed file once a test harness has swapped it back."""

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


def setup_logging(verbose: bool = False) -> None:
    """Plain timestamped lines on stderr; the rank is named once there is more than one."""
    world = world_from_env()
    prefix = f"[rank {world.rank}/{world.size}] " if world.distributed else ""
    handler = _StderrHandler()
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s %(levelname)s {prefix}%(message)s", "%H:%M:%S")
    )
    log.handlers[:] = [handler]
    log.propagate = False
    if not world.main:
        log.setLevel(logging.WARNING)
    else:
        log.setLevel(logging.DEBUG if verbose else logging.INFO)


def _format_seconds(seconds: float) -> str:
    seconds = max(0, int(seconds))
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


class Progress:
    """A tqdm bar on a terminal; elsewhere (KFP logs, CI, the steps of `ampbench run`) a plain
    line at the first update, so that the shortest epoch shows its rate, then one every
    `interval` s.

    Both show the count, the rate and the ETA.
    """

    def __init__(self, total: int, desc: str, unit: str = "it", interval: float = 10.0) -> None:
        self.total = total
        self.desc = desc
        self.unit = unit
        self.interval = interval
        self.count = 0
        self._lock = threading.Lock()
        self._start = time.perf_counter()
        self._last_line: float | None = None
        enabled = world_from_env().main
        self._bar = (
            tqdm(
                total=total, desc=desc, unit=unit, unit_scale=True, dynamic_ncols=True, leave=False
            )
            if enabled and sys.stderr.isatty()
            else None
        )
        self._plain = enabled and self._bar is None

    def update(self, n: int = 1) -> None:
        """Count n more; safe from several threads (decoders, S3 transfer threads)."""
        with self._lock:
            self.count += n
            if self._bar is not None:
                self._bar.update(n)
                return
            now = time.perf_counter()
            if not self._plain:
                return
            last = self._last_line
            if last is None or (now - last >= self.interval and self.count < self.total):
                self._last_line = now
                log.info("%s", self._line(now))

    def _line(self, now: float) -> str:
        elapsed = now - self._start
        rate = self.count / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.count) / rate if rate > 0 else float("nan")
        eta_text = _format_seconds(eta) if rate > 0 else "?"
        percent = 100.0 * self.count / self.total if self.total else 100.0
        return (
            f"{self.desc}: {self.count}/{self.total} {self.unit} ({percent:.0f}%), "
            f"{rate:,.1f} {self.unit}/s, elapsed {_format_seconds(elapsed)}, ETA {eta_text}"
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
