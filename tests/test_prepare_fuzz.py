"""Property-based fuzzing of the prepare step: valid tar, tar.gz and zip archives, ImageFolder
trees and CIFAR pickles, mutated (bytes flipped, truncated or inserted; members renamed,
duplicated, dropped, reordered; pickled values swapped for others), must each either prepare
or be refused with the tool's own one-line error: never another exception, never a file
outside the output, never a half-written output.

`make test` runs the "ci" profile (a few hundred cases per test); `make fuzz` runs more.
"""

from __future__ import annotations

import io
import pickle
import tarfile
import tempfile
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from datagen import add_member, make_cifar_python_tarball
from hypothesis import event, given
from hypothesis import strategies as st
from PIL import Image

from ampbench.data import SourceOptions, prepare_dataset
from ampbench.data.limits import Limits
from ampbench.dataset_format import METADATA_FILE, read_metadata
from ampbench.errors import AmpbenchError

Members = list[tuple[str, bytes]]
# Small limits keep a mutated size field from reading much; they are the code paths under test.
LIMITS = Limits(max_bytes=4 * 2**20, max_members=200, max_image_pixels=512 * 512)


def encoded(image_format: str, colour: int, size: int = 6) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), (colour, 255 - colour, 7)).save(buffer, image_format)
    return buffer.getvalue()


# Every format the prepare step decodes, so that the mutations reach each decoder.
IMAGE_FOLDER: Members = [
    ("data/train/cat/0.png", encoded("PNG", 10)),
    ("data/train/cat/1.jpg", encoded("JPEG", 40)),
    ("data/train/cat/2.gif", encoded("GIF", 70)),
    ("data/train/dog/0.webp", encoded("WEBP", 100)),
    ("data/train/dog/1.bmp", encoded("BMP", 130)),
    ("data/train/dog/2.tiff", encoded("TIFF", 160)),
    ("data/test/cat/0.ppm", encoded("PPM", 190)),
    ("data/test/dog/0.jpg", encoded("JPEG", 220)),
]
TRICKY_NAMES = [
    "../escape.png",
    "data/../../escape.png",
    "/etc/absolute.png",
    "C:/windows.png",
    "data\\train\\cat\\3.png",
    "data/train/cat/",
    "data//train/./cat/4.png",
    "data/train/.hidden/0.png",
    "__MACOSX/data/train/cat/0.png",
    "data/val/cat/0.png",
    "data/train/0.png",
    "data/train/bird/0.png",
    "data/test/bird/0.png",
    "data/train/cat/x.eps",
    "data/train/cat/ünïcødé.png",
    "data/train/cat/0.png",
    "cifar-10-batches-py/data_batch_1",
    "",
]


def _cifar_members() -> Members:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "cifar.tar.gz"
        make_cifar_python_tarball(path, per_batch=3)
        with tarfile.open(path) as archive:
            return [
                (member.name, archive.extractfile(member).read())  # type: ignore[union-attr]
                for member in archive.getmembers()
                if member.isfile()
            ]


CIFAR = _cifar_members()
# What a pickled CIFAR value may be replaced with: each of the wrong types and shapes.
ODD_VALUES = [
    None,
    0,
    -1,
    2**70,
    1.5,
    "text",
    b"bytes",
    [],
    [0],
    [b"a"] * 10,
    list(range(10)),
    {},
    np.zeros(0, np.uint8),
    np.zeros((3, 3072), np.float32),
    np.zeros((3, 3072), np.uint8),
    np.zeros((3, 32, 32, 3), np.uint8),
    np.zeros((2, 3072), np.uint8),
    np.full(3, 99, np.int64),
    np.array(["a", "b", "c"]),
]


@st.composite
def byte_mutation(draw: st.DrawFn, data: bytes) -> bytes:
    """data truncated, with bytes flipped, or with bytes inserted or removed."""
    kind = draw(st.sampled_from(["truncate", "flip", "insert", "delete"]))
    if not data or kind == "truncate":
        return data[: draw(st.integers(0, max(0, len(data) - 1)))]
    position = draw(st.integers(0, len(data) - 1))
    if kind == "flip":
        mutated = bytearray(data)
        for offset in range(draw(st.integers(1, 8))):
            index = (position + offset * draw(st.integers(1, 64))) % len(data)
            mutated[index] ^= draw(st.integers(1, 255))
        return bytes(mutated)
    if kind == "insert":
        return data[:position] + draw(st.binary(min_size=1, max_size=64)) + data[position:]
    return data[:position] + data[position + draw(st.integers(1, 64)) :]


@st.composite
def member_mutations(draw: st.DrawFn, members: Members) -> Members:
    """members with one to three of: renamed, duplicated, dropped, reordered, content mutated."""
    members = list(members)
    for _ in range(draw(st.integers(1, 3))):
        if not members:
            break
        index = draw(st.integers(0, len(members) - 1))
        name, data = members[index]
        kind = draw(st.sampled_from(["rename", "duplicate", "drop", "reorder", "content"]))
        if kind == "rename":
            new_name = draw(
                st.sampled_from(TRICKY_NAMES)
                | st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=20)
            )
            members[index] = (new_name, data)
        elif kind == "duplicate":
            members.insert(draw(st.integers(0, len(members))), (name, data))
        elif kind == "drop":
            del members[index]
        elif kind == "reorder":
            members = draw(st.permutations(members))
        else:
            members[index] = (name, draw(byte_mutation(data)))
    return members


def write_tar(members: Members, path: Path, mode: str) -> Path:
    with tarfile.open(path, mode) as archive:
        for name, data in members:
            add_member(archive, name, data)
    return path


def write_zip(members: Members, path: Path) -> Path:
    with (
        zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive,
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")  # "Duplicate name": the duplicate is the test
        for name, data in members:
            archive.writestr(zipfile.ZipInfo(name or "unnamed"), data)
    return path


def write_tree(members: Members, root: Path) -> Path:
    """The members as files under root; names a file system cannot hold there are left out
    (an archive is where such names get tested)."""
    root.mkdir()
    for name, data in members:
        target = (root / name).resolve()
        if not name or not target.is_relative_to(root.resolve()) or target == root.resolve():
            continue
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        except OSError:  # a name that is a folder elsewhere in the list, or too long
            continue
    return root


def prepares_or_refuses(write_source: Callable[[Path], Path]) -> None:
    """The property: in a fresh folder, prepare either completes or raises AmpbenchError with
    one line, and leaves nothing but its source, its cache and (on success) its output."""
    with tempfile.TemporaryDirectory() as directory:
        sandbox = Path(directory)
        source = write_source(sandbox)
        out = sandbox / "out"
        options = SourceOptions(cache_dir=sandbox / "cache", limits=LIMITS)
        try:
            metadata = prepare_dataset(str(source), out, options=options, use_cache=False)
        except AmpbenchError as error:
            assert "\n" not in str(error), str(error)
            assert not out.exists(), "a refused input left an output behind"
            # --hypothesis-show-statistics: how the cases ended, by the kind of refusal
            event("refused: " + str(error).rsplit(": ", 1)[-1].split("(")[0][:40])
        else:
            event("prepared")
            assert read_metadata(out)["counts"] == metadata["counts"]
            for file in metadata["files"]:
                assert (out / file).is_file(), f"{file} listed but not written"
            assert (out / METADATA_FILE).is_file()
        left = {path.name for path in sandbox.iterdir()}
        assert left <= {source.name, "out", "cache"}, f"files outside the output: {left}"


@given(members=member_mutations(IMAGE_FOLDER), mode=st.sampled_from(["w", "w:gz"]))
def test_mutated_tar_archives(members: Members, mode: str) -> None:
    suffix = ".tar" if mode == "w" else ".tar.gz"
    prepares_or_refuses(lambda folder: write_tar(members, folder / f"data{suffix}", mode))


@given(members=member_mutations(IMAGE_FOLDER))
def test_mutated_zip_archives(members: Members) -> None:
    prepares_or_refuses(lambda folder: write_zip(members, folder / "data.zip"))


@given(members=member_mutations(IMAGE_FOLDER))
def test_mutated_image_folder_trees(members: Members) -> None:
    prepares_or_refuses(lambda folder: write_tree(members, folder / "tree"))


@pytest.mark.parametrize("suffix", [".tar.gz", ".zip"])
@given(data=st.data())
def test_archives_with_bytes_mutated(suffix: str, data: st.DataObject) -> None:
    """Bytes of the archive file itself: headers, compressed streams, central directories."""
    with tempfile.TemporaryDirectory() as directory:
        valid = Path(directory) / f"valid{suffix}"
        if suffix == ".zip":
            write_zip(IMAGE_FOLDER, valid)
        else:
            write_tar(IMAGE_FOLDER, valid, "w:gz")
        mutated = data.draw(byte_mutation(valid.read_bytes()))

    def write(folder: Path) -> Path:
        path = folder / f"data{suffix}"
        path.write_bytes(mutated)
        return path

    prepares_or_refuses(write)


@st.composite
def cifar_value_swaps(draw: st.DrawFn) -> Members:
    """One CIFAR file's pickled dict with a key dropped, renamed or its value swapped."""
    members = list(CIFAR)
    index = draw(st.integers(0, len(members) - 1))
    name, data = members[index]
    loaded = pickle.loads(data)  # our own fixture: trusted
    key = draw(st.sampled_from(sorted(loaded)))
    kind = draw(st.sampled_from(["drop", "rename", "swap"]))
    if kind == "drop":
        del loaded[key]
    elif kind == "rename":
        loaded[key + b"_"] = loaded.pop(key)
    else:
        loaded[key] = draw(st.sampled_from(ODD_VALUES))
    members[index] = (name, pickle.dumps(loaded, protocol=draw(st.sampled_from([2, 4]))))
    return members


@given(members=member_mutations(CIFAR) | cifar_value_swaps())
def test_mutated_cifar_pickles(members: Members) -> None:
    prepares_or_refuses(
        lambda folder: write_tar(members, folder / "cifar-10-python.tar.gz", "w:gz")
    )
