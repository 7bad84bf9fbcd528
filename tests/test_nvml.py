"""What nvidia-smi shows for the process, read through NVML: this process's entry, or a lone
process (a container sees host PIDs), never a guess among several."""

from __future__ import annotations

import os
from types import SimpleNamespace

from arms import arm_result, with_

from ampbench.compare.analysis import compare_arms
from ampbench.compare.report import render_text
from ampbench.train.nvml import process_used_bytes


def nvml(*processes: tuple[int, int | None]) -> SimpleNamespace:
    listed = [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in processes]
    return SimpleNamespace(nvmlDeviceGetComputeRunningProcesses=lambda handle: listed)


def test_this_process_s_memory_is_its_own_entry() -> None:
    me = os.getpid()
    assert process_used_bytes(nvml((me, 5 << 30), (me + 1, 1 << 30)), None) == 5 << 30
    # A container: NVML lists the host's PID; a lone process on the device is this one.
    assert process_used_bytes(nvml((123456789, 3 << 30)), None, pid=1) == 3 << 30
    # Several strangers, or no figure (some drivers): nothing rather than a guess.
    assert process_used_bytes(nvml((123456789, 1), (123456790, 2)), None, pid=1) is None
    assert process_used_bytes(nvml((me, None)), None) is None


def test_the_report_shows_nvidia_smi_s_figure_beside_the_allocator_s() -> None:
    runs = {
        p: [with_(arm_result(p, 0, 0.7, mb, 100.0), memory__nvml_used_mb=mb + 900.0)]
        for p, mb in (("fp32", 3000.0), ("amp", 1500.0))
    }
    text = render_text(compare_arms(runs))
    assert "Memory as nvidia-smi shows it, amp: 2,400 MB (NVML) against 1,500 MB allocated" in text
    assert "nvidia-smi counts the CUDA context" in text
    cpu = {p: [arm_result(p, 0, 0.7, 100.0, 100.0)] for p in ("fp32", "amp")}
    assert "nvidia-smi" not in render_text(compare_arms(cpu))
