"""The numerics of fp16, measured once per fp16 arm after training, off the clock: one batch's
loss before and after the loss scale, and what fp16 would make of its parameters' gradients
without the scale (flushed to zero) and with it (overflowed). The seed experiment's lesson:
the loss scale exists because small gradients vanish in fp16."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ampbench.results import Fp16Numerics
from ampbench.train.precision import Precision


def fp16_numerics(
    model: nn.Module,
    loss_of: Callable[[nn.Module], torch.Tensor],
    precision: Precision,
    loss_scale: float,
) -> Fp16Numerics:
    """The unscaled gradients of `loss_of(model)` (the arm's forward and loss under its
    autocast) cast to fp16, and scaled by `loss_scale` then cast: the shares of the nonzero
    elements that become zero, and inf. Changes the gradients (and BatchNorm's statistics):
    the caller puts the training state back."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    with precision.autocast():
        loss = loss_of(model)
    gradients = torch.autograd.grad(loss.float(), parameters, allow_unused=True)
    loss_value = float(loss.detach())
    flat = torch.cat([g.detach().flatten().float() for g in gradients if g is not None])
    nonzero = flat[flat != 0]
    elements = nonzero.numel()
    underflow = int((nonzero.half() == 0).sum())
    overflow = int(torch.isinf((nonzero * loss_scale).half()).sum())
    return Fp16Numerics(
        loss=loss_value,
        loss_scale=loss_scale,
        scaled_loss=loss_value * loss_scale,
        gradient_elements=elements,
        underflow_share=underflow / elements if elements else 0.0,
        overflow_share=overflow / elements if elements else 0.0,
    )
