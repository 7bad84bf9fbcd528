"""NVML, for what only the driver knows of a CUDA device: its energy counter (energy.py) and
the memory it counts as the process's, which nvidia-smi shows (memory.py)."""

from __future__ import annotations

import os
from typing import Any

import torch


def device_handle(device: torch.device) -> tuple[Any, Any]:
    """(pynvml, the device's NVML handle), found by the GPU's UUID: CUDA_VISIBLE_DEVICES may
    renumber devices, and NVML numbers them as the driver does. Raises where there is no NVML."""
    import pynvml

    pynvml.nvmlInit()
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    return pynvml, pynvml.nvmlDeviceGetHandleByUUID(
        uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
    )


def process_used_bytes(nvml: Any, handle: Any, pid: int | None = None) -> int | None:
    """What NVML counts as this process's memory on the device (nvidia-smi's figure), or None
    where it cannot say: in a container NVML lists host PIDs, so a lone process on the device
    is taken as this one, several are not told apart."""
    processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    pid = os.getpid() if pid is None else pid
    mine = [p for p in processes if p.pid == pid]
    if not mine and len(processes) == 1:
        mine = list(processes)
    if len(mine) != 1 or mine[0].usedGpuMemory is None:
        return None
    return int(mine[0].usedGpuMemory)
