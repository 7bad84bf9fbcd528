"""Small data sets generated on the fly, in the layouts users have: ImageFolder trees,
CIFAR python-format tarballs, and hostile archives."""

from __future__ import annotations

import io
import pickle
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image


def make_image_folder(
    root: Path,
    classes: list[str],
    per_class: dict[str, int],
    *,
    size: tuple[int, int] = (32, 32),
    mode: str = "RGB",
    fmt: str = "PNG",
    seed: int = 0,
) -> dict[str, list[tuple[str, np.ndarray]]]:
    """Write root/<split>/<class>/NNNN.<ext>; return {split: [(class, RGB pixels)]} in the
    order ImageFolder lists them (sorted classes, then sorted file names)."""
    rng = np.random.default_rng(seed)
    extension = {"PNG": "png", "JPEG": "jpg", "BMP": "bmp"}[fmt]
    written: dict[str, list[tuple[str, np.ndarray]]] = {}
    for split, count in per_class.items():
        written[split] = []
        for name in sorted(classes):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                shape = (size[1], size[0]) + (
                    (3,) if mode == "RGB" else (4,) if mode == "RGBA" else ()
                )
                pixels = rng.integers(0, 256, size=shape, dtype=np.uint8)
                image = Image.fromarray(pixels, mode=mode)
                image.save(folder / f"{i:04d}.{extension}", format=fmt)
                written[split].append((name, np.asarray(image.convert("RGB"))))
    return written


def make_tar(path: Path, source: Path, arcname: str = "") -> Path:
    with tarfile.open(path, "w:gz") as archive:
        archive.add(source, arcname=arcname or source.name)
    return path


def add_member(archive: tarfile.TarFile, name: str, data: bytes = b"x", **fields: object) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data) if fields.get("type", tarfile.REGTYPE) == tarfile.REGTYPE else 0
    for key, value in fields.items():
        setattr(info, key, value)
    archive.addfile(info, io.BytesIO(data) if info.size else None)


def _cifar_batch(images: np.ndarray, labels: list[int], label_key: bytes) -> bytes:
    planar = images.transpose(0, 3, 1, 2).reshape(len(images), -1)  # HWC -> CHW rows
    batch = {b"batch_label": b"generated", label_key: labels, b"data": planar, b"filenames": []}
    return pickle.dumps(batch, protocol=2)


def make_cifar_python_tarball(
    path: Path, variant: str = "cifar10", per_batch: int = 20, seed: int = 0
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A tarball in the published python layout; return {split: (images HWC, labels)}."""
    rng = np.random.default_rng(seed)
    n_classes = 10 if variant == "cifar10" else 100
    splits: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    with tarfile.open(path, "w:gz") as archive:

        def put(name: str, data: bytes) -> None:
            add_member(archive, name, data)

        if variant == "cifar10":
            folder = "cifar-10-batches-py"
            names = [f"class{i}".encode() for i in range(n_classes)]
            put(f"{folder}/batches.meta", pickle.dumps({b"label_names": names}, protocol=2))
            batches = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}
            label_key = b"labels"
        else:
            folder = "cifar-100-python"
            meta = {b"fine_label_names": [f"fine{i}".encode() for i in range(n_classes)]}
            put(f"{folder}/meta", pickle.dumps(meta, protocol=2))
            batches = {"train": ["train"], "test": ["test"]}
            label_key = b"fine_labels"
        for split, files in batches.items():
            all_images, all_labels = [], []
            for file in files:
                images = rng.integers(0, 256, size=(per_batch, 32, 32, 3), dtype=np.uint8)
                labels = [int(x) for x in rng.integers(0, n_classes, size=per_batch)]
                put(f"{folder}/{file}", _cifar_batch(images, labels, label_key))
                all_images.append(images)
                all_labels += labels
            splits[split] = (np.concatenate(all_images), np.array(all_labels))
    return splits


class _Exploit:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return (os.system, ("echo pwned",))


def make_hostile_cifar_tarball(path: Path) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        add_member(
            archive, "cifar-10-batches-py/data_batch_1", pickle.dumps(_Exploit(), protocol=2)
        )
        for name in ["data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"]:
            add_member(archive, f"cifar-10-batches-py/{name}", b"")
        meta = pickle.dumps({b"label_names": [f"c{i}".encode() for i in range(10)]}, protocol=2)
        add_member(archive, "cifar-10-batches-py/batches.meta", meta)
    return path
