"""What each --precision means on the device at hand, settled before any training starts.

fp32   strict FP32: TF32 off for matmuls and for cuDNN convolutions (cuDNN allows TF32 by
       default, which would quietly make an "FP32" baseline TF32 on Ampere and newer GPUs)
tf32   FP32 storage with TF32 tensor-core math allowed (CUDA, compute capability 8.0+)
fp16   autocast float16 + GradScaler (CUDA)
bf16   autocast bfloat16, no scaler (CPU, or CUDA with native bf16: compute capability 8.0+)
amp    fp16 on CUDA, bf16 on CPU
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

import torch

from ampbench.components.train import PRECISIONS
from ampbench.errors import AmpbenchError

AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Precision:
    requested: str
    name: str  # the resolved arm: fp32, tf32, fp16 or bf16
    device_type: str

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return AUTOCAST_DTYPES.get(self.name)

    @property
    def grad_scaler(self) -> bool:
        return self.name == "fp16"

    @property
    def tf32(self) -> bool:
        """TF32 for matmuls and cuDNN convolutions alike (off for every other arm)."""
        return self.name == "tf32"

    @property
    def autocast_dtype_name(self) -> str | None:
        return (
            None if self.autocast_dtype is None else str(self.autocast_dtype).removeprefix("torch.")
        )

    def autocast(self) -> AbstractContextManager[object]:
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.autocast_dtype)

    def describe(self) -> dict[str, object]:
        return {
            "precision": self.requested,
            "resolved_precision": self.name,
            "autocast_dtype": self.autocast_dtype_name,
            "grad_scaler": self.grad_scaler,
            "tf32_matmul": self.tf32,
            "tf32_cudnn": self.tf32,
        }


def resolve(requested: str, device: torch.device) -> Precision:
    """The precision arm `requested` means on `device`, or a clear error if it cannot run there."""
    if requested not in PRECISIONS:
        raise AmpbenchError(f"--precision: '{requested}' is not one of {', '.join(PRECISIONS)}")
    cuda = device.type == "cuda"
    name = ("fp16" if cuda else "bf16") if requested == "amp" else requested
    if name in ("fp16", "tf32") and not cuda:
        raise AmpbenchError(
            f"--precision {requested}: {name} needs a CUDA GPU; this run is on {device.type} "
            "(on CPU use fp32, bf16 or amp)"
        )
    if cuda and name == "tf32" and torch.cuda.get_device_capability(device) < (8, 0):
        raise AmpbenchError(
            f"--precision tf32: {torch.cuda.get_device_name(device)} has no TF32 (needs compute "
            "capability 8.0 or newer)"
        )
    # Native bf16 only (compute capability 8.0+): torch.cuda.is_bf16_supported() also accepts
    # the emulated bf16 of a V100 or T4, far slower than fp32 and no arm to measure.
    if cuda and name == "bf16" and torch.cuda.get_device_capability(device) < (8, 0):
        raise AmpbenchError(
            f"--precision {requested}: {torch.cuda.get_device_name(device)} does not support "
            "bfloat16; use fp16"
        )
    return Precision(requested=requested, name=name, device_type=device.type)


@contextmanager
def math_mode(precision: Precision) -> Iterator[None]:
    """Set the TF32 switches for the run, and put back what was there before."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = precision.tf32
    torch.backends.cudnn.allow_tf32 = precision.tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
