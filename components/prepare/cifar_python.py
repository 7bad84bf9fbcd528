"""CIFAR-10/100 in the published python format, read without an unrestricted unpickler.

The batches are pickles; pickle.load would run whatever a hostile file names. The format uses
only numpy's array reconstruction (and, for files pickled by Python 3, _codecs.encode for
bytes), so the unpickler admits exactly those and refuses every other global.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import numpy as np

from ampbench.errors import AmpbenchError

ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
}

CIFAR10_DIR = "cifar-10-batches-py"
CIFAR100_DIR = "cifar-100-python"


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, name: str) -> None:
        super().__init__(io.BytesIO(data), encoding="bytes")
        self.name = name

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise AmpbenchError(
            f"{self.name}: pickle refers to {module}.{name}, which a CIFAR batch never does; "
            "refused as hostile"
        )


def _load(name: str, data: bytes) -> dict[str, Any]:
    try:
        loaded = _RestrictedUnpickler(data, name).load()
    except AmpbenchError:
        raise
    except Exception as error:  # any malformed pickle: name the file, not the parser's insides
        raise AmpbenchError(
            f"{name}: not a readable CIFAR batch ({type(error).__name__})"
        ) from None
    if not isinstance(loaded, dict):
        raise AmpbenchError(f"{name}: not a CIFAR batch (a {type(loaded).__name__}, not a dict)")
    return {key.decode() if isinstance(key, bytes) else key: value for key, value in loaded.items()}


def detect(names: set[str]) -> str | None:
    """'cifar10' or 'cifar100' when the archive's files are that python-format release."""
    if any(name.split("/")[-2:] == [CIFAR10_DIR, "data_batch_1"] for name in names):
        return "cifar10"
    if any(name.split("/")[-2:] == [CIFAR100_DIR, "train"] for name in names):
        return "cifar100"
    return None


def _batch_arrays(
    name: str, batch: dict[str, Any], label_key: str
) -> tuple[np.ndarray, np.ndarray]:
    data, labels = batch.get("data"), batch.get(label_key)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2:
        raise AmpbenchError(f"{name}: 'data' is not a uint8 [N, 3072] array")
    if data.shape[1] != 3 * 32 * 32 or labels is None or len(labels) != len(data):
        raise AmpbenchError(f"{name}: 'data' and '{label_key}' do not match the CIFAR layout")
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # planar CHW -> HWC
    return np.ascontiguousarray(images), np.asarray(labels, dtype=np.int64)


def read(
    source: str, files: dict[str, bytes], variant: str
) -> tuple[list[str], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Classes and {split: (images [N, 32, 32, 3], labels)} from the release's files."""

    def member(suffix: str) -> tuple[str, bytes]:
        for name, data in files.items():
            if name.endswith(suffix):
                return name, data
        raise AmpbenchError(f"{source}: {variant} archive has no '{suffix}'")

    if variant == "cifar10":
        meta = _load(*member(f"{CIFAR10_DIR}/batches.meta"))
        classes = [c.decode() if isinstance(c, bytes) else str(c) for c in meta["label_names"]]
        parts = {
            "train": [member(f"{CIFAR10_DIR}/data_batch_{i}") for i in range(1, 6)],
            "test": [member(f"{CIFAR10_DIR}/test_batch")],
        }
        label_key = "labels"
    else:
        meta = _load(*member(f"{CIFAR100_DIR}/meta"))
        names = meta["fine_label_names"]
        classes = [c.decode() if isinstance(c, bytes) else str(c) for c in names]
        parts = {
            "train": [member(f"{CIFAR100_DIR}/train")],
            "test": [member(f"{CIFAR100_DIR}/test")],
        }
        label_key = "fine_labels"
    splits = {}
    for split, members in parts.items():
        arrays = [_batch_arrays(name, _load(name, data), label_key) for name, data in members]
        images = np.concatenate([images for images, _ in arrays])
        labels = np.concatenate([labels for _, labels in arrays])
        if labels.min() < 0 or labels.max() >= len(classes):
            raise AmpbenchError(f"{source}: {split} labels fall outside the {len(classes)} classes")
        splits[split] = (images, labels)
    return classes, splits
