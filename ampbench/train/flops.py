"""A training step's FLOPs and the device's peak: the inputs of achieved TFLOP/s and MFU.

FLOPs are counted by running one real step under FlopCounterMode, never worked out by hand:
matmuls (FP8's _scaled_mm included), convolutions and attention, at 2 FLOPs a multiply-add;
elementwise work is left out, as the tensor cores a peak describes do none of it. Peaks are
NVIDIA's dense datasheet figures ("with sparsity" ones, marked *, halved); an unknown GPU or
a CPU has none, and its MFU is left out rather than guessed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from ampbench.logs import log
from ampbench.results import Compute
from ampbench.train.precisions import ARMS


# -- FLOPs of one training step -----------------------------------------------------------------
def _attention_flops(
    query_shape: torch.Size,
    key_shape: torch.Size,
    value_shape: torch.Size,
    *_: object,
    **__: object,
) -> int:
    return int(flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape))


def _attention_backward_flops(
    grad_out_shape: torch.Size,
    query_shape: torch.Size,
    key_shape: torch.Size,
    value_shape: torch.Size,
    *_: object,
    **__: object,
) -> int:
    return int(
        flop_counter.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)
    )


def _cpu_attention_formulas() -> dict[object, Callable[..., int]]:
    """torch's attention formulas for the flash-attention kernel of CPUs, which its counter
    does not know (it files them under the CUDA kernels only): without them the attention of a
    ViT trained on a CPU would count as nothing. Where a torch knows that kernel, its own
    entry stays."""
    aten = torch.ops.aten
    kernels: dict[str, Callable[..., int]] = {
        "_scaled_dot_product_flash_attention_for_cpu": _attention_flops,
        "_scaled_dot_product_flash_attention_for_cpu_backward": _attention_backward_flops,
    }
    formulas: dict[object, Callable[..., int]] = {}
    for name, formula in kernels.items():
        kernel = getattr(aten, name, None)
        if kernel is not None and kernel not in flop_counter.flop_registry:
            formulas[kernel] = formula
    return formulas


def flop_counter_mode() -> FlopCounterMode:
    """FlopCounterMode with the CPU's attention kernel counted too; nothing printed."""
    return FlopCounterMode(display=False, custom_mapping=_cpu_attention_formulas())


def train_step_flops(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    autocast: AbstractContextManager[object],
) -> int:
    """The FLOPs of one training step of the eager `model` on this batch: forward under the
    arm's `autocast` and backward as autograd runs it (the first layer computes no input
    gradient). The model is left as it was (parameters, grads, buffers); random draws the step
    makes do advance the RNG.
    """
    parameters = list(model.parameters())
    saved_grads = [parameter.grad for parameter in parameters]
    buffers = list(model.buffers())
    saved_buffers = [buffer.detach().clone() for buffer in buffers]
    for parameter in parameters:
        # Backward would add into existing gradients; with None it makes fresh tensors and
        # leaves the caller's untouched.
        parameter.grad = None
    try:
        with flop_counter_mode() as counter:
            with autocast:
                loss = loss_fn(model(images), labels)
            loss.backward()
    finally:
        for parameter, grad in zip(parameters, saved_grads, strict=True):
            parameter.grad = grad
        with torch.no_grad():
            for buffer, saved in zip(buffers, saved_buffers, strict=True):
                buffer.copy_(saved)
    return int(counter.get_total_flops())


# -- peak TFLOP/s per GPU model -----------------------------------------------------------------
@dataclass(frozen=True)
class Peaks:
    """Dense peak TFLOP/s of one GPU model per precision; None where it has no such math."""

    fp32: float  # strict FP32 on the CUDA cores (no tensor cores): the fp32 arm
    tf32: float | None = None
    fp16: float | None = None  # tensor cores, FP32 accumulate where the datasheet tells
    bf16: float | None = None
    fp8: float | None = None


def _dense(with_sparsity: float) -> float:
    """A datasheet figure marked "with sparsity" (2:4 structured), as the dense rate."""
    return with_sparsity / 2


# Each entry's figures as its source prints them (the comment above it); * marks one "with
# sparsity", halved by _dense; where both are printed ("183 | 366*"), the dense one is used.
# The sources the entries name:
#   H100 datasheet: https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet
#   H100 page: https://www.nvidia.com/en-us/data-center/h100/
#   H200 page: https://www.nvidia.com/en-us/data-center/h200/
#   A100 datasheet: https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
#   L4 page: https://www.nvidia.com/en-us/data-center/l4/
#   L40S page: https://www.nvidia.com/en-us/data-center/l40s/
#   L40 page: https://www.nvidia.com/en-us/data-center/l40/
#   A10 page: https://www.nvidia.com/en-us/data-center/products/a10-gpu/
#   V100 page: https://www.nvidia.com/en-us/data-center/v100/
#   T4 page: https://www.nvidia.com/en-us/data-center/tesla-t4/
GPU_PEAKS: dict[str, Peaks] = {
    # The H100 datasheet and the H100 page, "H100 SXM" column: FP32 67, TF32 Tensor Core 989*,
    # BFLOAT16 1,979*, FP16 1,979*, FP8 3,958* TFLOPS.
    "H100 SXM": Peaks(67, _dense(989), _dense(1979), _dense(1979), _dense(3958)),
    # The H100 datasheet (2022-23 editions), "H100 PCIe" column (114 SMs, 350 W): FP32 51,
    # TF32 756*, BFLOAT16 1,513*, FP16 1,513*, FP8 3,026* TFLOPS.
    "H100 PCIe": Peaks(51, _dense(756), _dense(1513), _dense(1513), _dense(3026)),
    # The H100 page and the H100 datasheet (2024 on), "H100 NVL" column, per GPU (the 2023 edition
    # quoted a bridged pair of GPUs): FP32 60, TF32 835*, BFLOAT16 1,671*, FP16 1,671*,
    # FP8 3,341* TFLOPS.
    "H100 NVL": Peaks(60, _dense(835), _dense(1671), _dense(1671), _dense(3341)),
    # The H200 page, "H200 SXM" column (the H100 SXM's GH100 compute, more memory): FP32 67,
    # TF32 989*, BFLOAT16 1,979*, FP16 1,979*, FP8 3,958* TFLOPS.
    "H200 SXM": Peaks(67, _dense(989), _dense(1979), _dense(1979), _dense(3958)),
    # The H200 page, "H200 NVL" column: FP32 60, TF32 835*, BFLOAT16 1,671*, FP16 1,671*,
    # FP8 3,341* TFLOPS.
    "H200 NVL": Peaks(60, _dense(835), _dense(1671), _dense(1671), _dense(3341)),
    # The A100 datasheet, the same for all four (40/80 GB, PCIe/SXM): FP32 19.5, TF32 156 | 312*,
    # BFLOAT16 312 | 624*, FP16 312 | 624* TFLOPS (dense figure first). No FP8 (Ampere).
    "A100": Peaks(19.5, 156, 312, 312),
    # The L4 page: FP32 30.3, TF32 120*, FP16 242*, BFLOAT16 242*, FP8 485* TFLOPS.
    "L4": Peaks(30.3, _dense(120), _dense(242), _dense(242), _dense(485)),
    # The L40S page: FP32 91.6, TF32 183 | 366*, BFLOAT16 362.05 | 733*, FP16 362.05 | 733*,
    # FP8 733 | 1,466* TFLOPS (dense figure first).
    "L40S": Peaks(91.6, 183, 362.05, 362.05, 733),
    # The L40 page: FP32 90.5, TF32 90.5 | 181*, BFLOAT16 181.05 | 362.1*,
    # FP16 181.05 | 362.1*, FP8 362 | 724* TFLOPS (dense figure first).
    "L40": Peaks(90.5, 90.5, 181.05, 181.05, 362),
    # The A10 page: FP32 31.2, TF32 62.5 | 125*, BFLOAT16 125 | 250*, FP16 125 | 250* TFLOPS.
    "A10": Peaks(31.2, 62.5, 125, 125),
    # The V100 page (no sparsity before Ampere; "Tensor Performance" is FP16 with FP32
    # accumulate): SXM2 FP32 15.7, Tensor 125; PCIe FP32 14, Tensor 112; V100S PCIe FP32 16.4,
    # Tensor 130 TFLOPS. No TF32 or BF16 (Volta).
    "V100 SXM2": Peaks(15.7, fp16=125),
    "V100 PCIe": Peaks(14, fp16=112),
    "V100S PCIe": Peaks(16.4, fp16=130),
    # The T4 page: Single-Precision 8.1, Mixed-Precision (FP16/FP32) 65 TFLOPS. No TF32/BF16.
    "T4": Peaks(8.1, fp16=65),
}

# torch.cuda.get_device_name() strings, "NVIDIA " or "Tesla " taken off and lower-cased, to the
# table's models. Whole names only: "L4" must not take "L40S", and a variant not named here
# (a bare "H100", "A100-SXM-64GB", an H800, a MIG slice) has no peak rather than a wrong one.
_GPU_NAMES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(pattern), model)
    for pattern, model in [
        (r"h100 80gb hbm3", "H100 SXM"),  # SXM boards name their memory
        (r"h100 pcie", "H100 PCIe"),
        (r"h100 nvl", "H100 NVL"),
        (r"h200", "H200 SXM"),
        (r"h200 nvl", "H200 NVL"),
        (r"a100-sxm4-(40|80)gb|a100-pcie-40gb|a100 80gb pcie", "A100"),
        (r"l4", "L4"),
        (r"l40s", "L40S"),
        (r"l40", "L40"),
        (r"a10", "A10"),  # not the A10G, a cloud-only variant with no NVIDIA datasheet
        (r"v100-sxm2-(16|32)gb", "V100 SXM2"),
        (r"v100-pcie-(16|32)gb", "V100 PCIe"),
        (r"v100s-pcie-32gb", "V100S PCIe"),
        (r"t4", "T4"),
    ]
]


def gpu_model(device_name: str) -> str | None:
    """The table's model for a torch.cuda.get_device_name() string, or None if it is not
    listed (MIG slices, "NVIDIA H100 80GB HBM3 MIG 1g.10gb", are not listed either: a slice
    has a fraction of the peak)."""
    name = device_name.strip().lower()
    for prefix in ("nvidia ", "tesla "):
        name = name.removeprefix(prefix)
    for pattern, model in _GPU_NAMES:
        if pattern.fullmatch(name):
            return model
    return None


def peak_tflops(device_type: str, device_name: str, precision: str) -> float | None:
    """The dense peak TFLOP/s of this GPU for a resolved precision (the registry's peak key:
    both FP8 recipes run the FP8 tensor cores), or None: a CPU, a GPU not in GPU_PEAKS, a name
    that is no arm (amp), or a precision the GPU has no math for (run emulated)."""
    if device_type != "cuda" or precision not in ARMS:
        return None
    model = gpu_model(device_name)
    if model is None:
        return None
    return getattr(GPU_PEAKS[model], ARMS[precision].peak)


def achieved_tflops(flops_per_step: int, steps: int, seconds: float) -> float:
    """TFLOP/s over `seconds` of training: steps x the FLOPs of one step."""
    return flops_per_step * steps / seconds / 1e12


def mfu(achieved: float, peak: float | None) -> float | None:
    """Model FLOP/s utilisation: achieved over peak TFLOP/s; None without a peak."""
    return achieved / peak if peak else None


# -- the run's account: FLOPs per step, achieved TFLOP/s and MFU ---------------------------------
class FlopAccount:
    """The FLOPs of the run's global step, counted once (train_step_flops, or a warm-up step
    under flop_counter_mode), and the run's Compute record from them."""

    def __init__(self, device_type: str, device_name: str, precision: str, world_size: int) -> None:
        self.device_type = device_type
        self.device_name = device_name
        self.precision = precision
        self.world_size = world_size
        self.flops_per_step: int | None = None

    def record(self, rank_flops: int) -> None:
        # One rank's share of the step, times the ranks: the global step's FLOPs.
        self.flops_per_step = self.world_size * int(rank_flops)
        log.info("FLOPs per training step: %.4g (forward and backward)", self.flops_per_step)

    def compute(self, steps: int, train_time_s: float) -> Compute | None:
        """DEFINITIONS["Achieved TFLOP/s"] and ["MFU"] for `steps` trained in `train_time_s`."""
        if self.flops_per_step is None or not train_time_s > 0:
            return None
        achieved = achieved_tflops(self.flops_per_step, steps, train_time_s)
        peak = peak_tflops(self.device_type, self.device_name, self.precision)
        if peak is not None:
            peak *= self.world_size  # one device per process
        return Compute(self.flops_per_step, achieved, peak, mfu(achieved, peak))
