"""The prepare step as a plain function: a data source in, a prepared dataset directory out."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from ampbench import __version__
from ampbench.data.sources import (
    SourceOptions,
    Split,
    load,
    resolve_sha256,
)
from ampbench.dataset_format import FORMAT_VERSION, METADATA_FILE, read_metadata, write_split
from ampbench.errors import AmpbenchError
from ampbench.logs import Progress, log
from ampbench.sampling import stratified_split, stratified_take

MAX_LISTED_BAD_IMAGES = 100
# No validation split unless asked: arms are compared on the test split.
DEFAULT_VAL_FRACTION = 0.0


def channel_stats(
    images: np.ndarray, chunk_pixels: int = 1 << 20
) -> tuple[list[float], list[float]]:
    """Per-channel mean and std on the 0-1 scale, exact: from each channel's histogram.

    A chunk at a time, each value offset by 256 x its channel, so that one bincount over the
    contiguous buffer counts all channels at once (no strided copies, little memory).
    """
    channels = images.shape[-1]
    pixels = images.reshape(-1, channels)
    offsets = np.arange(channels, dtype=np.int32) * 256
    counts = np.zeros(channels * 256, dtype=np.int64)
    for start in range(0, len(pixels), chunk_pixels):
        keys = pixels[start : start + chunk_pixels].astype(np.int32) + offsets
        counts += np.bincount(keys.reshape(-1), minlength=channels * 256)
    histograms = counts.reshape(channels, 256)
    values = np.arange(256, dtype=np.float64) / 255.0
    total = max(1, len(pixels))
    means = histograms @ values / total
    variances = np.maximum(histograms @ values**2 / total - means**2, 0.0)
    return means.tolist(), np.sqrt(variances).tolist()


def _cache_key(sha256: str, settings: dict[str, Any]) -> str:
    payload = json.dumps({"format": FORMAT_VERSION, "source": sha256, **settings}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def _publish(staging: Path, output_dir: Path) -> None:
    """Move a finished dataset into place; an earlier prepared dataset there is replaced."""
    if output_dir.exists():
        if output_dir.is_dir() and not any(output_dir.iterdir()):
            output_dir.rmdir()
        elif (output_dir / METADATA_FILE).is_file():
            retired = output_dir.with_name(f".{output_dir.name}.old-{os.getpid()}")
            os.replace(output_dir, retired)
            shutil.rmtree(retired)
        else:
            raise AmpbenchError(f"{output_dir}: exists and is not a prepared dataset; refused")
    os.replace(staging, output_dir)


def _cached_metadata(cached: Path) -> dict[str, Any] | None:
    """The metadata of a cached dataset, or None when there is none (or it is damaged)."""
    try:
        return read_metadata(cached)
    except AmpbenchError:
        return None


def _select_rows(
    splits: dict[str, Split], subset: int, val_fraction: float, rng: np.random.Generator
) -> dict[str, tuple[Split, np.ndarray]]:
    """Which rows of which source split make each output split."""
    chosen = {}
    for name, split in splits.items():
        rows = np.arange(len(split.labels))
        chosen[name] = (split, stratified_take(split.labels, subset, rng) if subset else rows)
    if val_fraction:
        if "val" in splits:
            raise AmpbenchError("--val-fraction: the source has its own val/ split already")
        train, rows = chosen["train"]
        val_positions, train_positions = stratified_split(train.labels[rows], val_fraction, rng)
        chosen["train"] = (train, rows[train_positions])
        chosen["val"] = (train, rows[val_positions])
    return chosen


def prepare_dataset(
    source: str,
    output_dir: Path,
    *,
    subset: int = 0,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    options: SourceOptions | None = None,
    use_cache: bool = True,
) -> dict[str, Any]:
    """Prepare `source` into `output_dir` (Parquet shards + metadata.json); return the metadata.

    The result appears at `output_dir` only when complete. Preparing the same content with the
    same settings again copies the cached result instead of decoding anything.
    """
    options = options or SourceOptions()
    _check_settings(subset, val_fraction, options)
    started = time.perf_counter()
    output_dir = Path(output_dir).absolute()
    sha256, local = resolve_sha256(source, options)
    settings = {
        "subset": subset,
        "val_fraction": val_fraction,
        "test_fraction": options.test_fraction,
        "image_size": options.image_size,
        "seed": options.seed,
        "skip_bad_images": options.skip_bad_images,
    }
    key = _cache_key(sha256, settings)
    cached = options.cache_dir / "prepared" / key
    staging = _staging_beside(output_dir)
    try:
        hit = _cached_metadata(cached) if use_cache else None
        if hit is not None:
            # Copies, not links: a user who edits the output must not edit the cache.
            shutil.rmtree(staging)
            shutil.copytree(cached, staging)
            # The source is this run's; where the cached copy was prepared from is kept apart.
            # (The cache holds a copy as it was built, so its spec is the first preparer's.)
            metadata = {
                **hit,
                "source": {**hit["source"], "spec": source, "cached_from": hit["source"]["spec"]},
            }
            (staging / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
            log.info(
                "prepare: cache hit for %s (key %s, prepared from %s), nothing decoded",
                source,
                key,
                metadata["source"]["cached_from"],
            )
        else:
            with _one_line_errors(source, output_dir):
                metadata = _build(source, staging, sha256, local, subset, val_fraction, options)
            metadata["cache_key"] = key
            (staging / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
            if use_cache:
                _store_in_cache(staging, cached)
        _publish(staging, output_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    counts = ", ".join(f"{split} {n:,}" for split, n in metadata["counts"].items())
    skipped = sum(metadata["skipped"].values())
    log.info(
        "prepare: %s -> %s: %s images, %d classes, %d files skipped, %.1f s",
        source,
        output_dir,
        counts,
        len(metadata["classes"]),
        skipped,
        time.perf_counter() - started,
    )
    return metadata


def _staging_beside(output_dir: Path) -> Path:
    """A fresh directory beside output_dir, on its file system, to build the result in."""
    try:
        output_dir.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.tmp-", dir=output_dir.parent))
    except OSError as error:
        raise AmpbenchError(
            f"--output-dir {output_dir}: cannot write there ({error.strerror or error})"
        ) from None


def _check_settings(subset: int, val_fraction: float, options: SourceOptions) -> None:
    if subset < 0:
        raise AmpbenchError(f"--subset: must be 0 (all) or a positive count, not {subset}")
    if not 0.0 <= val_fraction < 1.0:
        raise AmpbenchError(f"--val-fraction: must be in [0, 1), not {val_fraction}")
    if not 0.0 < options.test_fraction < 1.0:
        raise AmpbenchError(f"--test-fraction: must be in (0, 1), not {options.test_fraction}")
    if options.image_size is not None and not 1 <= options.image_size <= 1024:
        raise AmpbenchError(f"--image-size: must be 1 to 1024 pixels, not {options.image_size}")


@contextmanager
def _one_line_errors(source: str, output_dir: Path) -> Iterator[None]:
    """A full disk, a file that vanished while read, or memory run out: one line each."""
    try:
        yield
    except OSError as error:
        where = error.filename or output_dir
        raise AmpbenchError(f"{where}: {error.strerror or error}") from None
    except MemoryError:
        # The checks before each large allocation cannot see everything (a decoder's own
        # buffers); whatever runs out, the user gets one line, not a traceback.
        raise AmpbenchError(
            f"{source}: ran out of memory while preparing it; pass --subset or "
            "--image-size, or give the step more memory"
        ) from None


def _store_in_cache(staging: Path, cached: Path) -> None:
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=cached.parent))
    try:
        shutil.rmtree(partial)
        shutil.copytree(staging, partial)
        if cached.exists():  # damaged (else it would have been a hit): ours replaces it
            shutil.rmtree(cached, ignore_errors=True)
        os.replace(partial, cached)
    except OSError:  # another process filled the cache first: theirs is as good as ours
        shutil.rmtree(partial, ignore_errors=True)


def _build(
    source: str,
    staging: Path,
    sha256: str,
    local: Path | None,
    subset: int,
    val_fraction: float,
    options: SourceOptions,
) -> dict[str, Any]:
    data = load(source, options, sha256, local)
    rng = np.random.default_rng(options.seed)
    chosen = _select_rows(data.splits, subset, val_fraction, rng)
    skipped = Counter(data.skipped)
    bad_images: list[str] = []
    counts: dict[str, int] = {}
    class_counts: dict[str, list[int]] = {}
    files: list[str] = []
    image_shape: list[int] = []
    mean = std = [0.0, 0.0, 0.0]
    total = sum(len(rows) for _, rows in chosen.values())
    # The progress display's wording is no answer of ours: not mutation-tested.
    with Progress(total, "prepare: decoding", unit="img") as progress:  # pragma: no mutate
        for name in ("train", "val", "test"):
            if name not in chosen:
                continue
            split, rows = chosen[name]
            images, kept, bad = split.materialize(rows, progress.update)
            skipped["bad_images"] += len(bad)
            bad_images.extend(bad[: MAX_LISTED_BAD_IMAGES - len(bad_images)])
            if len(kept) == 0:
                raise AmpbenchError(f"{source}: the {name} split has no usable images")
            labels = split.labels[kept]
            files += write_split(staging, name, images, labels, kept)
            counts[name] = len(kept)
            class_counts[name] = np.bincount(labels, minlength=len(data.classes)).tolist()
            image_shape = list(images.shape[1:])
            if name == "train":
                mean, std = channel_stats(images)
    return {
        "format_version": FORMAT_VERSION,
        "classes": data.classes,
        "image_shape": image_shape,
        "counts": counts,
        "class_counts": class_counts,
        "mean": mean,
        "std": std,
        "source": {
            "spec": source,
            "kind": data.kind,
            "description": data.description,
            "sha256": data.sha256,
        },
        "settings": _settings_record(options, subset, val_fraction),
        "skipped": dict(skipped),
        "bad_images": bad_images,
        "files": files,
        "ampbench_version": __version__,
    }


def _settings_record(options: SourceOptions, subset: int, val_fraction: float) -> dict[str, Any]:
    """The settings the data was prepared with, as metadata.json records them."""
    recorded = {k: v for k, v in asdict(options).items() if k not in ("cache_dir", "limits")}
    return {**recorded, "subset": subset, "val_fraction": val_fraction}
