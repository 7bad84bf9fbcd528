"""A profile of each arm, off the clock: K more training steps after the timed epochs, run as
the arm trained (eager or CUDA-graph replays) under torch.profiler, and one eager step whose
matrix FLOPs are counted by dtype. The loop puts the training state back afterwards, so no
reported figure changes.

From the profile: the share of wall time the device is busy (CUDA: kernel time; a CPU: op time
on the training thread), the share of device time in matmul and convolution work (and on CUDA
in tensor-core kernels, by kernel name), the top ops by device time, and autocast's coverage:
the share of matmul and convolution FLOPs that ran in a low-precision dtype, with the layers
that stayed fp32. The Chrome trace (gzipped JSON) opens in Perfetto.
"""

from __future__ import annotations

import gzip
import re
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from ampbench.results import OpTime, Profile
from ampbench.train.device import sync

TRACE_FILE = "trace.json.gz"
TOP_OPS = 10
# Device work that is a matrix multiplication or a convolution: aten's ops on a CPU, the
# kernels' names on CUDA (cuBLAS, CUTLASS, cuDNN).
MATMUL_CONV = re.compile(
    r"conv|gemm|\bmm\b|aten::mm|addmm|bmm|matmul|linear|_scaled_mm|scaled_dot_product|flash|"
    r"cudnn|cutlass|xmma|wgmma|hmma|winograd|implicit_gemm",
    re.IGNORECASE,
)
# Kernels that run on tensor cores, by name: HMMA/IMMA/WGMMA instructions, cuBLAS's and
# CUTLASS's tensor-op kernels (sm80_, sm90_ xmma), cuDNN's tensor-op convolutions.
TENSOR_CORE = re.compile(
    r"hmma|imma|xmma|wgmma|tensorop|16816|1688|884|_tc_|sm8\d_|sm9\d_|sm10\d_|cutlass.*_tn|"
    r"f16f16|bf16bf16|e4m3|e5m2",
    re.IGNORECASE,
)
LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)
HIGH_PRECISION = {torch.float32, torch.float64}


class DtypeFlops(TorchDispatchMode):
    """FLOPs of every op FlopCounterMode counts (matmuls, convolutions, attention), by the
    dtype of its first tensor input."""

    def __init__(self) -> None:
        super().__init__()
        self.flops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            dtype = next(t.dtype for t in tree_leaves(args) if isinstance(t, torch.Tensor))
            self.flops[str(dtype).removeprefix("torch.")] += int(
                formula(*args, **kwargs, out_val=out)
            )
        return out


@contextmanager
def layer_dtypes(model: nn.Module) -> Iterator[dict[str, torch.dtype]]:
    """The dtype each convolution and Linear layer's output took in the forward passes run
    inside (a layer autocast left in fp32 outputs float32)."""
    seen: dict[str, torch.dtype] = {}
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, LAYERS):

            def hook(_module: nn.Module, _inputs: Any, output: Any, name: str = name) -> None:
                if isinstance(output, torch.Tensor):
                    seen[name] = output.dtype

            handles.append(module.register_forward_hook(hook))
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def _device_time(event: Any, cuda: bool) -> float:
    """An averaged event's own time on the device, in µs."""
    if cuda:
        return float(getattr(event, "self_device_time_total", 0.0))
    return float(event.self_cpu_time_total)


def _is_device_work(event: Any, cuda: bool) -> bool:
    from torch.autograd import DeviceType

    if cuda:
        return event.device_type == DeviceType.CUDA
    # The profiler's own step ranges and memory records are not ops.
    return event.device_type == DeviceType.CPU and not event.key.startswith(
        ("ProfilerStep", "[memory]")
    )


def profile_arm(
    step: Callable[[int], None],
    steps: int,
    device: torch.device,
    replayed: bool,
    count_step: Callable[[], None],
    model: nn.Module,
    low_dtype: torch.dtype | None,
    trace_path: Path | None,
) -> Profile:
    """Run `step(i)` for i in range(steps) under torch.profiler, then `count_step()` once
    (an eager step) with its FLOPs counted by dtype and its layers' output dtypes read. The
    caller puts the training state back."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync(device)
    with profile(activities=activities) as profiler:
        started = time.perf_counter()
        for index in range(steps):
            step(index)
        sync(device)
        wall_s = time.perf_counter() - started
    events = [e for e in profiler.key_averages() if _is_device_work(e, cuda)]
    times = {e.key: _device_time(e, cuda) for e in events}
    device_us = sum(times.values())
    wall_us = wall_s * 1e6
    matmul_us = sum(t for name, t in times.items() if MATMUL_CONV.search(name))
    tensor_us = sum(t for name, t in times.items() if TENSOR_CORE.search(name))
    top = sorted(times.items(), key=lambda item: -item[1])[:TOP_OPS]
    counted = DtypeFlops()
    with layer_dtypes(model) as dtypes, counted:
        count_step()
    total_flops = sum(counted.flops.values())
    high_flops = sum(counted.flops.get(str(d).removeprefix("torch."), 0) for d in HIGH_PRECISION)
    trace = None
    if trace_path is not None:
        trace = write_trace(profiler, trace_path)
    return Profile(
        steps=steps,
        replayed=replayed,
        wall_ms_per_step=1e3 * wall_s / steps,
        device_busy_share=min(1.0, device_us / wall_us) if wall_us else 0.0,
        matmul_conv_share=matmul_us / device_us if device_us else 0.0,
        tensor_core_share=tensor_us / device_us if cuda and device_us else None,
        top_ops=[
            OpTime(name[:120], t / 1e3 / steps, t / device_us if device_us else 0.0)
            for name, t in top
        ],
        flops_by_dtype=dict(counted.flops),
        low_precision_flop_share=(
            (total_flops - high_flops) / total_flops
            if low_dtype is not None and total_flops
            else None
        ),
        fp32_layers=(
            sorted(name for name, dtype in dtypes.items() if dtype in HIGH_PRECISION)
            if low_dtype is not None
            else []
        ),
        trace=trace,
    )


def write_trace(profiler: Any, path: Path) -> str:
    """The profile's Chrome trace at `path`, gzipped (Perfetto opens it); its file name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ampbench-trace-") as tmp:
        raw = Path(tmp) / "trace.json"
        profiler.export_chrome_trace(str(raw))
        with raw.open("rb") as source, gzip.open(path, "wb", compresslevel=6) as target:
            shutil.copyfileobj(source, target)
    return path.name
