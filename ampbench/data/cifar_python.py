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


def _class_names(name: str, meta: dict[str, Any], key: str, count: int) -> list[str]:
    """The class names under `key` of a meta file: `count` distinct, non-empty strings."""
    names = meta.get(key)
    if not isinstance(names, list | tuple):
        raise AmpbenchError(f"{name}: has no '{key}' list of class names")
    if len(names) != count:
        raise AmpbenchError(f"{name}: '{key}' holds {len(names)} class names, not {count}")
    decoded = []
    for value in names:
        if isinstance(value, bytes):
            try:
                value = value.decode()
            except UnicodeDecodeError:
                raise AmpbenchError(f"{name}: a class name in '{key}' is not UTF-8") from None
        if not isinstance(value, str) or not value:
            raise AmpbenchError(f"{name}: '{key}' holds something other than class names")
        decoded.append(value)
    if len(set(decoded)) != len(decoded):
        raise AmpbenchError(f"{name}: '{key}' names a class twice")
    return decoded


def _labels(name: str, batch: dict[str, Any], key: str, rows: int, classes: int) -> np.ndarray:
    """A batch's labels: `rows` integers in [0, classes)."""
    labels = batch.get(key)
    if isinstance(labels, list | tuple) and all(
        isinstance(label, int) and not isinstance(label, bool) for label in labels
    ):
        labels = np.array(labels, dtype=np.int64) if labels else np.zeros(0, np.int64)
    if not (isinstance(labels, np.ndarray) and labels.ndim == 1 and labels.dtype.kind in "iu"):
        raise AmpbenchError(f"{name}: '{key}' is not a list of integer labels")
    if len(labels) != rows:
        raise AmpbenchError(f"{name}: {rows} images but {len(labels)} '{key}'")
    if len(labels) and (labels.min() < 0 or labels.max() >= classes):
        raise AmpbenchError(f"{name}: '{key}' fall outside the {classes} classes")
    return labels.astype(np.int64)


def _batch_arrays(
    name: str, batch: dict[str, Any], label_key: str, classes: int
) -> tuple[np.ndarray, np.ndarray]:
    data = batch.get("data")
    if not (
        isinstance(data, np.ndarray)
        and data.dtype == np.uint8
        and data.ndim == 2
        and data.shape[1] == 3 * 32 * 32
    ):
        raise AmpbenchError(f"{name}: 'data' is not a uint8 [N, 3072] array")
    if len(data) == 0:
        raise AmpbenchError(f"{name}: holds no images")
    labels = _labels(name, batch, label_key, len(data), classes)
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # planar CHW -> HWC
    return np.ascontiguousarray(images), labels


def read(
    source: str, files: dict[str, bytes], variant: str
) -> tuple[list[str], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Classes and {split: (images [N, 32, 32, 3], labels)} from the release's files, every
    key, type, length and shape checked: a malformed file is refused with its name."""

    def member(suffix: str) -> tuple[str, bytes]:
        found = [
            (name, data)
            for name, data in files.items()
            if name == suffix or name.endswith("/" + suffix)
        ]
        if not found:
            raise AmpbenchError(f"{source}: {variant} archive has no '{suffix}'")
        if len(found) > 1:
            raise AmpbenchError(f"{source}: {variant} archive has '{suffix}' more than once")
        return found[0]

    if variant == "cifar10":
        meta_name, meta_data = member(f"{CIFAR10_DIR}/batches.meta")
        classes = _class_names(meta_name, _load(meta_name, meta_data), "label_names", 10)
        parts = {
            "train": [member(f"{CIFAR10_DIR}/data_batch_{i}") for i in range(1, 6)],
            "test": [member(f"{CIFAR10_DIR}/test_batch")],
        }
        label_key = "labels"
    else:
        meta_name, meta_data = member(f"{CIFAR100_DIR}/meta")
        classes = _class_names(meta_name, _load(meta_name, meta_data), "fine_label_names", 100)
        parts = {
            "train": [member(f"{CIFAR100_DIR}/train")],
            "test": [member(f"{CIFAR100_DIR}/test")],
        }
        label_key = "fine_labels"
    splits = {}
    for split, members in parts.items():
        arrays = [
            _batch_arrays(name, _load(name, data), label_key, len(classes))
            for name, data in members
        ]
        images = np.concatenate([images for images, _ in arrays])
        labels = np.concatenate([labels for _, labels in arrays])
        splits[split] = (images, labels)
    return classes, splits
