"""The data path, airbench-style: the whole split as one uint8 tensor on the device, and
augmentation, float conversion and normalisation done a batch at a time there.

No DataLoader, no worker processes, no per-image Python: a training batch is one gather.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ampbench.dataset_format import SplitTensors, read_split
from ampbench.sampling import stratified_take

CROP_PADDING = 4
# cross_entropy's default ignore_index: padding rows count in neither loss nor accuracy.
IGNORE_LABEL = -100


def step_generator(device: torch.device, seed: int, epoch: int, step: int) -> torch.Generator:
    """The random stream of one training step, derived from (seed, epoch, step) alone.

    A run resumed mid-epoch therefore draws exactly the crops and flips the uninterrupted run
    would have drawn, with no generator state to carry across the restart.
    """
    generator = torch.Generator(device=device)
    generator.manual_seed((seed * 1_000_003 + epoch) * 1_000_003 + step)
    return generator


def epoch_order(count: int, seed: int, epoch: int, device: torch.device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(count, generator=generator).to(device)


def draw_crop_flip(
    batch: int,
    generator: torch.Generator,
    padding: int = CROP_PADDING,
    shard: tuple[int, int] = (0, 1),
) -> tuple[torch.Tensor, torch.Tensor]:
    """The random part of crop_flip, per image: crop offsets (2 x batch) and flips (batch).

    shard (index, count): the images are part `index` of a batch `count` times their number
    (a rank's part of the global batch); the draws are made for the whole batch and this
    part's taken, so that each image gets the crop and flip one process would give it.
    """
    index, count = shard
    part = slice(index * batch, (index + 1) * batch)
    device = generator.device
    offsets = torch.randint(
        0, 2 * padding + 1, (2, batch * count), device=device, generator=generator
    )[:, part]
    flip = torch.randint(0, 2, (batch * count,), device=device, generator=generator)[part].bool()
    return offsets, flip


def crop_flip(
    images: torch.Tensor, offsets: torch.Tensor, flip: torch.Tensor, padding: int = CROP_PADDING
) -> torch.Tensor:
    """Crop after zero-padding by `padding` at `offsets`, and flip horizontally where `flip`
    says, per image: one gather does both (row indices pick the crop, reversed column indices
    the flip). Deterministic, so that a CUDA graph can replay it on new draws."""
    batch, channels, height, width = images.shape
    device = images.device
    padded = torch.nn.functional.pad(images, (padding, padding, padding, padding))
    rows = offsets[0, :, None] + torch.arange(height, device=device)
    cols = offsets[1, :, None] + torch.arange(width, device=device)
    cols = torch.where(flip[:, None], cols.flip(1), cols)
    return padded[
        torch.arange(batch, device=device)[:, None, None, None],
        torch.arange(channels, device=device)[None, :, None, None],
        rows[:, None, :, None],
        cols[:, None, None, :],
    ]


class DeviceSplit:
    """One split resident on the device, handing out normalised channels_last batches, resized
    to image_size x image_size when that is set (0: as prepared)."""

    def __init__(
        self,
        split: SplitTensors,
        device: torch.device,
        mean: list[float],
        std: list[float],
        image_size: int = 0,
    ) -> None:
        self.images = split.images.to(device)
        self.labels = split.labels.to(device)
        self.device = device
        self.image_size = image_size
        self._mean = torch.tensor(mean, device=device).view(1, -1, 1, 1) * 255.0
        self._std = torch.tensor(std, device=device).view(1, -1, 1, 1) * 255.0

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(channels, height, width) of the batches handed out."""
        _, channels, height, width = self.images.shape
        if self.image_size:
            height = width = self.image_size
        return channels, height, width

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images to the model's input: float, resized (if image_size says so),
        normalised, channels_last."""
        floats = images.float()
        size = self.image_size
        if size and tuple(floats.shape[-2:]) != (size, size):
            # Per batch, so the resident data set stays at its prepared size; float32 in every
            # arm (the data path is not compared); no antialiasing, which only shrinking needs.
            floats = torch.nn.functional.interpolate(
                floats, size=(size, size), mode="bilinear", align_corners=False, antialias=False
            )
        normalized = (floats - self._mean) / self._std
        return normalized.contiguous(memory_format=torch.channels_last)

    def train_batch(
        self, rows: torch.Tensor, offsets: torch.Tensor, flip: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows' images cropped and flipped as drawn (draw_crop_flip) at the prepared size
        (the padding is in its pixels), then resized and normalised; and their labels."""
        images = crop_flip(self.images[rows], offsets, flip)
        return self.normalize(images), self.labels[rows]

    def eval_batches(
        self, batch_size: int, part: slice = slice(None)
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The split (or `part` of it: a rank's share) in batches of batch_size, the last one
        padded to that size with blank images labelled IGNORE_LABEL: every batch has the one
        shape whose kernels were chosen (cuDNN autotunes each new shape)."""
        first, last, _ = part.indices(len(self))
        for start in range(first, last, batch_size):
            stop = min(start + batch_size, last)
            images, labels = self.images[start:stop], self.labels[start:stop]
            short = batch_size - (stop - start)
            if short:
                images = torch.cat([images, images.new_zeros((short, *images.shape[1:]))])
                labels = torch.cat([labels, labels.new_full((short,), IGNORE_LABEL)])
            yield self.normalize(images), labels


def _subset(split: SplitTensors, count: int, seed: int) -> SplitTensors:
    if not count or count >= len(split):
        return split
    rows = torch.from_numpy(
        stratified_take(split.labels.numpy(), count, np.random.default_rng(seed))
    )
    return SplitTensors(split.images[rows], split.labels[rows], split.indices[rows])


def read_to_device(
    dataset_dir: Path,
    metadata: dict[str, Any],
    device: torch.device,
    subset: int,
    seed: int,
    image_size: int,
) -> tuple[DeviceSplit, dict[str, DeviceSplit]]:
    """The training split and the evaluation splits the data set has (val, test), each cut to
    `subset` images (stratified; 0: all) and put on the device."""

    def load(split: str) -> DeviceSplit:
        tensors = _subset(read_split(dataset_dir, split), subset, seed)
        return DeviceSplit(tensors, device, metadata["mean"], metadata["std"], image_size)

    train = load("train")
    return train, {split: load(split) for split in ("val", "test") if split in metadata["counts"]}
