"""The networks a run can train, by name."""

from __future__ import annotations

import torch
import torchvision
from torch import nn

from ampbench.components.train import MODELS
from ampbench.errors import AmpbenchError


def _conv_block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
        nn.MaxPool2d(2),
        nn.BatchNorm2d(c_out),
        nn.GELU(),
        nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.GELU(),
    )


def small_cnn(num_classes: int, width: int = 64) -> nn.Module:
    """A small fast network (airbench-style: three conv blocks, max pooling) for quick runs."""
    return nn.Sequential(
        nn.Conv2d(3, width // 2, 3, padding=1, bias=False),
        nn.BatchNorm2d(width // 2),
        nn.GELU(),
        _conv_block(width // 2, width),
        _conv_block(width, 2 * width),
        _conv_block(2 * width, 4 * width),
        nn.AdaptiveMaxPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * width, num_classes),
    )


def build_model(name: str, num_classes: int) -> nn.Module:
    if name == "resnet18":
        # The usual CIFAR adaptation: a 3x3 stride-1 stem and no max-pool keep 32x32 inputs
        # from shrinking to 8x8 before the first residual stage.
        model = torchvision.models.resnet18(num_classes=num_classes)
        model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
        return model
    if name == "resnet18-imagenet":
        return torchvision.models.resnet18(num_classes=num_classes)
    if name == "small-cnn":
        return small_cnn(num_classes)
    raise AmpbenchError(f"--model: '{name}' is not one of {', '.join(MODELS)}")


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def example_input(image_shape: tuple[int, int, int]) -> torch.Tensor:
    height, width, channels = image_shape
    # Batch 2, not 1: torch.export would specialise a batch dimension of 1 to a constant.
    return torch.zeros(2, channels, height, width)
