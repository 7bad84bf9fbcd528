"""The run's memory in the terms of results.Memory: a baseline, a resident mark, and peaks
read in windows (see MemoryMeter)."""

from __future__ import annotations

import dataclasses
import gc
from pathlib import Path
from typing import Any

import torch

from ampbench.errors import AmpbenchError
from ampbench.logs import log
from ampbench.process import proc_bytes
from ampbench.results import Memory
from ampbench.train import distributed
from ampbench.train.nvml import device_handle, process_used_bytes
from ampbench.world import World

MB = 2**20


class MemoryMeter:
    """The run's memory in the terms of results.Memory, read in windows.

    `start` takes the baseline (before the data upload), `mark_resident` what is resident
    before the first step; `reset_peak` opens a window and `window_peak_mb` reads its peak
    above the resident mark. Every window's peak also counts towards the run's total peak.
    CUDA: bytes the caching allocator has handed out (and reserved); CPU: the process's
    resident set and its high-water mark (VmHWM), which only this process's work moves.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.baseline = self.resident = (0.0, 0.0)  # (allocated or RSS, reserved) in bytes
        self.total_peak = (0.0, 0.0)
        self.train_peak = (0.0, 0.0)
        self.step_peak = (0.0, 0.0)  # a captured step's peak: replays allocate nothing
        self.nvml_used: float | None = None  # the largest NVML reading, bytes
        self._nvml: tuple[Any, Any] | None = None
        if self.cuda:
            try:
                self._nvml = device_handle(device)
            except Exception:  # no nvidia-ml-py or no driver: no nvidia-smi figure
                log.debug("memory: no NVML")

    @staticmethod
    def _status_bytes(field_name: str) -> float:
        found = proc_bytes(Path("/proc/self/status"), field_name)
        if found is None:  # not Linux: no figure rather than a zero that looks like one
            raise AmpbenchError(f"/proc/self/status: no {field_name} to read CPU memory from")
        return float(found)

    def _now(self) -> tuple[float, float]:
        if self.cuda:
            return float(torch.cuda.memory_allocated(self.device)), float(
                torch.cuda.memory_reserved(self.device)
            )
        return self._status_bytes("VmRSS"), 0.0

    def _peak(self) -> tuple[float, float]:
        if self.cuda:
            peak = (
                float(torch.cuda.max_memory_allocated(self.device)),
                float(torch.cuda.max_memory_reserved(self.device)),
            )
        else:
            peak = self._status_bytes("VmHWM"), 0.0
        return max(peak[0], self.step_peak[0]), max(peak[1], self.step_peak[1])

    def hold_step_peak(self) -> None:
        """Count the current window's peak in every window after it: a CUDA graph's memory is
        allocated once, while it is captured, and each replay uses it again unseen by the
        allocator's statistics. Opens a new window, like skip_window."""
        self._settle()
        self.step_peak = self._peak()
        self._reset_device_peak()

    def _settle(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def start(self) -> None:
        """The baseline: what the process holds before the run puts anything on the device."""
        self._settle()
        gc.collect()  # an earlier run's unreferenced tensors would count against this one
        if self.cuda:
            torch.cuda.empty_cache()
        self.baseline = self.total_peak = self._now()
        self._reset_device_peak()  # what came before this run is no part of it

    def mark_resident(self) -> None:
        """What is resident before the first step: data set, model, optimizer state. Opens
        the warm-up's window, which `skip_window` leaves out of every figure."""
        self._settle()
        self.resident = self._now()
        self.reset_peak()

    def skip_window(self) -> None:
        """Open a new window without counting the current one: the warm-up's peak holds
        cuDNN's autotuning, whose trial algorithms allocate scratch memory of their own."""
        self._reset_device_peak()

    def reset_peak(self) -> None:
        """Fold the current window into the total, and open a new one."""
        self._fold()
        self._reset_device_peak()

    def _reset_device_peak(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:  # "5" resets the kernel's peak-RSS mark (VmHWM) for this process
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            log.warning("cannot reset the peak-RSS mark; CPU peak memory includes earlier work")

    def _fold(self) -> tuple[float, float]:
        self._settle()
        peak = self._peak()
        self.total_peak = (max(self.total_peak[0], peak[0]), max(self.total_peak[1], peak[1]))
        return peak

    def window_peak_mb(self) -> float:
        """The peak of the current window above the resident mark; counts as training."""
        peak = self._fold()
        self.train_peak = (max(self.train_peak[0], peak[0]), max(self.train_peak[1], peak[1]))
        return max(0.0, peak[0] - self.resident[0]) / MB

    def read_nvml(self) -> None:
        """What nvidia-smi shows for this process, read at the end of the training steps (off
        the clock): the allocator keeps what it reserved, so this is the training peak's."""
        if self._nvml is None:
            return
        used = process_used_bytes(*self._nvml)
        if used is not None:
            self.nvml_used = max(self.nvml_used or 0.0, float(used))

    def record(self) -> Memory:
        self._fold()

        def above(value: tuple[float, float], base: tuple[float, float]) -> tuple[float, float]:
            return max(0.0, value[0] - base[0]) / MB, max(0.0, value[1] - base[1]) / MB

        # A resident mark below the baseline (pages freed on the way, on a CPU) is the baseline:
        # the training peak is then never above the whole run's.
        floor = (max(self.resident[0], self.baseline[0]), max(self.resident[1], self.baseline[1]))
        train, train_reserved = above(self.train_peak, floor)
        total, total_reserved = above(self.total_peak, self.baseline)
        return Memory(
            kind="cuda_allocated" if self.cuda else "cpu_rss",
            train_peak_mb=train,
            total_peak_mb=total,
            resident_mb=above(self.resident, self.baseline)[0],
            train_peak_reserved_mb=train_reserved if self.cuda else None,
            total_peak_reserved_mb=total_reserved if self.cuda else None,
            nvml_used_mb=None if self.nvml_used is None else self.nvml_used / MB,
        )

    def record_over_ranks(self, world: World) -> Memory:
        """The run's memory; under torchrun each figure the largest of any rank's."""
        memory = self.record()
        if not world.distributed:
            return memory
        names = [
            f.name for f in dataclasses.fields(memory) if isinstance(getattr(memory, f.name), float)
        ]
        peaks = distributed.max_over_ranks([getattr(memory, name) for name in names], self.device)
        return dataclasses.replace(memory, **dict(zip(names, peaks, strict=True)))  # type: ignore[arg-type]
