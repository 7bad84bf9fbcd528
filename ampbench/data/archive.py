"""Read the files of a directory tree or an archive into memory, refusing hostile archives.

Nothing is extracted to disk, so a hostile member name could not escape anyway; such members
are still refused, since an archive that holds them is not a dataset anyone meant to send.
"""

from __future__ import annotations

import os
import stat
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

from ampbench.data.limits import Limits, available_memory
from ampbench.errors import AmpbenchError

ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".zip")


def is_archive(path: Path) -> bool:
    return path.name.lower().endswith(ARCHIVE_SUFFIXES)


def _checked_name(source: str, name: str) -> str:
    """A member name as a safe relative POSIX path, or an error naming the member."""
    posix = name.replace("\\", "/")
    if posix.startswith("/") or (len(posix) > 1 and posix[1] == ":"):
        raise AmpbenchError(f"{source}: archive member '{name}' has an absolute path; refused")
    parts = [part for part in posix.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise AmpbenchError(f"{source}: archive member '{name}' points outside the archive (..)")
    return "/".join(parts)


class _Budget:
    def __init__(self, source: str, limits: Limits) -> None:
        self.source = source
        self.limits = limits
        self.members = 0
        self.bytes = 0
        # Every member read stays in memory until the step ends: what is free now bounds them.
        self.memory = available_memory()

    def count_member(self) -> None:
        self.members += 1
        if self.members > self.limits.max_members:
            raise AmpbenchError(
                f"{self.source}: archive holds more than {self.limits.max_members:,} members; "
                "refused (raise --max-members if this is intended)"
            )

    def add_bytes(self, size: int) -> None:
        self.bytes += size
        if self.bytes > self.limits.max_bytes:
            raise AmpbenchError(
                f"{self.source}: archive expands past {self.limits.max_bytes:,} bytes; refused "
                "(raise --max-extract-bytes if this is intended)"
            )
        if self.memory is not None and self.bytes > self.memory:
            raise AmpbenchError(
                f"{self.source}: archive expands past {self.memory:,} bytes, the memory free "
                "here; refused (prepare it on a larger machine, or pass a smaller data set)"
            )


def _reason(error: Exception) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def _iter_tar(path: Path, budget: _Budget) -> Iterator[tuple[str, bytes | None]]:
    source = str(path)
    try:
        # Stream mode: one pass over the (compressed) file, members in archive order.
        with tarfile.open(path, mode="r|*") as archive:
            for member in archive:
                budget.count_member()
                name = _checked_name(source, member.name)
                if member.issym() or member.islnk():
                    raise AmpbenchError(
                        f"{source}: archive member '{member.name}' is a link; refused"
                    )
                if member.isdev() or member.isfifo():
                    raise AmpbenchError(
                        f"{source}: archive member '{member.name}' is a device or pipe; refused"
                    )
                if member.isdir():
                    yield name, None
                    continue
                if not member.isfile():
                    continue
                budget.add_bytes(member.size)
                handle = archive.extractfile(member)
                if handle is None:
                    continue
                yield name, handle.read()
    except (AmpbenchError, MemoryError):
        raise
    except Exception as error:  # tarfile fed hostile bytes raises more than TarError
        raise AmpbenchError(f"{source}: not a readable tar archive ({_reason(error)})") from None


def _iter_zip(path: Path, budget: _Budget) -> Iterator[tuple[str, bytes | None]]:
    source = str(path)
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                budget.count_member()
                name = _checked_name(source, info.filename)
                mode = info.external_attr >> 16
                if stat.S_ISLNK(mode):
                    raise AmpbenchError(
                        f"{source}: archive member '{info.filename}' is a link; refused"
                    )
                if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode):
                    raise AmpbenchError(
                        f"{source}: archive member '{info.filename}' is a device or pipe; refused"
                    )
                if info.is_dir():
                    yield name, None
                    continue
                # The declared size is checked first; reading stops at the budget regardless,
                # so a member that lies about its size cannot expand past it.
                budget.add_bytes(info.file_size)
                with archive.open(info) as handle:
                    data = handle.read(info.file_size + 1)
                if len(data) > info.file_size:
                    raise AmpbenchError(
                        f"{source}: archive member '{info.filename}' is larger than declared"
                    )
                yield name, data
    except (AmpbenchError, MemoryError):
        raise
    except (RuntimeError, NotImplementedError) as error:  # encrypted, or an unknown method
        raise AmpbenchError(f"{source}: cannot read this zip archive ({error})") from None
    except Exception as error:  # zipfile fed hostile bytes raises more than BadZipFile
        raise AmpbenchError(f"{source}: not a readable zip archive ({_reason(error)})") from None


def _unreadable(error: OSError) -> NoReturn:
    raise AmpbenchError(f"{error.filename}: cannot be read ({error.strerror or error})")


def _iter_directory(root: Path, budget: _Budget) -> Iterator[tuple[str, bytes | None]]:
    # A folder that cannot be listed is an error, not a silent gap in the data set.
    for directory, dirnames, filenames in os.walk(root, onerror=_unreadable):
        dirnames.sort()
        for dirname in dirnames:
            if (Path(directory) / dirname).is_symlink():
                raise AmpbenchError(f"{Path(directory) / dirname}: links are not followed; refused")
            yield (Path(directory) / dirname).relative_to(root).as_posix(), None
        for filename in sorted(filenames):
            path = Path(directory) / filename
            if path.is_symlink() or not path.is_file():
                # A link inside a user's own tree may point anywhere; a dataset has no need of one.
                raise AmpbenchError(f"{path}: links and special files are not read; refused")
            budget.count_member()
            try:
                budget.add_bytes(path.stat().st_size)
                data = path.read_bytes()
            except OSError as error:
                _unreadable(error)
            yield path.relative_to(root).as_posix(), data


def iter_files(path: Path, limits: Limits) -> Iterator[tuple[str, bytes | None]]:
    """(relative POSIX path, content) for each regular file of a directory or archive.

    Directories come as (path, None), so that a caller can tell an empty folder from none.
    """
    budget = _Budget(str(path), limits)
    if path.is_dir():
        return _iter_directory(path, budget)
    members = (
        _iter_zip(path, budget) if path.name.lower().endswith(".zip") else _iter_tar(path, budget)
    )
    return _unique_files(str(path), members)


def _unique_files(
    source: str, members: Iterator[tuple[str, bytes | None]]
) -> Iterator[tuple[str, bytes | None]]:
    """An archive's members, refusing a file name that comes twice: tar and zip allow it
    (extractors keep the last), but which of the two is the data would be a guess."""
    seen: set[str] = set()
    for name, data in members:
        if data is not None:
            if name in seen:
                raise AmpbenchError(f"{source}: archive member '{name}' appears twice; refused")
            seen.add(name)
        yield name, data
