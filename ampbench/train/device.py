"""The device an arm runs on, what it is, what software drives it, and the seeds."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import random

import numpy as np
import torch

from ampbench import __version__
from ampbench.errors import AmpbenchError
from ampbench.results import DeviceRecord, Versions
from ampbench.train.precision import cpu_capability, cpu_name


def pick_device(name: str, local_rank: int | None = None) -> torch.device:
    """The device `name` means here (`cuda` becomes `cuda:<current>`, or under torchrun
    `cuda:<LOCAL_RANK>`: one GPU per process), made current."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise AmpbenchError(
            f"--device: '{name}' is not a device (auto, cpu, cuda, cuda:N)"
        ) from None
    if device.type not in ("cpu", "cuda"):
        raise AmpbenchError(f"--device {name}: only cpu and cuda are supported")
    if device.type == "cpu":
        return device
    if not torch.cuda.is_available():
        raise AmpbenchError(f"--device {name}: no CUDA GPU is visible to this process")
    index = device.index
    if index is not None and local_rank is not None:
        raise AmpbenchError(
            f"--device {name}: under torchrun each process takes cuda:$LOCAL_RANK; give "
            "--device cuda or auto"
        )
    if index is None:
        index = torch.cuda.current_device() if local_rank is None else local_rank
    if index >= torch.cuda.device_count():
        raise AmpbenchError(
            f"--device {name}: this process sees {torch.cuda.device_count()} CUDA GPU(s)"
        )
    device = torch.device("cuda", index)
    # set_device needs an index; calls that take no device (empty_cache) then act on this one.
    torch.cuda.set_device(device)
    return device


def device_record(device: torch.device) -> DeviceRecord:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return DeviceRecord(
            "cuda", torch.cuda.get_device_name(device), f"compute capability {major}.{minor}"
        )
    return DeviceRecord("cpu", cpu_name(), cpu_capability())


def software_versions() -> Versions:
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return Versions(
        ampbench=__version__,
        torch=torch.__version__,
        # Read, not imported: see models._torchvision.
        torchvision=importlib.metadata.version("torchvision"),
        cuda=torch.version.cuda,
        cudnn=cudnn,
        python=platform.python_version(),
    )


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        # cuBLAS needs this before its first call to be deterministic.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # Both ways (an earlier run may have turned them on), and only on a change: the call
    # imports torch._inductor. warn_only: CUDA's adaptive pooling has no deterministic backward.
    if deterministic or torch.are_deterministic_algorithms_enabled():
        torch.use_deterministic_algorithms(deterministic, warn_only=True)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = not deterministic
