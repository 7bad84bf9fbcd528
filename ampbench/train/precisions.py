"""The precision registry: one entry per --precision, all that the engine, the FLOP accounting,
the comparison and the report know of it. A new precision is one entry in REGISTRY.

Free of torch, so that a command line can list the names quickly; precision.py turns an entry
into torch settings on the device at hand.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class CpuRule(enum.Enum):
    """How an arm runs on a CPU."""

    NATIVE = "native"  # every CPU runs it at full speed (fp32)
    FEATURES = "features"  # native where the CPU has a feature for it, else emulated
    EMULATED = "emulated"  # no CPU has native math for it: only ever emulated (fp8)
    CUDA_ONLY = "cuda-only"  # a CUDA mode that does not exist elsewhere, not even emulated (tf32)


@dataclass(frozen=True)
class Arm:
    """A precision as it runs: what autocast, scaling, TF32 and float8 it uses, what a device
    needs to run it natively, and how reports and FLOP accounting name it."""

    name: str
    label: str  # how the verdict and the report name it
    autocast: str | None  # the torch dtype autocast runs in, by name; None: no autocast
    cuda_capability: tuple[int, int]  # the compute capability of its tensor cores
    peak: str  # its field in flops.Peaks: the datasheet figure MFU divides by
    cpu: CpuRule
    # The suffix of the cpu_native_features() names that make it native on a CPU
    # (CpuRule.FEATURES only): "BF16" takes AVX512_BF16, AMX-BF16 and Arm's BF16.
    cpu_features: str = ""
    grad_scaler: bool = False
    tf32: bool = False  # TF32 allowed for matmuls and cuDNN (strict IEEE FP32 otherwise)
    fp8_recipe: str | None = None  # torchao's float8 recipe for the Linear layers
    # Whether --allow-emulated may run it below its capability: TF32 is a mode of the tensor
    # cores, so without them there is nothing to emulate.
    emulable: bool = True


@dataclass(frozen=True)
class Alias:
    """A name for what a device runs natively, resolved per device type."""

    name: str
    label: str  # the report's name, followed by the arm it resolved to: "AMP (fp16)"
    cuda: str
    cpu: str

    def on(self, device_type: str) -> str:
        return self.cuda if device_type == "cuda" else self.cpu


# In command-line order. The fp8 arms convert only Linear layers; the rest runs under bf16
# autocast, as torchao's float8 training is used (its examples, torchtitan).
REGISTRY: tuple[Arm | Alias, ...] = (
    Arm("fp32", "strict FP32", None, (0, 0), peak="fp32", cpu=CpuRule.NATIVE),
    Arm(
        "tf32", "TF32", None, (8, 0), peak="tf32", cpu=CpuRule.CUDA_ONLY, tf32=True,
        emulable=False,
    ),
    Arm(
        "fp16", "fp16 autocast", "float16", (7, 0), peak="fp16", cpu=CpuRule.FEATURES,
        cpu_features="FP16", grad_scaler=True,
    ),
    Arm(
        "bf16", "bf16 autocast", "bfloat16", (8, 0), peak="bf16", cpu=CpuRule.FEATURES,
        cpu_features="BF16",
    ),
    Alias("amp", "AMP", cuda="fp16", cpu="bf16"),
    Arm(
        "fp8", "FP8 training (tensorwise scales)", "bfloat16", (8, 9), peak="fp8",
        cpu=CpuRule.EMULATED, fp8_recipe="tensorwise",
    ),
    Arm(
        "fp8-rowwise", "FP8 training (rowwise scales)", "bfloat16", (8, 9), peak="fp8",
        cpu=CpuRule.EMULATED, fp8_recipe="rowwise",
    ),
)  # fmt: skip

ARMS: dict[str, Arm] = {entry.name: entry for entry in REGISTRY if isinstance(entry, Arm)}
ALIASES: dict[str, Alias] = {entry.name: entry for entry in REGISTRY if isinstance(entry, Alias)}
PRECISIONS = tuple(entry.name for entry in REGISTRY)
# Float8 training of the nn.Linear layers (torchao), each a recipe: tensorwise or rowwise scales.
FP8_RECIPES = {arm.name: arm.fp8_recipe for arm in ARMS.values() if arm.fp8_recipe}
# The pair the published experiment compares, and so the pipeline's default arms.
BASELINE_PRECISION = "fp32"
AMP_PRECISION = "amp"


def arm_of(requested: str, device_type: str) -> Arm:
    """The arm a --precision name runs on a device type (an alias resolved)."""
    alias = ALIASES.get(requested)
    return ARMS[alias.on(device_type) if alias else requested]
