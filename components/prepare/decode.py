"""Decode encoded images into one uint8 [N, H, W, 3] array, fast for JPEG, correct for the rest.

JPEGs (CIFAR mirrors, most user data) are decoded in batches by libjpeg-turbo through
torchvision.io.decode_jpeg, on a thread per core; everything else Pillow reads goes through
Pillow, which also converts grayscale, palette and RGBA images to RGB.
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from ampbench.errors import AmpbenchError

JPEG_MAGIC = b"\xff\xd8\xff"
BATCH = 1024

try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchvision.io import ImageReadMode
        from torchvision.io import decode_jpeg as _torchvision_decode_jpeg
except ImportError:  # torchvision dropped its decoders (deprecated in 0.29): Pillow does it all
    _torchvision_decode_jpeg = None


@dataclass(frozen=True)
class Decoded:
    images: np.ndarray  # uint8 [n_kept, H, W, 3]
    kept: np.ndarray  # positions (into the input list) of the images that decoded
    bad: list[str]  # names of the files that did not decode (only with skip_bad)


class BadImage(Exception):
    pass


def _pil_decode(name: str, data: bytes) -> np.ndarray:
    try:
        with Image.open(io.BytesIO(data)) as image:
            return np.asarray(image.convert("RGB"))
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as error:
        raise BadImage(f"{name}: not a readable image ({error})") from None


def _jpeg_batch(items: list[tuple[str, bytes]]) -> list[np.ndarray] | None:
    """Decode a batch of JPEGs at once; None when that is not possible (then Pillow decodes)."""
    if _torchvision_decode_jpeg is None:
        return None
    tensors = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for _, data in items]
    try:
        with warnings.catch_warnings():
            # torchvision 0.29 warns that its decoders are deprecated in favour of TorchCodec.
            warnings.simplefilter("ignore", DeprecationWarning)
            decoded = _torchvision_decode_jpeg(tensors, mode=ImageReadMode.RGB)
    except RuntimeError:  # a bad file in the batch: decoding one by one names it
        return None
    return [image.permute(1, 2, 0).numpy() for image in decoded]


def _resize(image: np.ndarray, size: int) -> np.ndarray:
    if image.shape[:2] == (size, size):
        return image
    resized = Image.fromarray(image).resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(resized)


def decode_images(
    files: list[tuple[str, bytes]],
    *,
    source: str,
    image_size: int | None,
    skip_bad: bool,
    on_progress: Callable[[int], None] | None = None,
) -> Decoded:
    """Decode files (name, bytes) to RGB; a bad file is an error unless skip_bad."""
    batches = [files[start : start + BATCH] for start in range(0, len(files), BATCH)]

    def decode_batch(batch: list[tuple[str, bytes]]) -> list[np.ndarray | BadImage]:
        results: list[np.ndarray | BadImage | None] = [None] * len(batch)
        jpegs = [i for i, (_, data) in enumerate(batch) if data.startswith(JPEG_MAGIC)]
        fast = _jpeg_batch([batch[i] for i in jpegs]) if jpegs else None
        if fast is not None:
            for i, image in zip(jpegs, fast, strict=True):
                results[i] = image
        for i, (name, data) in enumerate(batch):
            if results[i] is None:
                try:
                    results[i] = _pil_decode(name, data)
                except BadImage as error:
                    results[i] = error
        if on_progress is not None:
            on_progress(len(batch))
        return results  # type: ignore[return-value]

    # libjpeg-turbo and Pillow's decoders release the GIL: one thread per core scales.
    with ThreadPoolExecutor(max_workers=max(1, min(len(batches), os.cpu_count() or 1))) as pool:
        decoded = [image for batch in pool.map(decode_batch, batches) for image in batch]

    bad = [error for error in decoded if isinstance(error, BadImage)]
    if bad and not skip_bad:
        raise AmpbenchError(f"{source}: {bad[0]} (pass --skip-bad-images to skip such files)")
    kept = np.array([i for i, image in enumerate(decoded) if not isinstance(image, BadImage)])
    images = [decoded[i] for i in kept]
    if not images:
        return Decoded(np.zeros((0, 0, 0, 3), np.uint8), kept, [str(e) for e in bad])
    if image_size is not None:
        images = [_resize(image, image_size) for image in images]
    else:
        first_shape = images[0].shape
        for position, image in zip(kept, images, strict=True):
            if image.shape != first_shape:
                raise AmpbenchError(
                    f"{source}: images differ in size ({files[kept[0]][0]} is "
                    f"{first_shape[1]}x{first_shape[0]}, {files[position][0]} is "
                    f"{image.shape[1]}x{image.shape[0]}); pass --image-size to resize them"
                )
    return Decoded(np.stack(images), kept, [str(e) for e in bad])
