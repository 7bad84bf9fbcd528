"""The optimizer (SGD with Nesterov momentum) and its learning-rate schedule (one cycle)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ampbench.train.config import TrainConfig


@dataclass(frozen=True)
class OneCycle:
    """Learning-rate factor per step: linear warm-up to 1, then linear decay to 0 at the end."""

    total_steps: int
    warmup_fraction: float

    def __call__(self, step: int) -> float:
        warmup = max(1, round(self.total_steps * self.warmup_fraction))
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (self.total_steps - step) / max(1, self.total_steps - warmup))


def build_optimizer(
    model: nn.Module, config: TrainConfig, lr: torch.Tensor, fused: bool
) -> torch.optim.SGD:
    """SGD with Nesterov momentum, its momentum buffers made (as zeros) up front, reading its
    learning rate from the tensor `lr` (the loop fills it in place: a CUDA graph replays it).

    Fused SGD creates missing buffers with torch.empty_like and fills them in its first step,
    unless the GradScaler finds an inf there and the kernel returns early: then the next step
    uses uninitialised memory as momentum (weights of 1e25 after one skipped fp16 step). Zero
    buffers make no difference otherwise: without dampening the first step's buffer is the
    gradient either way. They are also optimizer state that is resident before the first step.
    """
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=lr,
        momentum=config.momentum,
        nesterov=True,
        weight_decay=config.weight_decay,
        fused=fused,
    )
    for parameter in model.parameters():
        optimizer.state[parameter]["momentum_buffer"] = torch.zeros_like(parameter)
    return optimizer
