"""`synthetic`: generated 32x32 images whose classes are learnable, for runs without data.

Each class is a colour and a grating orientation; every image adds a random phase, brightness
and noise, so a model must learn the pattern rather than memorise pixels. The content depends
on nothing but the generator's version, so the data set is the same everywhere.
"""

from __future__ import annotations

import hashlib

import numpy as np

VERSION = "synthetic-v1"
CLASSES = [f"class_{i}" for i in range(10)]
SIZE = 32
COUNTS = {"train": 5000, "test": 1000}


def content_sha256() -> str:
    return hashlib.sha256(f"{VERSION}:{SIZE}:{COUNTS}".encode()).hexdigest()


def _generate(count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    n_classes = len(CLASSES)
    labels = np.arange(count) % n_classes
    rng.shuffle(labels)
    palette = np.random.default_rng(1234).uniform(0.2, 0.8, size=(n_classes, 3))
    angles = np.pi * np.arange(n_classes) / n_classes
    y, x = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    theta = angles[labels][:, None, None]
    phase = rng.uniform(0, 2 * np.pi, size=(count, 1, 1))
    grating = np.sin(0.6 * (x * np.cos(theta) + y * np.sin(theta)) + phase)
    brightness = rng.uniform(0.8, 1.2, size=(count, 1, 1, 1))
    images = palette[labels][:, None, None, :] * brightness + 0.25 * grating[..., None]
    images += rng.normal(0, 0.08, size=images.shape)
    return (np.clip(images, 0, 1) * 255).round().astype(np.uint8), labels.astype(np.int64)


def generate() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    return {split: _generate(count, rng) for split, count in COUNTS.items()}
