"""Decode encoded images into one uint8 [N, H, W, 3] array, fast for JPEG, correct for the rest.

JPEGs (CIFAR mirrors, most user data) go through libjpeg-turbo by way of simplejpeg (about
90k CIFAR images/s on one core here, against about 11k through Pillow); everything else Pillow
reads goes through Pillow, which also converts grayscale, palette and RGBA images to RGB.
Images are decoded straight into one preallocated array: no per-image arrays to stack, and no
torch import, so that a prepare step's memory is its data.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from PIL import Image

try:
    import simplejpeg
except ImportError:  # a bare machine with the repository only (GPU benchmark): Pillow decodes
    simplejpeg = None

from ampbench.data.limits import Limits, check_decoded_size
from ampbench.errors import AmpbenchError

JPEG_MAGIC = b"\xff\xd8\xff"
CHUNK = 2048
# The only formats decoded: other Pillow plugins (EPS and PS through Ghostscript, PSD, PDF, ...)
# are attack surface. JPEG's opener also reads MPO, which many cameras write.
ALLOWED_FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "GIF", "TIFF", "PPM")
# Our header check against --max-image-pixels replaces Pillow's bomb check, which would keep
# that option from going past Pillow's 179 Mpixel.
Image.MAX_IMAGE_PIXELS = None
IMAGE_EXTENSIONS = frozenset(
    extension.lower()
    for extension, image_format in Image.registered_extensions().items()
    if image_format in (*ALLOWED_FORMATS, "MPO")
)


@dataclass(frozen=True)
class Decoded:
    images: np.ndarray  # uint8 [n_kept, H, W, 3]
    kept: np.ndarray  # positions (into the input list) of the images that decoded
    bad: list[str]  # "name: reason" of the files that did not decode (only with skip_bad)


class BadImage(Exception):
    pass


def _check_pixels(name: str, width: int, height: int, max_pixels: int) -> None:
    """Refuse an image whose header declares more pixels than the budget, before decoding."""
    if width * height > max_pixels:
        raise AmpbenchError(
            f"{name}: its header declares {width}x{height} pixels, more than the "
            f"{max_pixels:,}-pixel limit; refused (raise --max-image-pixels if it is meant)"
        )


def decode_one(name: str, data: bytes, max_pixels: int) -> np.ndarray:
    """One image as uint8 [H, W, 3], or BadImage naming the file; an image larger than
    max_pixels is refused (AmpbenchError) from its header, before any pixel is decoded."""
    if simplejpeg is not None and data.startswith(JPEG_MAGIC):
        try:
            height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        except ValueError:
            pass  # CMYK, arithmetic coding and other rarities: Pillow knows more of JPEG
        else:
            _check_pixels(name, width, height, max_pixels)
            try:
                return simplejpeg.decode_jpeg(data, colorspace="RGB")
            except ValueError:
                pass
    try:
        with Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS) as image:
            _check_pixels(name, *image.size, max_pixels)
            return np.asarray(image.convert("RGB"))
    except AmpbenchError:
        raise
    except Exception as error:
        reason = str(error) or type(error).__name__
        raise BadImage(f"{name}: not a readable image ({reason})") from None


def _refused(source: str, error: BadImage) -> AmpbenchError:
    return AmpbenchError(f"{source}: {error} (pass --skip-bad-images to skip such files)")


def fit_size(image: np.ndarray, size: int) -> np.ndarray:
    if image.shape[:2] == (size, size):
        return image
    return np.asarray(Image.fromarray(image).resize((size, size), Image.Resampling.BILINEAR))


def _first_shape(
    files: list[tuple[str, bytes]],
    source: str,
    skip_bad: bool,
    max_pixels: int,
    bad: dict[int, str],
) -> tuple[int, tuple[int, ...] | None]:
    """The first readable image's index and shape, which every other image must have (None:
    no image is readable); the unreadable ones before it are added to `bad`."""
    for index, (name, data) in enumerate(files):
        try:
            return index, decode_one(name, data, max_pixels).shape
        except BadImage as error:
            if not skip_bad:
                raise _refused(source, error) from None
            bad[index] = str(error)
    return len(files), None


def _in_threads(decode_chunk: Callable[[int], None], count: int) -> None:
    """decode_chunk for each chunk's start; simplejpeg and Pillow release the GIL while they
    decode, so a thread per core helps."""
    workers = max(1, min(os.cpu_count() or 1, count // CHUNK + 1))
    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(decode_chunk, range(0, count, CHUNK)))
    except RuntimeError as error:  # "can't start new thread": no memory left for its stack
        if "thread" not in str(error):
            raise
        raise MemoryError(str(error)) from None


def decode_images(
    files: list[tuple[str, bytes]],
    *,
    source: str,
    image_size: int | None,
    skip_bad: bool,
    limits: Limits,
    on_progress: Callable[[int], None] | None = None,
) -> Decoded:
    """Decode files (name, bytes) to RGB; a bad file is an error unless skip_bad.

    Each image's header is checked against the pixel limit before it is decoded, and the
    output array against the decoded-size limit and free memory before it is allocated.
    """
    max_pixels = limits.max_image_pixels
    bad: dict[int, str] = {}
    shape: tuple[int, ...] | None = (image_size, image_size, 3) if image_size else None
    first = 0
    if shape is None:
        first, shape = _first_shape(files, source, skip_bad, max_pixels, bad)
    if shape is None:
        return Decoded(np.zeros((0, 1, 1, 3), np.uint8), np.arange(0), list(bad.values()))
    check_decoded_size(source, len(files), shape, limits)
    out = np.empty((len(files), *shape), np.uint8)

    def decode_chunk(start: int) -> None:
        for i in range(start, min(start + CHUNK, len(files))):
            if i in bad:
                continue
            name = files[i][0]
            try:
                image = decode_one(*files[i], max_pixels)
            except BadImage as error:
                if not skip_bad:
                    raise _refused(source, error) from None
                bad[i] = str(error)
                continue
            if image_size is not None:
                image = fit_size(image, image_size)
            elif image.shape != shape:
                raise AmpbenchError(
                    f"{source}: images differ in size ({files[first][0]} is "
                    f"{shape[1]}x{shape[0]}, {name} is {image.shape[1]}x{image.shape[0]}); "
                    "pass --image-size to resize them"
                )
            out[i] = image
        if on_progress is not None:
            on_progress(min(CHUNK, len(files) - start))

    _in_threads(decode_chunk, len(files))
    if not bad:
        return Decoded(out, np.arange(len(files)), [])
    kept = np.array([i for i in range(len(files)) if i not in bad])
    return Decoded(out[kept], kept, [bad[i] for i in sorted(bad)])
