"""Energy per arm, from the device's own cumulative counter: NVML's total energy on CUDA
(nvmlDeviceGetTotalEnergyConsumption), Linux powercap's RAPL zones on a CPU; elsewhere none,
and the reason why.

The counter is read where the training clock starts and stops (after the device sync, outside
the timed steps) and over the arm's whole end-to-end window; under torchrun each rank reads its
GPU and the figures are summed (on a CPU only local rank 0 reads: its processes share the
package's counter). A counter updates every `update_s`; a figure from a window too short for
that to resolve is kept and marked unreliable.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Protocol

import torch

from ampbench.errors import one_line
from ampbench.results import Energy
from ampbench.train import distributed
from ampbench.train.nvml import device_handle
from ampbench.world import World

# The powercap tree RAPL is read from; a test points this at a fake tree of its own.
POWERCAP_DIR_ENV = "AMPBENCH_POWERCAP_DIR"
POWERCAP_DIR = Path("/sys/class/powercap")
# A package zone (intel-rapl:0), not its sub-zones (intel-rapl:0:0, counted in the package's).
_PACKAGE_ZONE = re.compile(r"intel-rapl:\d+")
# A window is reliable when it spans this many of the counter's updates per reading.
RESOLVED_UPDATES = 10


class Counter(Protocol):
    name: str  # as Energy.counter records it
    update_s: float  # how often the counter moves

    def joules(self) -> float:
        """The energy since some fixed start, never decreasing."""
        ...


class NvmlCounter:
    """A GPU's total energy since the driver loaded (mJ), updated every 20-100 ms."""

    name = "nvml"
    update_s = 0.1

    def __init__(self, device: torch.device) -> None:
        self._nvml, self._handle = device_handle(device)
        self.joules()  # a GPU without the counter (before Volta) fails here, not mid-run

    def joules(self) -> float:
        return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) / 1000.0


class RaplCounter:
    """The CPU packages' RAPL energy (µJ) in a powercap tree; each zone's counter wraps at its
    max_energy_range_uj, which a reading after the wrap adds back (one wrap between readings:
    at hundreds of watts a package counter wraps every few minutes, and it is read at least at
    every epoch's start and end)."""

    name = "rapl"
    update_s = 0.001

    def __init__(self, zones: list[Path]) -> None:
        self._files = [zone / "energy_uj" for zone in zones]
        self._ranges = [int((zone / "max_energy_range_uj").read_text()) for zone in zones]
        self._last = [self._raw(path) for path in self._files]
        self._total_uj = 0

    @staticmethod
    def _raw(path: Path) -> int:
        return int(path.read_text())

    def joules(self) -> float:
        for index, path in enumerate(self._files):
            raw = self._raw(path)
            delta = raw - self._last[index]
            if delta < 0:  # wrapped
                delta += self._ranges[index]
            self._total_uj += delta
            self._last[index] = raw
        return self._total_uj / 1e6


def rapl_zones(root: Path) -> list[Path]:
    """The package zones of a powercap tree whose counters this process can read."""
    if not root.is_dir():
        return []
    zones = []
    for zone in sorted(root.iterdir()):
        if not _PACKAGE_ZONE.fullmatch(zone.name):
            continue
        try:
            int((zone / "energy_uj").read_text())
            int((zone / "max_energy_range_uj").read_text())
        except (OSError, ValueError):
            continue
        zones.append(zone)
    return zones


def find_counter(device: torch.device) -> tuple[Counter | None, str]:
    """The device's energy counter, or None and why there is none (a few words)."""
    if device.type == "cuda":
        try:
            return NvmlCounter(device), ""
        except Exception as error:  # no nvidia-ml-py, no driver, a GPU without the counter
            return None, f"no energy counter on this device (NVML: {one_line(str(error))})"
    if device.type == "cpu":
        root = Path(os.environ.get(POWERCAP_DIR_ENV) or POWERCAP_DIR)
        zones = rapl_zones(root)
        if zones:
            return RaplCounter(zones), ""
        return None, f"no energy counter on this device (no readable RAPL zone in {root})"
    return None, f"no energy counter on this device ({device.type})"


class EnergyMeter:
    """The arm's energy: `open`/`close` bracket each stretch of the training clock (close
    returns the stretch's joules, which the loop keeps with its time), `begin`/`record` the
    whole end-to-end window."""

    def __init__(self, device: torch.device, world: World) -> None:
        self.device = device
        self.world = world
        # On a CPU the local processes share one package counter: only the first reads it.
        reads = device.type == "cuda" or world.local_rank == 0
        self.counter, self.unavailable = find_counter(device) if reads else (None, "")
        self.reads = reads
        self._opened: float | None = None
        self._began: tuple[float, float] | None = None  # (joules, wall clock)
        self._window: tuple[float, float] = (0.0, 0.0)  # the end-to-end (joules, seconds)
        self.windows = 0

    def _joules(self) -> float:
        assert self.counter is not None
        return self.counter.joules()

    def begin(self) -> None:
        """The end-to-end window starts (with the warm-up)."""
        if self.counter is not None:
            self._began = (self._joules(), time.perf_counter())

    def end(self) -> None:
        """The end-to-end window ends (before anything off the record: a profile)."""
        if self.counter is not None and self._began is not None:
            self._window = (
                self._joules() - self._began[0],
                time.perf_counter() - self._began[1],
            )
            self._began = None

    def open(self) -> None:
        """A stretch of the training clock starts (call after the sync, before the clock)."""
        if self.counter is not None:
            self._opened = self._joules()

    def close(self) -> float:
        """A stretch of the training clock has stopped (call after the clock): its joules."""
        if self.counter is None or self._opened is None:
            return 0.0
        joules, self._opened = self._joules() - self._opened, None
        self.windows += 1
        return joules

    def record(self, train_j: float, train_time_s: float, trained_images: int) -> Energy:
        """The arm's energy, summed over the ranks' counters (`train_j` this rank's)."""
        self.end()
        end_to_end_j, end_to_end_s = self._window
        update_s = self.counter.update_s if self.counter is not None else 0.0
        resolved = train_time_s >= RESOLVED_UPDATES * max(1, self.windows) * update_s
        has = 1.0 if self.counter is not None else 0.0
        sums = torch.tensor(
            [train_j, end_to_end_j, has, float(self.reads), float(not resolved)],
            dtype=torch.float64,
            device=self.device,
        )
        train_j, end_to_end_j, counters, readers, unresolved = distributed.all_reduce(sums).tolist()
        if counters < readers or self.counter is None:
            reason = self.unavailable or "not every process's device has an energy counter"
            return Energy(None, reason, None, None, None, None, int(counters))
        return Energy(
            counter=self.counter.name,
            unavailable=None,
            train_j=train_j,
            end_to_end_j=end_to_end_j,
            j_per_image=train_j / trained_images,
            reliable=unresolved == 0 and end_to_end_s > 0,
            devices=int(counters),
        )
