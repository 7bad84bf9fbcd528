"""The prepare step: every source kind, subsets and splits, the cache, the reader's round trip."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import logging
import os
import re
import shutil
import tarfile
import tempfile
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from datagen import make_cifar_python_tarball, make_image_folder, make_tar
from PIL import Image

import ampbench
from ampbench.data import SourceOptions, prepare_dataset
from ampbench.data import dataset as dataset_module
from ampbench.data import sources as sources_module
from ampbench.data.dataset import _cache_key, channel_stats
from ampbench.dataset_format import read_metadata, read_split
from ampbench.errors import AmpbenchError

CIFAR_CLASSES = [
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"
]  # fmt: skip


def options(tmp_path: Path, **overrides: object) -> SourceOptions:
    return SourceOptions(cache_dir=tmp_path / "cache", **overrides)  # type: ignore[arg-type]


def assert_round_trip(dataset: Path, split: str, expected: list[tuple[str, np.ndarray]]) -> None:
    """Pixels and labels read back equal the source images, matched by the index column."""
    metadata = read_metadata(dataset)
    tensors = read_split(dataset, split)
    assert tensors.images.shape[1:] == (3, *expected[0][1].shape[:2])
    assert tensors.images.is_contiguous(memory_format=torch.channels_last)
    for row in range(len(tensors)):
        name, pixels = expected[int(tensors.indices[row])]
        assert metadata["classes"][int(tensors.labels[row])] == name
        assert np.array_equal(tensors.images[row].permute(1, 2, 0).numpy(), pixels)


def test_synthetic_is_learnable_shaped_data(tmp_path: Path) -> None:
    metadata = prepare_dataset("synthetic", tmp_path / "out", subset=200, options=options(tmp_path))
    assert metadata["counts"] == {"train": 200, "test": 200}
    assert metadata["class_counts"]["train"] == [20] * 10
    assert metadata["image_shape"] == [32, 32, 3]
    assert metadata["source"]["kind"] == "synthetic"
    train = read_split(tmp_path / "out", "train").images.double() / 255
    test = read_split(tmp_path / "out", "test").images.double() / 255
    # Normalisation statistics are the training images' own, exactly, per channel: a mean
    # over the test split too would leak it into training.
    assert metadata["mean"] == pytest.approx(train.mean(dim=(0, 2, 3)).tolist(), abs=1e-12)
    assert metadata["std"] == pytest.approx(train.std(dim=(0, 2, 3), correction=0).tolist())
    both = torch.cat([train, test])
    assert metadata["mean"] != pytest.approx(both.mean(dim=(0, 2, 3)).tolist(), abs=1e-6)


@pytest.mark.parametrize("chunk_pixels", [16, 1 << 20])
def test_channel_statistics_are_exact_in_chunks_and_whole(chunk_pixels: int) -> None:
    images = np.random.default_rng(3).integers(0, 256, size=(7, 5, 5, 3), dtype=np.uint8)
    mean, std = channel_stats(images, chunk_pixels=chunk_pixels)  # 175 pixels: 11 chunks of 16
    scaled = images.reshape(-1, 3) / 255.0
    assert mean == pytest.approx(scaled.mean(axis=0).tolist(), rel=1e-12)
    assert std == pytest.approx(scaled.std(axis=0).tolist(), rel=1e-12)


def test_the_cache_key_depends_on_content_and_settings_not_their_order() -> None:
    settings = {"subset": 0, "seed": 0, "image_size": None}
    key = _cache_key("ab" * 32, settings)
    assert re.fullmatch(r"[0-9a-f]{32}", key)
    assert _cache_key("ab" * 32, dict(reversed(settings.items()))) == key
    assert _cache_key("cd" * 32, settings) != key
    assert _cache_key("ab" * 32, {**settings, "seed": 1}) != key


def test_channel_statistics_of_one_pixel() -> None:
    mean, std = channel_stats(np.array([[[[51, 102, 255]]]], dtype=np.uint8))
    assert mean == pytest.approx([0.2, 0.4, 1.0]) and std == [0.0, 0.0, 0.0]


def test_cifar10_archive_subset_is_stratified_and_seeded(
    tmp_path: Path, cifar_archive: Path
) -> None:
    first = prepare_dataset(
        str(cifar_archive), tmp_path / "a", subset=100, options=options(tmp_path)
    )
    assert first["classes"] == CIFAR_CLASSES
    assert first["counts"] == {"train": 100, "test": 100}
    assert first["class_counts"]["train"] == [10] * 10
    assert first["source"]["kind"] == "imagefolder-archive"
    assert len(first["source"]["sha256"]) == 64
    again = prepare_dataset(
        str(cifar_archive), tmp_path / "b", subset=100, options=options(tmp_path), use_cache=False
    )
    other = prepare_dataset(
        str(cifar_archive), tmp_path / "c", subset=100, options=options(tmp_path, seed=1)
    )
    rows = {name: read_split(tmp_path / name, "train").indices for name in "abc"}
    assert torch.equal(rows["a"], rows["b"])
    assert not torch.equal(rows["a"], rows["c"])
    assert again["mean"] == first["mean"] and other["counts"] == first["counts"]


def test_a_subset_is_stratified_and_seeded(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "tree", ["a", "b", "c"], {"train": 12, "test": 3})
    source = str(tmp_path / "tree")

    def subset(name: str, seed: int = 0, use_cache: bool = True) -> dict:
        return prepare_dataset(
            source, tmp_path / name, subset=6, options=options(tmp_path, seed=seed),
            use_cache=use_cache,
        )  # fmt: skip

    first = subset("a")
    assert first["counts"] == {"train": 6, "test": 6}
    assert first["class_counts"] == {"train": [2, 2, 2], "test": [2, 2, 2]}
    again, other = subset("b", use_cache=False), subset("c", seed=1)
    rows = {name: read_split(tmp_path / name, "train").indices for name in "abc"}
    assert torch.equal(rows["a"], rows["b"]) and again["mean"] == first["mean"]
    assert not torch.equal(rows["a"], rows["c"]) and other["counts"] == first["counts"]


def test_png_tree_round_trips_exactly(tmp_path: Path) -> None:
    written = make_image_folder(tmp_path / "tree", ["cat", "dog", "emu"], {"train": 4, "test": 2})
    metadata = prepare_dataset(str(tmp_path / "tree"), tmp_path / "out", options=options(tmp_path))
    assert metadata["classes"] == ["cat", "dog", "emu"]
    assert metadata["counts"] == {"train": 12, "test": 6}
    assert metadata["source"]["kind"] == "imagefolder-dir"
    assert_round_trip(tmp_path / "out", "train", written["train"])
    assert_round_trip(tmp_path / "out", "test", written["test"])


def test_grayscale_rgba_and_other_sizes_become_rgb(tmp_path: Path) -> None:
    gray = make_image_folder(
        tmp_path / "gray", ["a", "b"], {"train": 3, "test": 1}, size=(24, 16), mode="L"
    )
    prepare_dataset(str(tmp_path / "gray"), tmp_path / "g", options=options(tmp_path))
    assert read_metadata(tmp_path / "g")["image_shape"] == [16, 24, 3]
    assert_round_trip(tmp_path / "g", "train", gray["train"])
    rgba = make_image_folder(tmp_path / "rgba", ["a", "b"], {"train": 2, "test": 1}, mode="RGBA")
    prepare_dataset(str(tmp_path / "rgba"), tmp_path / "r", options=options(tmp_path))
    assert_round_trip(tmp_path / "r", "train", rgba["train"])


def test_sizes_that_differ_need_image_size(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 2, "test": 1})
    Image.new("RGB", (40, 20)).save(tmp_path / "tree" / "train" / "a" / "big.png")
    with pytest.raises(AmpbenchError, match=r"images differ in size.*--image-size"):
        prepare_dataset(str(tmp_path / "tree"), tmp_path / "out", options=options(tmp_path))
    assert not (tmp_path / "out").exists()
    metadata = prepare_dataset(
        str(tmp_path / "tree"), tmp_path / "out", options=options(tmp_path, image_size=16)
    )
    assert metadata["image_shape"] == [16, 16, 3]
    assert metadata["counts"]["train"] == 5


def test_single_class_tree_is_split_by_test_fraction(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "flat", ["x", "y", "z", "w"], {"all": 10})
    for class_dir in (tmp_path / "flat" / "all").iterdir():
        shutil.move(class_dir, tmp_path / "flat" / class_dir.name)
    (tmp_path / "flat" / "all").rmdir()
    metadata = prepare_dataset(
        str(tmp_path / "flat"), tmp_path / "out", options=options(tmp_path, test_fraction=0.3)
    )
    assert metadata["classes"] == ["w", "x", "y", "z"]
    assert metadata["counts"] == {"train": 28, "test": 12}
    assert metadata["class_counts"]["test"] == [3, 3, 3, 3]


def test_train_without_test_gets_a_test_split_carved(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 10})
    metadata = prepare_dataset(
        str(tmp_path / "tree"), tmp_path / "out", options=options(tmp_path, test_fraction=0.2)
    )
    assert metadata["counts"] == {"train": 16, "test": 4}
    assert metadata["class_counts"]["test"] == [2, 2]
    assert_disjoint_splits(tmp_path / "out", ["train", "test"], 20)


def pixel_digests(dataset: Path, split: str) -> list[bytes]:
    return [image.numpy().tobytes() for image in read_split(dataset, split).images]


def assert_disjoint_splits(dataset: Path, splits: list[str], total: int) -> None:
    """No image in two splits, and together they are every (distinct) source image."""
    seen = [pixel_digests(dataset, split) for split in splits]
    assert sum(len(s) for s in seen) == len(set().union(*map(set, seen))) == total


@pytest.mark.parametrize("test_fraction", [0.2, 0.5])
def test_carved_splits_share_no_image(tmp_path: Path, test_fraction: float) -> None:
    make_image_folder(tmp_path / "tree", ["a", "b", "c"], {"train": 20}, size=(8, 8))
    metadata = prepare_dataset(
        str(tmp_path / "tree"),
        tmp_path / "out",
        val_fraction=0.25,
        options=options(tmp_path, test_fraction=test_fraction),
    )
    counts = metadata["counts"]
    assert counts["test"] == round(60 * test_fraction) and counts["val"] > 0
    assert_disjoint_splits(tmp_path / "out", ["train", "val", "test"], 60)


def test_a_damaged_prepared_dataset_is_one_line(tmp_path: Path) -> None:
    prepare_dataset("synthetic", tmp_path / "ds", subset=20, options=options(tmp_path))
    (tmp_path / "ds" / "metadata.json").write_text("{broken")
    with pytest.raises(AmpbenchError, match=r"metadata\.json: not a readable dataset metadata"):
        read_split(tmp_path / "ds", "train")
    prepare_dataset("synthetic", tmp_path / "ds2", subset=20, options=options(tmp_path))
    shard = next((tmp_path / "ds2" / "train").glob("*.parquet"))
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(AmpbenchError, match="split 'train' is unreadable"):
        read_split(tmp_path / "ds2", "train")


def test_val_fraction_carves_a_stratified_split(tmp_path: Path) -> None:
    metadata = prepare_dataset(
        "synthetic", tmp_path / "out", subset=500, val_fraction=0.2, options=options(tmp_path)
    )
    assert metadata["counts"] == {"train": 400, "val": 100, "test": 500}
    assert metadata["class_counts"]["val"] == [10] * 10
    train_rows = set(read_split(tmp_path / "out", "train").indices.tolist())
    val_rows = set(read_split(tmp_path / "out", "val").indices.tolist())
    assert not train_rows & val_rows


def test_own_val_folder_is_kept(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 3, "val": 2, "test": 1})
    metadata = prepare_dataset(str(tmp_path / "tree"), tmp_path / "out", options=options(tmp_path))
    assert metadata["counts"] == {"train": 6, "val": 4, "test": 2}
    with pytest.raises(AmpbenchError) as twice:
        prepare_dataset(
            str(tmp_path / "tree"), tmp_path / "out2", val_fraction=0.5, options=options(tmp_path)
        )
    assert str(twice.value) == "--val-fraction: the source has its own val/ split already"


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz", ".tgz", ".zip"])
def test_archives_of_every_kind(tmp_path: Path, suffix: str) -> None:
    written = make_image_folder(
        tmp_path / "data" / "mine", ["a", "b"], {"train": 2, "test": 1}, fmt="JPEG"
    )
    archive = tmp_path / f"mine{suffix}"
    if suffix == ".zip":
        with zipfile.ZipFile(archive, "w") as zf:
            for file in sorted((tmp_path / "data").rglob("*")):
                zf.write(file, file.relative_to(tmp_path / "data").as_posix())
    else:
        with tarfile.open(archive, "w:gz" if "gz" in suffix else "w") as tf:
            tf.add(tmp_path / "data" / "mine", arcname="mine")
    metadata = prepare_dataset(str(archive), tmp_path / "out", options=options(tmp_path))
    assert metadata["counts"] == {"train": 4, "test": 2}
    labels = read_split(tmp_path / "out", "train").labels.tolist()
    assert labels == [0, 0, 1, 1]
    assert len(written["train"]) == 4


@pytest.mark.parametrize("variant", ["cifar10", "cifar100"])
def test_cifar_python_tarball(tmp_path: Path, variant: str) -> None:
    expected = make_cifar_python_tarball(tmp_path / f"{variant}.tar.gz", variant)
    metadata = prepare_dataset(
        str(tmp_path / f"{variant}.tar.gz"), tmp_path / "out", options=options(tmp_path)
    )
    assert metadata["source"]["kind"] == f"{variant}-python"
    assert len(metadata["classes"]) == (10 if variant == "cifar10" else 100)
    for split in ("train", "test"):
        images, labels = expected[split]
        tensors = read_split(tmp_path / "out", split)
        order = tensors.indices.numpy()
        assert np.array_equal(tensors.labels.numpy(), labels[order])
        assert np.array_equal(tensors.images.permute(0, 2, 3, 1).numpy(), images[order])


def test_non_images_are_skipped_and_counted(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 2, "test": 1})
    (tmp_path / "tree" / "README.txt").write_text("about this data")
    (tmp_path / "tree" / "train" / "a" / ".DS_Store").write_bytes(b"\0\0")
    (tmp_path / "tree" / "train" / "b" / "notes.md").write_text("notes")
    metadata = prepare_dataset(str(tmp_path / "tree"), tmp_path / "out", options=options(tmp_path))
    assert metadata["counts"] == {"train": 4, "test": 2}
    assert metadata["skipped"] == {
        "hidden_files": 1,
        "files_outside_class_folders": 1,
        "non_image_files": 1,
        "bad_images": 0,
    }


def test_metadata_records_the_source_the_settings_and_every_file(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 3, "test": 1})
    metadata = prepare_dataset(
        str(tmp_path / "tree"), tmp_path / "out", subset=4, val_fraction=0.5,
        options=options(tmp_path, seed=3),
    )  # fmt: skip
    assert set(metadata) == {
        "format_version", "classes", "image_shape", "counts", "class_counts", "mean", "std",
        "source", "settings", "skipped", "bad_images", "files", "ampbench_version", "cache_key",
    }  # fmt: skip
    assert metadata["source"]["spec"] == str(tmp_path / "tree")
    assert set(metadata["source"]) == {"spec", "kind", "description", "sha256"}
    assert len(metadata["source"]["sha256"]) == 64 and metadata["source"]["description"]
    assert metadata["settings"] == {
        "test_fraction": 0.2, "image_size": None, "seed": 3, "skip_bad_images": False,
        "subset": 4, "val_fraction": 0.5,
    }  # fmt: skip
    on_disk = sorted(str(f.relative_to(tmp_path / "out")) for f in (tmp_path / "out").rglob("*"))
    assert sorted(metadata["files"]) == [f for f in on_disk if f.endswith(".parquet")]
    assert {f.split("/")[0] for f in metadata["files"]} == {"train", "val", "test"}
    assert metadata["ampbench_version"] == ampbench.__version__
    assert metadata["bad_images"] == []


def truncated_pngs(folder: Path, count: int, good: bytes) -> None:
    for i in range(count):
        (folder / f"bad{i:03d}.png").write_bytes(good[: len(good) // 2])


def test_bad_images_are_counted_over_the_splits_and_listed_up_to_a_hundred(
    tmp_path: Path,
) -> None:
    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 2, "test": 1})
    good = (tmp_path / "tree" / "train" / "a" / "0000.png").read_bytes()
    truncated_pngs(tmp_path / "tree" / "train" / "a", 60, good)
    truncated_pngs(tmp_path / "tree" / "test" / "b", 60, good)
    metadata = prepare_dataset(
        str(tmp_path / "tree"), tmp_path / "out", options=options(tmp_path, skip_bad_images=True)
    )
    assert metadata["counts"] == {"train": 4, "test": 2}
    assert metadata["skipped"]["bad_images"] == 120
    assert len(metadata["bad_images"]) == 100
    assert metadata["bad_images"][0].startswith("train/a/bad000.png")
    assert metadata["bad_images"][-1].startswith("test/b/bad039.png")


def test_a_split_of_one_usable_image_is_kept_and_one_of_none_is_named(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 2, "test": 1})
    good = (tmp_path / "tree" / "train" / "a" / "0000.png").read_bytes()
    shutil.rmtree(tmp_path / "tree" / "test" / "b")
    (tmp_path / "tree" / "test" / "b").mkdir()
    truncated_pngs(tmp_path / "tree" / "test" / "b", 1, good)
    settings = options(tmp_path, skip_bad_images=True)
    metadata = prepare_dataset(str(tmp_path / "tree"), tmp_path / "one", options=settings)
    assert metadata["counts"]["test"] == 1
    assert metadata["class_counts"]["test"] == [1, 0]  # class b, with no image, is counted
    truncated_pngs(tmp_path / "tree" / "test" / "a", 1, good)
    (tmp_path / "tree" / "test" / "a" / "0000.png").unlink()
    with pytest.raises(AmpbenchError) as refused:
        prepare_dataset(str(tmp_path / "tree"), tmp_path / "none", options=settings)
    assert str(refused.value) == f"{tmp_path / 'tree'}: the test split has no usable images"


def test_a_damaged_cache_entry_is_replaced_and_a_lost_race_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 2, "test": 1})
    source = str(tmp_path / "tree")
    # The cache is written beside itself, not in the temporary folder (maybe another disk).
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-folder"))
    first = prepare_dataset(source, tmp_path / "one", options=options(tmp_path))
    prepared = tmp_path / "cache" / "prepared"
    assert [p.name for p in prepared.iterdir()] == [first["cache_key"]]
    (prepared / first["cache_key"] / "metadata.json").write_text("{broken")
    prepare_dataset(source, tmp_path / "two", options=options(tmp_path))
    assert read_metadata(prepared / first["cache_key"])["counts"] == first["counts"]
    # Another process filled the cache first: ours is dropped, the output is still made.
    shutil.rmtree(prepared / first["cache_key"])
    replace = os.replace

    def lose_the_race(src: object, dst: object) -> None:
        if Path(str(dst)).parent == prepared:
            raise FileExistsError(dst)
        replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(dataset_module.os, "replace", lose_the_race)
    third = prepare_dataset(source, tmp_path / "three", options=options(tmp_path))
    assert third["counts"] == first["counts"] and not any(prepared.iterdir())


def test_same_source_and_options_again_is_a_cache_hit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 3, "test": 1})
    first = prepare_dataset(str(tmp_path / "tree"), tmp_path / "one", options=options(tmp_path))
    caplog.set_level(logging.INFO, logger="ampbench")
    logging.getLogger("ampbench").propagate = True
    try:
        second = prepare_dataset(
            str(tmp_path / "tree"), tmp_path / "two", options=options(tmp_path)
        )
        assert "cache hit" in caplog.text
        tree = str(tmp_path / "tree")
        assert second == {**first, "source": {**first["source"], "cached_from": tree}}
        caplog.clear()
        prepare_dataset(
            str(tmp_path / "tree"), tmp_path / "three", subset=2, options=options(tmp_path)
        )
        assert "cache hit" not in caplog.text
        # Changed content is a different source: no hit either.
        Image.new("RGB", (32, 32), "red").save(tmp_path / "tree" / "train" / "a" / "new.png")
        caplog.clear()
        prepare_dataset(str(tmp_path / "tree"), tmp_path / "four", options=options(tmp_path))
        assert "cache hit" not in caplog.text
    finally:
        logging.getLogger("ampbench").propagate = False


def test_a_cache_hit_names_this_runs_source_and_where_the_copy_came_from(
    tmp_path: Path,
) -> None:
    """The same content under another path: the prepared data (and so the report, results and
    MLflow params) names the path given now; the first preparer's path is kept apart."""
    make_image_folder(tmp_path / "first", ["a", "b"], {"train": 3, "test": 1})
    shutil.copytree(tmp_path / "first", tmp_path / "mine")
    prepare_dataset(str(tmp_path / "first"), tmp_path / "one", options=options(tmp_path))
    hit = prepare_dataset(str(tmp_path / "mine"), tmp_path / "two", options=options(tmp_path))
    assert hit["source"]["spec"] == str(tmp_path / "mine")
    assert hit["source"]["cached_from"] == str(tmp_path / "first")
    assert read_metadata(tmp_path / "two")["source"] == hit["source"]
    # A third path still names the first preparer, not the second.
    shutil.copytree(tmp_path / "first", tmp_path / "third")
    again = prepare_dataset(str(tmp_path / "third"), tmp_path / "three", options=options(tmp_path))
    assert again["source"]["cached_from"] == str(tmp_path / "first")


def test_cifar10_download_offline_fails_with_a_suggestion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A closed local port stands in for "no network", also on machines that have one.
    monkeypatch.setitem(
        sources_module.DOWNLOADS, "cifar10", ("http://127.0.0.1:9/cifar-10-python.tar.gz", "0")
    )
    with pytest.raises(AmpbenchError) as raised:
        prepare_dataset("cifar10", tmp_path / "out", options=options(tmp_path))
    message = str(raised.value)
    assert "cifar10: cannot download" in message
    assert "pass a local copy" in message and "--data" in message
    assert "\n" not in message
    assert not (tmp_path / "out").exists()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A local HTTP server over a folder (the port its own): (base URL, folder)."""
    folder = tmp_path / "served"
    folder.mkdir()
    handler = functools.partial(QuietHandler, directory=str(folder))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield f"http://127.0.0.1:{server.server_address[1]}", folder
        server.shutdown()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_download_whose_checksum_does_not_match_is_refused_and_not_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, served: tuple[str, Path]
) -> None:
    base, folder = served
    expected = make_cifar_python_tarball(folder / "cifar-10-python.tar.gz")
    url = f"{base}/cifar-10-python.tar.gz"
    md5 = hashlib.md5((folder / "cifar-10-python.tar.gz").read_bytes()).hexdigest()
    monkeypatch.setitem(sources_module.DOWNLOADS, "cifar10", (url, "0" * 32))
    with pytest.raises(AmpbenchError) as raised:
        prepare_dataset("cifar10", tmp_path / "out", options=options(tmp_path))
    assert str(raised.value) == (
        f"cifar10: the download of {url} is corrupt (MD5 {md5}, expected {'0' * 32}); try again"
    )
    assert not (tmp_path / "out").exists()
    assert not list((tmp_path / "cache" / "downloads").iterdir())
    # With the published checksum the same download is kept and prepared.
    monkeypatch.setitem(sources_module.DOWNLOADS, "cifar10", (url, md5))
    prepare_dataset("cifar10", tmp_path / "out", options=options(tmp_path))
    labels = read_split(tmp_path / "out", "train").labels.numpy()
    assert sorted(labels) == sorted(expected["train"][1])
    assert (tmp_path / "cache" / "downloads" / "cifar-10-python.tar.gz").exists()


def test_missing_path_and_unknown_file_kind(tmp_path: Path) -> None:
    with pytest.raises(AmpbenchError, match="no such file or directory"):
        prepare_dataset(str(tmp_path / "nope"), tmp_path / "out", options=options(tmp_path))
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(AmpbenchError, match=r"not a directory or a \.tar"):
        prepare_dataset(str(tmp_path / "data.csv"), tmp_path / "out", options=options(tmp_path))


def test_output_over_an_unrelated_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep me")
    with pytest.raises(AmpbenchError, match="not a prepared dataset"):
        prepare_dataset("synthetic", tmp_path / "out", subset=20, options=options(tmp_path))
    assert (tmp_path / "out" / "mine.txt").read_text() == "keep me"
    # An earlier prepared dataset is replaced, and nothing else is left behind.
    prepare_dataset("synthetic", tmp_path / "ds", subset=20, options=options(tmp_path))
    prepare_dataset("synthetic", tmp_path / "ds", subset=30, options=options(tmp_path))
    assert json.loads((tmp_path / "ds" / "metadata.json").read_text())["counts"]["train"] == 30
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "ds", "out"]


def test_an_empty_output_directory_is_used(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    prepare_dataset("synthetic", tmp_path / "out", subset=20, options=options(tmp_path))
    assert read_metadata(tmp_path / "out")["counts"]["train"] == 20


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"subset": -1}, "--subset: must be 0 (all) or a positive count, not -1"),
        ({"val_fraction": -0.1}, "--val-fraction: must be in [0, 1), not -0.1"),
        ({"val_fraction": 1.0}, "--val-fraction: must be in [0, 1), not 1.0"),
        ({"test_fraction": 0.0}, "--test-fraction: must be in (0, 1), not 0.0"),
        ({"test_fraction": 1.0}, "--test-fraction: must be in (0, 1), not 1.0"),
        ({"image_size": 0}, "--image-size: must be 1 to 1024 pixels, not 0"),
        ({"image_size": 1025}, "--image-size: must be 1 to 1024 pixels, not 1025"),
    ],
)
def test_settings_out_of_range_are_named(tmp_path: Path, settings: dict, message: str) -> None:
    subset = settings.pop("subset", 0)
    val_fraction = settings.pop("val_fraction", 0.0)
    with pytest.raises(AmpbenchError) as refused:
        prepare_dataset(
            "synthetic", tmp_path / "out", subset=subset, val_fraction=val_fraction,
            options=options(tmp_path, **settings),
        )  # fmt: skip
    assert str(refused.value) == message
    assert not (tmp_path / "out").exists()


def test_settings_at_the_edges_of_their_ranges_are_taken(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    make_image_folder(tree, ["a", "b"], {"train": 4, "test": 2})
    for size in (1, 1024):
        metadata = prepare_dataset(
            str(tree), tmp_path / f"out{size}", options=options(tmp_path, image_size=size)
        )
        assert metadata["image_shape"][:2] == [size, size]


def test_archive_of_the_tree_equals_the_tree(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 3, "test": 2})
    make_tar(tmp_path / "tree.tar.gz", tmp_path / "tree")
    prepare_dataset(str(tmp_path / "tree"), tmp_path / "dir", options=options(tmp_path))
    prepare_dataset(str(tmp_path / "tree.tar.gz"), tmp_path / "tgz", options=options(tmp_path))
    for split in ("train", "test"):
        a, b = read_split(tmp_path / "dir", split), read_split(tmp_path / "tgz", split)
        assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
