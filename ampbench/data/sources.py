"""Turn a `--data` string into labelled splits, whatever form the user's data is in.

`synthetic`; `cifar10` / `cifar100` (downloaded once into the cache); a path or `file://` URI
to an ImageFolder tree (directory, .tar, .tar.gz/.tgz, .zip) or a CIFAR python-format tarball;
`s3://bucket/key` for any such file, `s3://bucket/prefix/` for a directory tree.
Labels are known before any pixel is decoded, so a subset decodes only what it keeps.
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from ampbench import storage
from ampbench.data import cifar_python, synthetic
from ampbench.data.archive import is_archive, iter_files
from ampbench.data.decode import IMAGE_EXTENSIONS, decode_images, fit_size
from ampbench.data.limits import Limits, check_decoded_size
from ampbench.errors import AmpbenchError
from ampbench.logs import log
from ampbench.sampling import stratified_split

SPLIT_DIRS = ("train", "val", "test")
DOWNLOADS = {
    "cifar10": (
        "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        "c58f30108f718f92721af3b95e74349a",
    ),
    "cifar100": (
        "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
        "eb9058c3a382ffc7106e4002c42a8d85",
    ),
}


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ampbench"


@dataclass(frozen=True)
class SourceOptions:
    cache_dir: Path = field(default_factory=default_cache_dir)
    image_size: int | None = None
    test_fraction: float = 0.2
    seed: int = 0
    skip_bad_images: bool = False
    limits: Limits = field(default_factory=Limits)


class Split(Protocol):
    labels: np.ndarray

    def materialize(
        self, rows: np.ndarray, on_progress: Callable[[int], None]
    ) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """Pixels of the given rows: (images [n, H, W, 3], rows kept, names of bad files)."""
        ...


@dataclass
class ArraySplit:
    source: str
    images: np.ndarray
    labels: np.ndarray
    options: SourceOptions

    def materialize(
        self, rows: np.ndarray, on_progress: Callable[[int], None]
    ) -> tuple[np.ndarray, np.ndarray, list[str]]:
        images = self.images[rows]
        size = self.options.image_size
        if size is not None and images.shape[1:3] != (size, size):
            check_decoded_size(self.source, len(rows), (size, size, 3), self.options.limits)
            images = np.stack([fit_size(image, size) for image in images])
        on_progress(len(rows))
        return images, rows, []


@dataclass
class EncodedSplit:
    source: str
    files: list[tuple[str, bytes]]
    labels: np.ndarray
    options: SourceOptions

    def materialize(
        self, rows: np.ndarray, on_progress: Callable[[int], None]
    ) -> tuple[np.ndarray, np.ndarray, list[str]]:
        decoded = decode_images(
            [self.files[row] for row in rows],
            source=self.source,
            image_size=self.options.image_size,
            skip_bad=self.options.skip_bad_images,
            limits=self.options.limits,
            on_progress=on_progress,
        )
        return decoded.images, rows[decoded.kept], decoded.bad


@dataclass
class SourceData:
    kind: str
    description: str
    sha256: str
    classes: list[str]
    splits: dict[str, Split]
    skipped: Counter[str] = field(default_factory=Counter)


def _sha256_file(path: Path) -> str:
    try:
        with path.open("rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError as error:
        raise AmpbenchError(f"{path}: cannot be read ({error.strerror or error})") from None


def _sha256_tree(path: Path, limits: Limits) -> str:
    """A directory's content hash, read through the same checks as its data (links, special
    files and the size limits are refused before anything is hashed)."""
    digest = hashlib.sha256()
    for name, data in iter_files(path, limits):
        if data is not None:
            digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


def content_sha256(path: Path, limits: Limits) -> str:
    return _sha256_tree(path, limits) if path.is_dir() else _sha256_file(path)


def _download(name: str, cache_dir: Path) -> Path:
    """The published python-format tarball of cifar10/cifar100, downloaded once."""
    from torchvision.datasets.utils import calculate_md5, check_integrity, download_url

    url, md5 = DOWNLOADS[name]
    folder = cache_dir / "downloads"
    target = folder / url.rsplit("/", 1)[1]
    if check_integrity(str(target), md5):
        return target
    log.info("downloading %s from %s", name, url)
    try:
        # No md5 here: torchvision raises a bare RuntimeError on a mismatch; checked below.
        download_url(url, str(folder))
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise AmpbenchError(
            f"{name}: cannot download {url} ({reason}); offline? pass a local copy instead, "
            f"e.g. --data /path/to/{target.name} or an ImageFolder tree or archive"
        ) from None
    got = calculate_md5(str(target))
    if got != md5:
        target.unlink()  # not left in the cache, where the next run would find it
        raise AmpbenchError(
            f"{name}: the download of {url} is corrupt (MD5 {got}, expected {md5}); try again"
        )
    return target


def _is_hidden(name: str) -> bool:
    return any(part.startswith(".") or part == "__MACOSX" for part in name.split("/"))


def _suffix(name: str) -> str:
    """The lower-case extension of a POSIX path's last part ('' if none), as pathlib has it."""
    base = name.rsplit("/", 1)[-1]
    dot = base.rfind(".")
    return base[dot:].lower() if dot > 0 else ""


def _strip_common_root(paths: Iterable[str]) -> str:
    """The leading folder(s) every path shares, above the dataset's own top level."""
    paths = list(paths)
    prefix = ""
    while True:
        heads = {p[len(prefix) :].split("/", 1)[0] for p in paths}
        nested = all("/" in p[len(prefix) :] for p in paths)
        if len(heads) != 1 or not nested or heads & set(SPLIT_DIRS):
            return prefix
        prefix += heads.pop() + "/"


def _image_folder(
    source: str, entries: list[tuple[str, bytes | None]], options: SourceOptions
) -> tuple[list[str], dict[str, Split], Counter[str]]:
    skipped: Counter[str] = Counter()
    files, dirs, layout = _folder_layout(source, entries, skipped)
    per_split = _files_by_split_and_class(files, dirs, layout, skipped)
    reference = "train" if "train" in per_split else "all"
    classes = sorted(per_split[reference])
    _check_classes(source, per_split, layout, reference, classes)
    splits: dict[str, Split] = {}
    for split, by_class in per_split.items():
        ordered = [
            (label, item)
            for label, name in enumerate(classes)
            for item in sorted(by_class[name], key=lambda item: item[0])
        ]
        labels = np.array([label for label, _ in ordered], dtype=np.int64)
        items = [item for _, item in ordered]
        splits[split] = EncodedSplit(source, items, labels, options)
    _carve_test_split(source, splits, options)
    return classes, splits, skipped


def _folder_layout(
    source: str, entries: list[tuple[str, bytes | None]], skipped: Counter[str]
) -> tuple[list[tuple[str, bytes]], list[str], dict[str, str]]:
    """The files and folders below the tree's common root, and its layout: split -> the
    folder prefix its class folders are under (train/, val/, test/; or one tree, "all")."""
    files: list[tuple[str, bytes]] = []
    dirs: list[str] = []
    for name, data in entries:
        if _is_hidden(name):
            if data is not None:
                skipped["hidden_files"] += 1
        elif data is None:
            dirs.append(name)
        else:
            files.append((name, data))
    prefix = _strip_common_root([name for name, _ in files] + [d + "/" for d in dirs])
    files = [(name[len(prefix) :], data) for name, data in files]
    dirs = [d[len(prefix) :] for d in dirs if d.startswith(prefix) and len(d) > len(prefix)]
    top = {name.split("/", 1)[0] for name, _ in files if "/" in name} | {
        d.split("/", 1)[0] for d in dirs
    }
    if "train" in top:
        return files, dirs, {split: split + "/" for split in SPLIT_DIRS if split in top}
    if top & set(SPLIT_DIRS):
        found = ", ".join(sorted(top & set(SPLIT_DIRS)))
        raise AmpbenchError(f"{source}: has {found}/ but no train/ folder")
    return files, dirs, {"all": ""}


def _files_by_split_and_class(
    files: list[tuple[str, bytes]],
    dirs: list[str],
    layout: dict[str, str],
    skipped: Counter[str],
) -> dict[str, dict[str, list[tuple[str, bytes]]]]:
    """Each split's class folders (empty ones too, to be named) and their image files."""
    per_split: dict[str, dict[str, list[tuple[str, bytes]]]] = {}
    for split, split_prefix in layout.items():
        classes: dict[str, list[tuple[str, bytes]]] = {}
        for d in dirs:
            rest = d[len(split_prefix) :] if d.startswith(split_prefix) else None
            if rest and "/" not in rest:
                classes.setdefault(rest, [])
        per_split[split] = classes
    for name, data in files:
        file_split = next((s for s, p in layout.items() if p and name.startswith(p)), None)
        if file_split is None and "all" in layout:
            file_split = "all"
        rest = name[len(layout[file_split]) :] if file_split else name
        if file_split is None or "/" not in rest:
            skipped["files_outside_class_folders"] += 1
            continue
        if _suffix(name) not in IMAGE_EXTENSIONS:
            skipped["non_image_files"] += 1
            continue
        per_split[file_split].setdefault(rest.split("/", 1)[0], []).append((name, data))
    return per_split


def _check_classes(
    source: str,
    per_split: dict[str, dict[str, list[tuple[str, bytes]]]],
    layout: dict[str, str],
    reference: str,
    classes: list[str],
) -> None:
    """At least two classes, none empty, and the same ones in every split."""
    if len(classes) < 2:
        raise AmpbenchError(
            f"{source}: found {len(classes)} class folder(s) under {layout[reference] or 'the top'}"
            "; a classification data set needs at least 2"
        )
    for split, by_class in per_split.items():
        empty = sorted(c for c, items in by_class.items() if not items)
        if empty:
            raise AmpbenchError(f"{source}: class folder {layout[split]}{empty[0]}/ has no images")
        if sorted(by_class) != classes:
            missing = sorted(set(classes) - set(by_class))
            extra = sorted(set(by_class) - set(classes))
            raise AmpbenchError(
                f"{source}: {split}/ and {reference}/ have different classes "
                f"(missing in {split}/: {missing or 'none'}; only in {split}/: {extra or 'none'})"
            )


def _carve_test_split(source: str, splits: dict[str, Split], options: SourceOptions) -> None:
    """One class-folder tree, or train/ without test/: the test split is carved out of it."""
    whole_name = "all" if "all" in splits else "train" if "test" not in splits else None
    if whole_name is None:
        return
    whole = splits.pop(whole_name)
    assert isinstance(whole, EncodedSplit)
    if whole_name == "train":
        log.info(
            "%s: no test/ folder; %.0f%% of train/ becomes the test split (--test-fraction)",
            source,
            100 * options.test_fraction,
        )
    test_rows, train_rows = stratified_split(
        whole.labels, options.test_fraction, np.random.default_rng(options.seed)
    )
    for split, rows in (("train", train_rows), ("test", test_rows)):
        splits[split] = EncodedSplit(
            source, [whole.files[r] for r in rows], whole.labels[rows], options
        )


def _from_local(
    source: str, path: Path, options: SourceOptions, sha256: str, description: str
) -> SourceData:
    entries = list(iter_files(path, options.limits))
    names = {name for name, data in entries if data is not None}
    variant = cifar_python.detect(names) if not path.is_dir() else None
    if variant is not None:
        files = {name: data for name, data in entries if data is not None}
        classes, arrays = cifar_python.read(source, files, variant)
        splits: dict[str, Split] = {
            split: ArraySplit(source, images, labels, options)
            for split, (images, labels) in arrays.items()
        }
        return SourceData(
            f"{variant}-python", f"{description} ({variant} python format)", sha256, classes, splits
        )
    classes, splits, skipped = _image_folder(source, entries, options)
    kind = "imagefolder-dir" if path.is_dir() else "imagefolder-archive"
    return SourceData(kind, description, sha256, classes, splits, skipped)


def resolve_sha256(source: str, options: SourceOptions) -> tuple[str, Path | None]:
    """The source's content hash, and the local file or folder that holds its content."""
    if source == "synthetic":
        return synthetic.content_sha256(), None
    path = local_path(source, options)
    return content_sha256(path, options.limits), path


def local_path(source: str, options: SourceOptions) -> Path:
    """Where the source's content lies on this machine, fetching it first if it is remote."""
    if source in DOWNLOADS:
        return _download(source, options.cache_dir)
    if storage.is_s3(source):
        if source.endswith("/"):
            path, cached = storage.fetch_tree(source, options.cache_dir)
        else:
            path, cached = storage.fetch(source, options.cache_dir)
        log.info("%s: %s", source, "in the download cache" if cached else f"downloaded to {path}")
        return path
    path = Path(source.removeprefix("file://")).expanduser()
    if not path.exists():
        raise AmpbenchError(
            f"{source}: no such file or directory (expected 'synthetic', 'cifar10', 'cifar100', "
            "an s3:// URI, or a path to an ImageFolder tree, archive or CIFAR tarball)"
        )
    if not path.is_dir() and not path.is_file():
        raise AmpbenchError(f"{source}: not a regular file or a directory (a pipe or device?)")
    if not path.is_dir() and not is_archive(path):
        raise AmpbenchError(f"{source}: not a directory or a .tar, .tar.gz, .tgz or .zip archive")
    return path


def load(source: str, options: SourceOptions, sha256: str, path: Path | None) -> SourceData:
    """Read a source whose content (hash and local copy) resolve_sha256 has found."""
    if path is None:  # synthetic
        splits: dict[str, Split] = {
            split: ArraySplit(source, images, labels, options)
            for split, (images, labels) in synthetic.generate().items()
        }
        return SourceData("synthetic", synthetic.VERSION, sha256, list(synthetic.CLASSES), splits)
    description = source if source == str(path) else f"{source} (local copy {path})"
    return _from_local(source, path, options, sha256, description)
