"""`synthetic`: generated 32x32 images whose classes are learnable, for runs without data.

Each class is a grating's period (one of five) and direction (horizontal or vertical stripes);
every image has a random colour, phase and noise. Colour says nothing about the class, so a
model must learn the stripes' structure: crops that scramble it, labels out of step with their
images or a normalisation applied twice show in the accuracy. The classes survive the
trainer's augmentation (a translation changes the phase, a horizontal flip keeps each stripe
direction). The content depends on nothing but the generator's version, so the data set is
the same everywhere.
"""

from __future__ import annotations

import hashlib

import numpy as np

VERSION = "synthetic-v2"
CLASSES = [f"class_{i}" for i in range(10)]
SIZE = 32
COUNTS = {"train": 5000, "test": 1000}
# Pixels per stripe cycle, about 1.4 times apart: even the longest repeats about three times
# in an image, so that a crop of it is still a grating of that period.
PERIODS = (2.5, 3.5, 5.0, 7.0, 10.0)
AMPLITUDE = 0.25  # of the grating, in luminance (the same on every channel)
NOISE = 0.05


def content_sha256() -> str:
    return hashlib.sha256(f"{VERSION}:{SIZE}:{COUNTS}".encode()).hexdigest()


def _generate(count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Class c: period PERIODS[c // 2], stripes horizontal for even c and vertical for odd."""
    labels = np.arange(count) % len(CLASSES)
    rng.shuffle(labels)
    y, x = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    # Horizontal stripes vary down the image (y), vertical ones across it (x).
    across = np.where((labels % 2 == 1)[:, None, None], x, y)
    period = np.asarray(PERIODS)[labels // 2][:, None, None]
    phase = rng.uniform(0, 2 * np.pi, size=(count, 1, 1))
    grating = np.sin(2 * np.pi * across / period + phase)
    colour = rng.uniform(0.25, 0.75, size=(count, 1, 1, 3))  # per image, whatever its class
    images = colour + AMPLITUDE * grating[..., None]
    images += rng.normal(0, NOISE, size=images.shape)
    return (np.clip(images, 0, 1) * 255).round().astype(np.uint8), labels.astype(np.int64)


def generate() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    return {split: _generate(count, rng) for split, count in COUNTS.items()}
