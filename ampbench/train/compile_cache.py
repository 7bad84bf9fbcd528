"""torch.compile's artefacts shared between processes: the pipeline's training tasks, their
torchrun processes and a TrainJob's nodes each start with an empty Inductor cache, so each
would compile a graph that another process compiled already.

With a shared location (a directory or an s3:// prefix), a process compiles into an Inductor
cache directory of its own (TORCHINDUCTOR_CACHE_DIR, Triton's beneath it), first unpacked from
the location's archive for its graph where one exists (a hit); after a miss, rank 0 packs the
directory back as that archive. Inductor checks every entry's own key, so an archive written
for another graph or torch version costs only its download.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import weakref
from pathlib import Path
from typing import Any, Literal

from ampbench import storage
from ampbench.errors import AmpbenchError
from ampbench.logs import log

INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
TRITON_CACHE_ENV = "TRITON_CACHE_DIR"
CacheOutcome = Literal["hit", "miss"]


def archive_name(model: str, batch_size: int, precision: str, graph: dict[str, Any]) -> str:
    """The archive of one compiled training step: readable by model, batch and precision,
    then a digest of the rest of what shapes the graph (torch, device, sizes, processes)."""
    digest = hashlib.sha256(json.dumps(graph, sort_keys=True).encode()).hexdigest()[:16]
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{model}-b{batch_size}-{precision}")
    return f"{readable}-{digest}.tar.gz"


class CompileCache:
    """One process's Inductor cache, filled from and written back to a shared archive."""

    def __init__(self, location: str, name: str) -> None:
        self.archive = storage.join(location, name)
        self.directory = Path(tempfile.mkdtemp(prefix="ampbench-inductor-"))
        weakref.finalize(self, shutil.rmtree, self.directory, ignore_errors=True)
        self.outcome: CacheOutcome = "miss"
        self._saved: dict[str, str | None] = {}

    def __enter__(self) -> CompileCache:
        """Unpack the archive, if there is one, and point Inductor and Triton at it."""
        self.outcome = "hit" if self._unpack() else "miss"
        environment = {
            INDUCTOR_CACHE_ENV: str(self.directory),
            TRITON_CACHE_ENV: str(self.directory / "triton"),
        }
        for name, value in environment.items():
            self._saved[name] = os.environ.get(name)
            os.environ[name] = value
        return self

    def __exit__(self, *exc_info: object) -> None:
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    def _unpack(self) -> bool:
        try:
            data = storage.read_bytes_if_any(self.archive)
        except AmpbenchError as error:
            log.warning("compile cache: %s; compiling without it", error)
            return False
        if data is None:
            log.info("compile cache: nothing at %s yet; compiling", self.archive)
            return False
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
                archive.extractall(self.directory, filter="data")
        except (tarfile.TarError, OSError, EOFError) as error:
            log.warning("compile cache: %s is unreadable (%s); compiling", self.archive, error)
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory.mkdir()
            return False
        log.info("compile cache: %s (%.1f MB) unpacked", self.archive, len(data) / 2**20)
        return True

    def store(self) -> None:
        """After a miss: the directory, as compiled, becomes the archive (a failure to write
        it is a warning; the training goes on)."""
        if self.outcome == "hit":
            return
        with tempfile.TemporaryDirectory() as scratch:
            packed = Path(scratch) / "cache.tar.gz"
            with tarfile.open(packed, "w:gz") as archive:
                archive.add(self.directory, arcname=".")
            try:
                _write(packed, self.archive)
            except (AmpbenchError, OSError) as error:
                log.warning("compile cache: not written (%s)", error)
                return
        log.info("compile cache: wrote %s", self.archive)


def _write(packed: Path, target: str) -> None:
    """The archive in place whole: readers of a local directory never see a part of it."""
    if storage.is_s3(target):
        storage.upload(packed, target)
        return
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    partial = f"{target}.partial-{os.getpid()}"
    shutil.copyfile(packed, partial)
    os.replace(partial, target)
