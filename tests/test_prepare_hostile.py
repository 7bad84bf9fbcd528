"""Hostile and broken input: each ends in one clear line naming the input and the problem,
and no output directory that looks complete."""

from __future__ import annotations

import io
import os
import pickle
import stat
import struct
import subprocess
import sys
import tarfile
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from datagen import (
    add_member,
    make_cifar_python_tarball,
    make_hostile_cifar_tarball,
    make_image_folder,
    make_tar,
)
from PIL import Image

from ampbench.data import SourceOptions, prepare_dataset
from ampbench.data.limits import Limits
from ampbench.errors import AmpbenchError


def prepare_fails(tmp_path: Path, source: Path | str, pattern: str, **options: object) -> str:
    out = tmp_path / "out"
    with pytest.raises(AmpbenchError, match=pattern) as raised:
        prepare_dataset(
            str(source),
            out,
            options=SourceOptions(cache_dir=tmp_path / "cache", **options),  # type: ignore[arg-type]
        )
    message = str(raised.value)
    assert "\n" not in message
    assert not out.exists(), "a failed prepare left an output directory behind"
    assert not list(tmp_path.glob(".out.tmp-*")), "a failed prepare left its staging behind"
    return message


def tar_with(tmp_path: Path, *members: tuple[str, dict[str, object]]) -> Path:
    path = tmp_path / "hostile.tar"
    with tarfile.open(path, "w") as archive:
        add_member(archive, "d/train/a/0.png", make_png())
        for name, fields in members:
            add_member(archive, name, **fields)  # type: ignore[arg-type]
    return path


def make_png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("member", "fields", "pattern"),
    [
        ("../evil.png", {}, "points outside the archive"),
        ("d/../../evil.png", {}, "points outside the archive"),
        ("/etc/evil.png", {}, "absolute path"),
        ("d/train/a/link.png", {"type": tarfile.SYMTYPE, "linkname": "/etc/passwd"}, "is a link"),
        (
            "d/train/a/hard.png",
            {"type": tarfile.LNKTYPE, "linkname": "d/train/a/0.png"},
            "is a link",
        ),
        ("d/train/a/dev", {"type": tarfile.CHRTYPE, "devmajor": 1, "devminor": 3}, "device"),
        ("d/train/a/fifo", {"type": tarfile.FIFOTYPE}, "device or pipe"),
    ],
)
def test_hostile_tar_members_are_refused(
    tmp_path: Path, member: str, fields: dict[str, object], pattern: str
) -> None:
    message = prepare_fails(tmp_path, tar_with(tmp_path, (member, fields)), pattern)
    assert "hostile.tar" in message


def test_zip_slip_and_zip_symlinks_are_refused(tmp_path: Path) -> None:
    slip = tmp_path / "slip.zip"
    with zipfile.ZipFile(slip, "w") as archive:
        archive.writestr("d/train/a/0.png", make_png())
        archive.writestr("../../outside.png", make_png())
    prepare_fails(tmp_path, slip, "points outside the archive")
    link = tmp_path / "link.zip"
    with zipfile.ZipFile(link, "w") as archive:
        info = zipfile.ZipInfo("d/train/a/link.png")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(info, "/etc/passwd")
    prepare_fails(tmp_path, link, "is a link")


def test_archive_past_the_size_limit_is_refused(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 5, "test": 2})
    archive = make_tar(tmp_path / "big.tar.gz", tmp_path / "tree")
    prepare_fails(tmp_path, archive, "expands past 2,000 bytes", limits=Limits(max_bytes=2000))


def test_archive_with_absurd_member_count_is_refused(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 5, "test": 2})
    archive = make_tar(tmp_path / "many.tar.gz", tmp_path / "tree")
    prepare_fails(tmp_path, archive, "more than 10 members", limits=Limits(max_members=10))


def test_zip_member_lying_about_its_size_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "bomb.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("d/train/a/0.png", b"\0" * 100_000)
    prepare_fails(tmp_path, archive, "expands past 1,000 bytes", limits=Limits(max_bytes=1000))


def test_corrupt_image_is_named_or_skipped(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 3, "test": 1}, fmt="JPEG")
    good = (tmp_path / "tree" / "train" / "a" / "0000.jpg").read_bytes()
    (tmp_path / "tree" / "train" / "b" / "0001.jpg").write_bytes(good[: len(good) // 2])
    message = prepare_fails(tmp_path, tmp_path / "tree", "0001.jpg")
    assert "--skip-bad-images" in message
    metadata = prepare_dataset(
        str(tmp_path / "tree"),
        tmp_path / "out",
        options=SourceOptions(cache_dir=tmp_path / "cache", skip_bad_images=True),
    )
    assert metadata["counts"]["train"] == 5
    assert metadata["skipped"]["bad_images"] == 1
    assert metadata["bad_images"][0].startswith("train/b/0001.jpg")


def test_truncated_png_is_named(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 2, "test": 1})
    path = tmp_path / "tree" / "test" / "a" / "0000.png"
    path.write_bytes(path.read_bytes()[:60])
    prepare_fails(tmp_path, tmp_path / "tree", "test/a/0000.png")


def test_class_folder_without_images(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 2, "test": 1})
    (tmp_path / "tree" / "train" / "c").mkdir()
    (tmp_path / "tree" / "test" / "c").mkdir()
    prepare_fails(tmp_path, tmp_path / "tree", "train/c/ has no images")


def test_single_class(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "tree", ["only"], {"train": 2, "test": 1})
    prepare_fails(tmp_path, tmp_path / "tree", "found 1 class folder.*at least 2")


def test_train_and_test_with_different_classes(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 2})
    make_image_folder(tmp_path / "tree", ["a", "c"], {"test": 1})
    message = prepare_fails(tmp_path, tmp_path / "tree", "different classes")
    assert "'b'" in message and "'c'" in message


def test_no_train_folder(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "tree", ["a", "b"], {"test": 2})
    prepare_fails(tmp_path, tmp_path / "tree", "has test/ but no train/")


def test_hostile_cifar_pickle_is_refused(tmp_path: Path) -> None:
    archive = make_hostile_cifar_tarball(tmp_path / "cifar-10-python.tar.gz")
    message = prepare_fails(tmp_path, archive, r"posix\.system|os\.system")
    assert "refused as hostile" in message


def test_symlink_in_a_directory_source_is_refused(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 2, "test": 1})
    (tmp_path / "tree" / "train" / "a" / "escape.png").symlink_to("/etc/passwd")
    prepare_fails(tmp_path, tmp_path / "tree", "links and special files")


def test_not_an_archive_at_all(tmp_path: Path) -> None:
    fake = tmp_path / "fake.tar.gz"
    fake.write_bytes(b"this is not gzip")
    prepare_fails(tmp_path, fake, "not a readable tar archive")


def test_encrypted_zip_member(tmp_path: Path) -> None:
    archive = tmp_path / "locked.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for name in ("d/train/a/0.png", "d/train/b/0.png", "d/test/a/0.png", "d/test/b/0.png"):
            zf.writestr(name, make_png())
    # Mark the first member encrypted, as a password-protected archive does (zipfile cannot
    # write one): general-purpose flag bit 0 in its local and central directory headers.
    data = bytearray(archive.read_bytes())
    local = data.index(b"PK\x03\x04")
    central = data.index(b"PK\x01\x02")
    data[local + 6] |= 1
    data[central + 8] |= 1
    archive.write_bytes(bytes(data))
    prepare_fails(tmp_path, archive, "cannot read this zip archive")


def test_fifo_in_a_directory_source_is_refused_before_it_is_read(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 2, "test": 1})
    os.mkfifo(tmp_path / "tree" / "train" / "a" / "pipe.png")  # reading it would hang
    prepare_fails(tmp_path, tmp_path / "tree", "links and special files")


def png_declaring(width: int, height: int) -> bytes:
    """A valid PNG header (IHDR) declaring width x height, with no pixel data behind it."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


def jpeg_declaring(width: int, height: int) -> bytes:
    """A real 8x8 JPEG whose frame header (SOF0) is patched to declare width x height."""

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, "JPEG")
    data = bytearray(buffer.getvalue())
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def folder_with(tmp_path: Path, name: str, data: bytes) -> Path:
    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 2, "test": 1})
    (tmp_path / "tree" / "train" / "a" / name).write_bytes(data)
    return tmp_path / "tree"


@pytest.mark.parametrize(
    ("name", "data", "declared"),
    [
        ("bomb.png", png_declaring(30000, 30000), "30000x30000"),
        ("bomb.jpg", jpeg_declaring(65000, 65000), "65000x65000"),
    ],
)
def test_decompression_bombs_are_refused_from_their_header(
    tmp_path: Path, name: str, data: bytes, declared: str
) -> None:
    """A few hundred bytes that declare billions of pixels: refused by name, from the header,
    before any pixel is decoded or any array allocated; skipping bad images does not admit it."""
    tree = folder_with(tmp_path, name, data)
    message = prepare_fails(tmp_path, tree, f"train/a/{name}: its header declares {declared}")
    assert "--max-image-pixels" in message
    prepare_fails(tmp_path, tree, declared, skip_bad_images=True)


def test_pixel_limit_is_an_option(tmp_path: Path) -> None:
    tree = folder_with(tmp_path, "big.png", png_declaring(100, 100))
    prepare_fails(tmp_path, tree, "100x100 pixels", limits=Limits(max_image_pixels=99 * 99))


def test_decoded_size_is_checked_before_the_array_is_allocated(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 4, "test": 2})
    message = prepare_fails(
        tmp_path,
        tmp_path / "tree",
        "would take .* more than the",
        limits=Limits(max_decoded_bytes=100),
    )
    assert "--image-size" in message


def test_decoded_size_beyond_the_memory_limit_is_refused(tmp_path: Path) -> None:
    """Under an address-space limit (ulimit -v), a data set whose decoded images cannot fit is
    refused in one line by a real `ampbench prepare`, not ended by a MemoryError."""

    buffer = io.BytesIO()  # a 4000x4000 PNG of one colour: 30 KB, 48 MB decoded
    Image.new("RGB", (4000, 4000), (200, 0, 0)).save(buffer, "PNG")
    tree = tmp_path / "tree"
    for split, count in (("train", 40), ("test", 2)):
        for label in ("a", "b"):
            folder = tree / split / label
            folder.mkdir(parents=True)
            for i in range(count):
                (folder / f"{i}.png").write_bytes(buffer.getvalue())
    limit = 1536 * 2**20  # 1.5 GiB of address space: the 80 train images need 3.8 GB
    script = (
        "import resource, sys; from ampbench.cli import main; "
        f"resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit})); sys.exit(main())"
    )
    out = tmp_path / "out"
    command = [sys.executable, "-c", script, "prepare", "--data", str(tree)]
    command += ["--output-dir", str(out), "--cache-dir", str(tmp_path / "cache")]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("ampbench: error: "), result.stderr
    assert "memory free here" in lines[-1] and "Traceback" not in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("image_format", ["EPS", "ICO", "PSD"])
def test_formats_outside_the_allowlist_are_not_decoded(tmp_path: Path, image_format: str) -> None:
    """An EPS (which Pillow would hand to Ghostscript) named .png is not opened as EPS."""

    if image_format == "PSD":
        data = (
            b"8BPS\x00\x01"
            + b"\x00" * 6
            + b"\x00\x03"
            + b"\x00\x00\x00\x08" * 2
            + b"\x00\x08\x00\x03"
        )
    else:
        buffer = io.BytesIO()
        Image.new("RGB", (8, 8)).save(buffer, image_format)
        data = buffer.getvalue()
    tree = folder_with(tmp_path, "disguised.png", data)
    prepare_fails(tmp_path, tree, "train/a/disguised.png: not a readable image")


def test_files_of_other_formats_are_skipped_by_extension(tmp_path: Path) -> None:
    tree = folder_with(tmp_path, "vector.eps", b"%!PS-Adobe-3.0 EPSF-3.0\n")
    metadata = prepare_dataset(
        str(tree), tmp_path / "out", options=SourceOptions(cache_dir=tmp_path / "cache")
    )
    assert metadata["skipped"]["non_image_files"] == 1


def test_a_member_that_comes_twice_is_refused(tmp_path: Path) -> None:
    archive = tar_with(tmp_path, ("d/train/a/0.png", {"data": make_png()}))
    prepare_fails(tmp_path, archive, "'d/train/a/0.png' appears twice")


def cifar_with(tmp_path: Path, member: str, value: object) -> Path:
    """A CIFAR-10 python tarball whose `member` holds `value`, pickled (protocol 4: protocol
    2 pickles b"" as a call, which the restricted unpickler refuses before any check)."""
    path = tmp_path / "cifar-10-python.tar.gz"
    make_cifar_python_tarball(path)
    rebuilt = tmp_path / "rebuilt.tar.gz"
    with tarfile.open(path) as original, tarfile.open(rebuilt, "w:gz") as archive:
        for info in original.getmembers():
            handle = original.extractfile(info)
            data = handle.read() if handle else b""
            if info.name.endswith("/" + member):
                data = pickle.dumps(value, protocol=4)
            add_member(archive, info.name, data)
    return rebuilt


@pytest.mark.parametrize(
    ("meta", "pattern"),
    [
        ({b"num_cases_per_batch": 10000}, "batches.meta: has no 'label_names' list"),
        ({b"label_names": b"airplane"}, "has no 'label_names' list"),
        ({b"label_names": [b"a", b"b"]}, "holds 2 class names, not 10"),
        ({b"label_names": [1] * 10}, "something other than class names"),
        ({b"label_names": [b"a"] * 10}, "names a class twice"),
        ({b"label_names": [b"\xff"] * 10}, "not UTF-8"),
        ([b"label_names"], "not a dict"),
    ],
)
def test_malformed_cifar_metadata_is_named(tmp_path: Path, meta: object, pattern: str) -> None:
    prepare_fails(tmp_path, cifar_with(tmp_path, "batches.meta", meta), pattern)


@pytest.mark.parametrize(
    ("batch", "pattern"),
    [
        ({b"labels": [0]}, "'data' is not a uint8"),
        ({b"data": "pixels", b"labels": [0]}, "'data' is not a uint8"),
        ({b"data": "f4", b"labels": [0]}, "'data' is not a uint8"),
        ({b"data": (1, 100), b"labels": [0]}, "'data' is not a uint8"),
        ({b"data": (2, 3072)}, "'labels' is not a list of integer labels"),
        ({b"data": (2, 3072), b"labels": ["a", "b"]}, "'labels' is not a list of integer"),
        ({b"data": (2, 3072), b"labels": [0]}, "2 images but 1 'labels'"),
        ({b"data": (2, 3072), b"labels": [0, 10]}, "'labels' fall outside the 10 classes"),
        ({b"data": (0, 3072), b"labels": []}, "holds no images"),
    ],
)
def test_malformed_cifar_batches_are_named(tmp_path: Path, batch: dict, pattern: str) -> None:
    data = batch.get(b"data")
    if isinstance(data, tuple):
        batch = {**batch, b"data": np.zeros(data, np.uint8)}
    elif data == "f4":
        batch = {**batch, b"data": np.zeros((1, 3072), np.float32)}
    rebuilt = cifar_with(tmp_path, "data_batch_3", batch)
    prepare_fails(tmp_path, rebuilt, "data_batch_3: " + pattern)


def test_a_member_name_with_a_newline_is_named_on_one_line(tmp_path: Path) -> None:
    """Found by the fuzz tests: a zip member named "\\n", twice."""
    archive = tmp_path / "names.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for name in ("d/train/a/0.png", "d/train/b/0.png", "line\nbreak", "line\nbreak"):
            zf.writestr(zipfile.ZipInfo(name), make_png())
    message = prepare_fails(tmp_path, archive, "appears twice")
    assert "'line\\nbreak' appears twice" in message  # the newline shown as \n


def test_an_unreadable_file_in_a_tree_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a file without read permission fails for a user (these tests may run as root,
    who reads anything, so the refusal is made by the file system call itself)."""
    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 2, "test": 1})
    locked = tmp_path / "tree" / "train" / "a" / "0000.png"
    read_bytes = Path.read_bytes

    def refuse_locked(path: Path) -> bytes:
        if path == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", refuse_locked)
    prepare_fails(tmp_path, tmp_path / "tree", "0000.png: cannot be read .Permission denied")


def test_a_pipe_named_like_an_archive_is_refused_before_it_is_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "data.tar")  # opening it would wait for a writer forever
    prepare_fails(tmp_path, tmp_path / "data.tar", "not a regular file or a directory")


def test_an_output_directory_that_cannot_be_made_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("a file, not a folder")
    with pytest.raises(AmpbenchError, match=r"--output-dir .*file/out: cannot write there"):
        prepare_dataset("synthetic", tmp_path / "file" / "out", subset=10)
