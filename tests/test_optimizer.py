"""The optimizer and the loss the trainer builds do what the settings say: SGD with Nesterov
momentum and weight decay, cross-entropy with label smoothing. Each is checked against a hand
computation of one training step from a known state, and against the same computation without
the feature (which must differ, or the check could not tell)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from ampbench.train.config import TrainConfig
from ampbench.train.graphs import StepInputs
from ampbench.train.loop import Trainer

# Large enough that each feature moves the step far beyond float32 rounding: weight decay
# of 5e-4 changes a parameter by about 1e-5 of itself, within assert_close's tolerance.
SETTINGS = {
    "precision": "fp32", "model": "small-cnn", "device": "cpu", "batch_size": 20, "subset": 40,
    "lr": 0.2, "momentum": 0.9, "weight_decay": 0.05, "label_smoothing": 0.3,
}  # fmt: skip
TOLERANCE = {"rtol": 1e-5, "atol": 1e-7}


def first_step(trainer: Trainer) -> tuple[StepInputs, torch.Tensor, torch.Tensor]:
    """The inputs of the first training step, and the batch they make (images, labels)."""
    order = torch.arange(len(trainer.train_data))
    inputs = trainer.step_inputs(order, epoch=0, step=0)
    images, labels = trainer.train_data.train_batch(inputs.rows, inputs.offsets, inputs.flip)
    return inputs, images, labels


def sgd_step(
    parameter: torch.Tensor,
    gradient: torch.Tensor,
    buffer: torch.Tensor,
    *,
    lr: float,
    momentum: float,
    weight_decay: float,
    nesterov: bool,
) -> torch.Tensor:
    """SGD's update as PyTorch documents it (no dampening), by hand."""
    gradient = gradient + weight_decay * parameter
    buffer = momentum * buffer + gradient
    direction = gradient + momentum * buffer if nesterov else buffer
    return parameter - lr * direction


def test_one_step_is_sgd_with_nesterov_momentum_and_weight_decay(
    synthetic_dataset: Path,
) -> None:
    trainer = Trainer(TrainConfig(dataset_dir=synthetic_dataset, **SETTINGS))
    config = trainer.config
    # A known state with momentum in it: random buffers, as after earlier steps.
    generator = torch.Generator().manual_seed(0)
    parameters = list(trainer.model.parameters())
    for parameter in parameters:
        buffer = trainer.optimizer.state[parameter]["momentum_buffer"]
        buffer.copy_(0.01 * torch.randn(buffer.shape, generator=generator))
    before = [p.detach().clone() for p in parameters]
    buffers = [trainer.optimizer.state[p]["momentum_buffer"].clone() for p in parameters]
    inputs, images, labels = first_step(trainer)
    # The gradients of the step's loss at these weights, on a copy (its BatchNorm statistics
    # move in the forward pass).
    twin = copy.deepcopy(trainer.model)
    loss = nn.functional.cross_entropy(twin(images), labels, label_smoothing=config.label_smoothing)
    gradients = torch.autograd.grad(loss, list(twin.parameters()))
    global_step = 2  # the schedule's 2/3 of the base rate: the rate is the schedule's
    lr = config.lr * trainer.schedule(global_step)
    trainer.take_step(inputs, global_step)

    def expected(**changes: float | bool) -> list[torch.Tensor]:
        settings = {
            "lr": lr,
            "momentum": config.momentum,
            "weight_decay": config.weight_decay,
            "nesterov": True,
            **changes,
        }
        return [
            sgd_step(p, g, b, **settings)  # type: ignore[arg-type]
            for p, g, b in zip(before, gradients, buffers, strict=True)
        ]

    after = [p.detach() for p in parameters]
    torch.testing.assert_close(after, expected(), **TOLERANCE)
    for switched_off in ({"nesterov": False}, {"weight_decay": 0.0}):
        with pytest.raises(AssertionError):
            torch.testing.assert_close(after, expected(**switched_off), **TOLERANCE)


def test_the_reported_loss_is_cross_entropy_with_label_smoothing(
    synthetic_dataset: Path,
) -> None:
    trainer = Trainer(TrainConfig(dataset_dir=synthetic_dataset, **SETTINGS))
    # Confident logits: near-uniform ones (a fresh head's) are hardly changed by smoothing.
    head = [m for m in trainer.model.modules() if isinstance(m, nn.Linear)][-1]
    with torch.no_grad():
        head.weight.mul_(30)
    inputs, images, labels = first_step(trainer)
    with torch.no_grad():
        logits = copy.deepcopy(trainer.model)(images)  # train mode: the step's batch statistics
    trainer.take_step(inputs, global_step=0)
    # What the epoch's train_loss is made of: the step's loss times its images, summed.
    reported = trainer.counters.loss_sum.item() / len(labels)
    smoothing = trainer.config.label_smoothing

    def cross_entropy(label_smoothing: float) -> float:
        return nn.functional.cross_entropy(logits, labels, label_smoothing=label_smoothing).item()

    assert reported == pytest.approx(cross_entropy(smoothing), rel=1e-6)
    # By hand too: (1 - s) of the label's -log p, and s of the mean -log p over the classes.
    log_p = logits.log_softmax(dim=1)
    by_hand = -((1 - smoothing) * log_p.gather(1, labels[:, None]) + smoothing * log_p.mean(1))
    assert reported == pytest.approx(by_hand.mean().item(), rel=1e-6)
    assert abs(reported - cross_entropy(0.0)) > 0.01 * reported, (reported, cross_entropy(0.0))
