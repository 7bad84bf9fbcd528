"""What each --precision means on the device at hand, settled before any data is read: its
registry entry (precisions.py) resolved against the device, and the TF32 switches (math_mode).

fp32 is strict: TF32 off for matmuls and for cuDNN convolutions (cuDNN allows TF32 by default,
which would quietly make an "FP32" baseline TF32 on Ampere and newer GPUs).

A precision is measured only where the device has native math for it: elsewhere autocast runs
emulation or fallback kernels (bf16 on a CPU without AVX512_BF16 is 3-8x *slower* than fp32)
and the comparison would say nothing about mixed precision. Such a run is refused, naming the
device and what it lacks, unless --allow-emulated asks for it; then it is labelled emulated.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any, TypeVar

import torch

from ampbench.errors import AmpbenchError
from ampbench.results import PrecisionRecord
from ampbench.train.fp8 import require_torchao
from ampbench.train.precisions import ARMS, PRECISIONS, Arm, CpuRule, arm_of

T = TypeVar("T")


@dataclass(frozen=True)
class Precision:
    requested: str
    name: str  # the resolved arm: fp32, tf32, fp16, bf16, fp8 or fp8-rowwise
    device_type: str
    emulated: bool = False
    support: str = "native"  # one line: why this device runs it as it does

    @property
    def arm(self) -> Arm:
        """The registry's entry for the arm that runs."""
        return ARMS[self.name]

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return None if self.arm.autocast is None else getattr(torch, self.arm.autocast)

    @property
    def grad_scaler(self) -> bool:
        return self.arm.grad_scaler

    @property
    def fp8_recipe(self) -> str | None:
        """torchao's float8 recipe for the Linear layers (fp8.convert_for_fp8), else None;
        an emulated fp8 arm converts with emulate=True."""
        return self.arm.fp8_recipe

    @property
    def tf32(self) -> bool:
        """TF32 for matmuls and cuDNN convolutions alike (off for every other arm)."""
        return self.arm.tf32

    @property
    def autocast_dtype_name(self) -> str | None:
        return self.arm.autocast

    @property
    def label(self) -> str:
        """How logs name the arm: `amp (bf16, EMULATED)`."""
        detail = [self.name] if self.name != self.requested else []
        detail += ["EMULATED"] if self.emulated else []
        return f"{self.requested} ({', '.join(detail)})" if detail else self.requested

    def autocast(self, cache_enabled: bool = True) -> AbstractContextManager[object]:
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(
            self.device_type, dtype=self.autocast_dtype, cache_enabled=cache_enabled
        )

    def record(self) -> PrecisionRecord:
        return PrecisionRecord(
            requested=self.requested,
            resolved=self.name,
            autocast_dtype=self.autocast_dtype_name,
            grad_scaler=self.grad_scaler,
            tf32=self.tf32,
            emulated=self.emulated,
            support=self.support,
        )


# -- what the CPU has ---------------------------------------------------------------------------
def _read_lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


def _cpu_flags() -> set[str]:
    for line in _read_lines("/proc/cpuinfo"):
        if line.startswith(("flags", "Features")):
            return set(line.partition(":")[2].split())
    return set()


def _torch_cpu_has(probe: str, flag: str) -> bool:
    """A torch.cpu probe where this torch has it, else the kernel's flag for the feature."""
    check = getattr(torch.cpu, probe, None)
    return bool(check()) if check is not None else flag in _cpu_flags()


def cpu_native_features() -> dict[str, bool]:
    """The CPU's native reduced-precision math, by the names a user would look up.

    oneDNN's own check (torch.ops.mkldnn._is_mkldnn_bf16_supported) is not enough: it says
    yes for any AVX-512 CPU, where bf16 runs through conversions at a fraction of fp32 speed
    (measured on an AVX-512 Xeon without AVX512_BF16: ResNet-18 steps 2.8x slower than fp32).
    """
    if platform.machine().lower() in ("aarch64", "arm64"):
        return {"BF16": "bf16" in _cpu_flags()}
    return {
        "AVX512_BF16": _torch_cpu_has("_is_avx512_bf16_supported", "avx512_bf16"),
        # Every CPU with AMX tiles (Sapphire Rapids on) has AMX-BF16.
        "AMX-BF16": _torch_cpu_has("_is_amx_tile_supported", "amx_bf16"),
        "AVX512_FP16": "avx512_fp16" in _cpu_flags(),
        "AMX-FP16": _torch_cpu_has("_is_amx_fp16_supported", "amx_fp16"),
    }


def cpu_name() -> str:
    for line in _read_lines("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def cpu_capability() -> str:
    """The CPU's reduced-precision features, as results record them."""
    features = cpu_native_features()
    return ", ".join(f"{name} {'yes' if has else 'no'}" for name, has in features.items())


def _cpu_support(arm: Arm) -> tuple[bool, str]:
    """(native, what makes it so or what is missing) for an arm the registry gives CPU
    features for (fp16, bf16) on this CPU."""
    features = {f: has for f, has in cpu_native_features().items() if f.endswith(arm.cpu_features)}
    found = [f for f, has in features.items() if has]
    if found:
        return True, f"native: {' and '.join(found)} on {cpu_name()}"
    if not features:
        return False, f"{cpu_name()} has no native {arm.name} math"
    return False, f"{cpu_name()} has no {' or '.join(features)}"


# -- resolution ---------------------------------------------------------------------------------
def resolve(requested: str, device: torch.device, allow_emulated: bool = False) -> Precision:
    """The arm `requested` means on `device`, or a clear error if it cannot run there natively
    (and emulation was not asked for)."""
    if requested not in PRECISIONS:
        raise AmpbenchError(f"--precision: '{requested}' is not one of {', '.join(PRECISIONS)}")
    if device.type == "cuda":
        return _resolve_cuda(requested, device, allow_emulated)
    arm = arm_of(requested, device.type)
    if arm.cpu is CpuRule.EMULATED:
        return _resolve_cpu_fp8(requested, arm, device, allow_emulated)
    if arm.cpu is CpuRule.CUDA_ONLY:
        raise AmpbenchError(
            f"--precision {requested}: {arm.label} is a CUDA tensor-core mode; this run is on "
            f"{device.type} (on a CPU use fp32, bf16 or amp)"
        )
    if arm.cpu is CpuRule.NATIVE:
        return Precision(requested, arm.name, device.type)
    native, support = _cpu_support(arm)
    if native:
        return Precision(requested, arm.name, device.type, support=support)
    if not allow_emulated:
        raise AmpbenchError(
            f"--precision {requested}: {support}, so {arm.name} autocast would run slow "
            "emulation kernels and measure nothing of mixed precision; run on a GPU or a CPU "
            "with it, or pass --allow-emulated to measure the emulation (labelled emulated)"
        )
    return Precision(requested, arm.name, device.type, True, f"EMULATED: {support}")


def _fp8_detail(arm: Arm, torchao: str) -> str:
    return f"torchao {torchao} float8 {arm.fp8_recipe} on the Linear layers, bf16 autocast"


def _resolve_cpu_fp8(
    requested: str, arm: Arm, device: torch.device, allow_emulated: bool
) -> Precision:
    torchao = require_torchao(requested)
    needed = arm.cuda_capability
    missing = (
        f"{cpu_name()} has no FP8 matmul (float8 training needs CUDA compute capability "
        f"{needed[0]}.{needed[1]}+)"
    )
    if not allow_emulated:
        raise AmpbenchError(
            f"--precision {requested}: {missing}; pass --allow-emulated to run its numerics "
            "with fp32 matmuls (labelled emulated)"
        )
    support = f"EMULATED: {missing}; {_fp8_detail(arm, torchao)}, fp32 matmuls"
    return Precision(requested, arm.name, device.type, True, support)


def _resolve_cuda(requested: str, device: torch.device, allow_emulated: bool) -> Precision:
    arm = arm_of(requested, device.type)
    fp8 = arm.fp8_recipe is not None
    torchao = require_torchao(requested) if fp8 else ""
    capability = torch.cuda.get_device_capability(device)
    gpu = torch.cuda.get_device_name(device)
    needed = arm.cuda_capability
    if capability >= needed:
        detail = f" ({_fp8_detail(arm, torchao)})" if fp8 else ""
        support = f"native: {gpu}, compute capability {capability[0]}.{capability[1]}{detail}"
        return Precision(requested, arm.name, device.type, support=support)
    kind = "FP8" if fp8 else arm.name
    missing = (
        f"{gpu} (compute capability {capability[0]}.{capability[1]}) has no {kind} tensor "
        f"cores (needs {needed[0]}.{needed[1]} or newer)"
    )
    if not arm.emulable:
        raise AmpbenchError(f"--precision {requested}: {missing}")
    if not allow_emulated:
        raise AmpbenchError(
            f"--precision {requested}: {missing}, so it would run emulated and measure nothing "
            "of mixed precision; pass --allow-emulated to measure it anyway (labelled emulated)"
        )
    detail = f"; {_fp8_detail(arm, torchao)}, fp32 matmuls" if fp8 else ""
    return Precision(requested, arm.name, device.type, True, f"EMULATED: {missing}{detail}")


# TF32: torch >= 2.9 keeps fp32_precision apart from the legacy allow_tf32 flags, raises where
# they disagree, and falls back to a cuDNN-wide "tf32"; so both are set, the legacy ones first.

# torch.backends' fp32_precision settings TF32 depends on; a restore also puts back oneDNN's
# matmul, which torch.set_float32_matmul_precision changes.
_TF32_SWITCHES = ("cuda.matmul", "cudnn.conv", "cudnn.rnn")
_SAVED_SWITCHES = (*_TF32_SWITCHES, "mkldnn.matmul")


def _fp32_precision_switches(names: tuple[str, ...] = _TF32_SWITCHES) -> dict[str, Any]:
    """Those settings by name; none before torch 2.9, which has only the legacy flags."""
    if not hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        return {}
    return {name: attrgetter(name)(torch.backends) for name in names}


def _legacy(read: Callable[[], T]) -> T | None:
    """A legacy setting, or None where torch refuses to read it (the two APIs disagree)."""
    try:
        return read()
    except RuntimeError:
        return None


def _set_tf32(allowed: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = allowed
    torch.backends.cudnn.allow_tf32 = allowed
    for switch in _fp32_precision_switches().values():
        switch.fp32_precision = "tf32" if allowed else "ieee"


def _check_tf32(allowed: bool) -> None:
    """Read back through both APIs; a legacy read raises where the two disagree."""
    seen: dict[str, object] = {
        name: s.fp32_precision for name, s in _fp32_precision_switches().items()
    }
    expected: dict[str, object] = {name: "tf32" if allowed else "ieee" for name in seen}
    try:
        seen["cuda.matmul.allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
        seen["cudnn.allow_tf32"] = torch.backends.cudnn.allow_tf32
    except RuntimeError as error:
        raise AmpbenchError(f"TF32 {'on' if allowed else 'off'} did not take: {error}") from error
    expected |= {"cuda.matmul.allow_tf32": allowed, "cudnn.allow_tf32": allowed}
    if seen != expected:
        raise AmpbenchError(f"TF32 {'on' if allowed else 'off'} did not take: torch has {seen}")


@contextmanager
def math_mode(precision: Precision) -> Iterator[None]:
    """Set the TF32 switches for the run, check that they took, and put back what was there."""
    matmul = _legacy(torch.get_float32_matmul_precision)
    cudnn = _legacy(lambda: torch.backends.cudnn.allow_tf32)
    # torch reads an operation's "none" as the setting it falls back to: that is what returns.
    saved = {
        name: s.fp32_precision for name, s in _fp32_precision_switches(_SAVED_SWITCHES).items()
    }
    _set_tf32(precision.tf32)
    try:
        _check_tf32(precision.tf32)
        yield
    finally:
        if matmul is not None:
            torch.set_float32_matmul_precision(matmul)
        if cudnn is not None:
            torch.backends.cudnn.allow_tf32 = cudnn
        switches = _fp32_precision_switches(_SAVED_SWITCHES)
        for name, value in saved.items():
            switches[name].fp32_precision = value
