"""The prepared-dataset format shared by the prepare step (writer) and training (reader).

A prepared dataset is a directory:

    metadata.json                 classes, counts, image shape, normalisation, provenance
    <split>/part-NNNNN.parquet    columns: index (int64), label (int16),
                                  image (fixed_size_binary(H*W*C): uint8 pixels, HWC order)

A fixed-size-binary column is one contiguous buffer, so a whole split reads back into a
uint8 tensor without a per-image Python loop; that tensor's NCHW view of HWC bytes is
already in channels_last memory format, which is what training wants.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ampbench.errors import AmpbenchError
from ampbench.schema import read_json

if TYPE_CHECKING:  # torch is imported by the reader alone: preparing data never needs it
    import torch

FORMAT_VERSION = 1
METADATA_FILE = "metadata.json"
METADATA_KEYS = ("classes", "image_shape", "counts", "mean", "std", "source")
# Bounded shards: readers can stream or distribute them, writers never hold a huge row group.
MAX_SHARD_BYTES = 64 * 1024 * 1024


def image_type(shape: tuple[int, int, int]) -> pa.DataType:
    height, width, channels = shape
    return pa.binary(height * width * channels)


def write_split(
    dataset_dir: Path, split: str, images: np.ndarray, labels: np.ndarray, indices: np.ndarray
) -> list[str]:
    """Write one split ([N, H, W, C] uint8 images) as zstd Parquet shards; return their names."""
    if images.dtype != np.uint8 or images.ndim != 4:
        raise ValueError(f"images must be uint8 [N, H, W, C], got {images.dtype} {images.shape}")
    count = len(images)
    shape = images.shape[1:]
    bytes_per_image = int(np.prod(shape))
    rows_per_shard = max(1, MAX_SHARD_BYTES // bytes_per_image)
    split_dir = dataset_dir / split
    split_dir.mkdir(parents=True, exist_ok=True)
    flat = np.ascontiguousarray(images).reshape(-1)
    names = []
    for shard, start in enumerate(range(0, max(count, 1), rows_per_shard)):
        stop = min(start + rows_per_shard, count)
        pixels = pa.FixedSizeBinaryArray.from_buffers(
            image_type(shape),
            stop - start,
            [None, pa.py_buffer(flat[start * bytes_per_image : stop * bytes_per_image])],
        )
        table = pa.table(
            {
                "index": pa.array(indices[start:stop], pa.int64()),
                "label": pa.array(labels[start:stop], pa.int16()),
                "image": pixels,
            }
        )
        name = f"part-{shard:05d}.parquet"
        pq.write_table(
            table,
            split_dir / name,
            # Raw pixels barely compress: zstd level 1 decodes ~4x faster than the default, and
            # a dictionary or statistics mean nothing for a column of images.
            compression="zstd",
            compression_level=1,
            use_dictionary=["label"],
            write_statistics=["index", "label"],
        )
        names.append(f"{split}/{name}")
    return names


@dataclass(frozen=True)
class SplitTensors:
    """One split as tensors: images uint8 [N, C, H, W] (channels_last), labels int64 [N]."""

    images: torch.Tensor
    labels: torch.Tensor
    indices: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)


def read_metadata(dataset_dir: Path) -> dict[str, Any]:
    path = dataset_dir / METADATA_FILE
    if not path.is_file():
        raise AmpbenchError(
            f"{dataset_dir}: not a prepared dataset (no {METADATA_FILE}); run `ampbench prepare`"
        )
    metadata = read_json(path, "dataset metadata file")
    if not isinstance(metadata, dict) or metadata.get("format_version") != FORMAT_VERSION:
        raise AmpbenchError(
            f"{dataset_dir}: not a prepared dataset of format version {FORMAT_VERSION}; "
            "prepare it again with this version of ampbench"
        )
    missing = [key for key in METADATA_KEYS if key not in metadata]
    if missing:
        raise AmpbenchError(f"{path}: incomplete (no {', '.join(missing)})")
    return metadata


def read_split(dataset_dir: Path, split: str) -> SplitTensors:
    """Read a split's shards into tensors without a per-image Python loop."""
    import torch

    metadata = read_metadata(dataset_dir)
    height, width, channels = metadata["image_shape"]
    shards = sorted((dataset_dir / split).glob("part-*.parquet"))
    if split not in metadata["counts"] or not shards:
        raise AmpbenchError(f"{dataset_dir}: the prepared dataset has no '{split}' split")
    try:
        tables = [pq.read_table(shard) for shard in shards]
    except (OSError, pa.ArrowException) as error:
        raise AmpbenchError(f"{dataset_dir}: split '{split}' is unreadable ({error})") from None
    count = sum(len(table) for table in tables)
    if count != metadata["counts"][split]:
        raise AmpbenchError(
            f"{dataset_dir}: split '{split}' holds {count} images, metadata says "
            f"{metadata['counts'][split]}; the dataset is incomplete"
        )
    expected_type = image_type((height, width, channels))
    bytes_per_image = height * width * channels
    # One copy, Arrow buffers straight into the tensor: a loop over chunks, not over images.
    images = torch.empty((count, height, width, channels), dtype=torch.uint8)
    flat = images.numpy().reshape(-1)
    position = 0
    for table in tables:
        column = table.column("image")
        if column.type != expected_type:
            raise AmpbenchError(f"{dataset_dir}: split '{split}' image column is {column.type}")
        for chunk in column.chunks:
            start = chunk.offset * bytes_per_image
            size = len(chunk) * bytes_per_image
            flat[position : position + size] = np.frombuffer(chunk.buffers()[1], np.uint8)[
                start : start + size
            ]
            position += size
    labels = torch.from_numpy(
        np.concatenate([t.column("label").to_numpy() for t in tables]).astype(np.int64)
    )
    indices = torch.from_numpy(np.concatenate([t.column("index").to_numpy() for t in tables]))
    # The NCHW view of HWC bytes is exactly channels_last memory format.
    images = images.permute(0, 3, 1, 2)
    return SplitTensors(images, labels, indices)
