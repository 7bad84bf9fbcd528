"""Where the loop stands (LoopState, saved in each checkpoint) and the per-step statistics it
keeps on the device (DeviceCounters)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class LoopState:
    """Everything the loop needs to continue where it stopped; saved in each checkpoint."""

    epoch: int = 0
    step: int = 0  # next step within the epoch
    global_step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    train_time_s: float = 0.0  # completed epochs
    epoch_elapsed_s: float = 0.0  # the current epoch, up to the last checkpoint
    eval_time_s: float = 0.0
    checkpoint_time_s: float = 0.0
    # --target-accuracy: the training time and epoch at which test accuracy first reached it
    target_time_s: float | None = None
    target_epoch: int | None = None


@dataclass
class DeviceCounters:
    """Per-step statistics of the current epoch, kept on the device so that the hot loop never
    waits for the host. Changed in place only: a captured CUDA graph holds their addresses."""

    loss_sum: torch.Tensor
    correct: torch.Tensor
    steps: torch.Tensor  # steps taken this epoch
    first_bad_step: torch.Tensor  # the epoch's first step with a non-finite loss, -1 if none
    skipped: torch.Tensor  # fp16 steps the GradScaler skipped, this epoch
    skip_streak: torch.Tensor
    longest_skip_streak: torch.Tensor

    @classmethod
    def zeros(cls, device: torch.device) -> DeviceCounters:
        names = [field.name for field in dataclasses.fields(cls)]
        counters = cls(*(torch.zeros((), device=device, dtype=torch.float64) for _ in names))
        counters.reset()
        return counters

    def reset(self) -> None:
        for tensor in self.state().values():
            tensor.zero_()
        self.first_bad_step.fill_(-1)

    def state(self) -> dict[str, torch.Tensor]:
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}

    def load(self, state: dict[str, torch.Tensor]) -> None:
        for name, tensor in self.state().items():
            tensor.copy_(state[name])
