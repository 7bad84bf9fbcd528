"""Hostile and broken input: each ends in one clear line naming the input and the problem,
and no output directory that looks complete."""

from __future__ import annotations

import os
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest
from datagen import add_member, make_hostile_cifar_tarball, make_image_folder, make_tar

from ampbench.components.prepare import SourceOptions, prepare_dataset
from ampbench.components.prepare.archive import Limits
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
    import io

    from PIL import Image

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
