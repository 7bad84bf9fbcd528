"""torch.compile's artefacts shared between processes: the pipeline's training tasks, their
torchrun processes and a TrainJob's nodes each start with an empty Inductor cache, so each
would compile a graph that another process compiled already.

With a shared location (a directory or an s3:// prefix), a process compiles into an Inductor
cache directory of its own (TORCHINDUCTOR_CACHE_DIR, Triton's beneath it), first unpacked from
the location's archive for its graph where one exists. Inductor checks every entry's own key:
where it found all it needed, it wrote nothing (a hit); where it compiled anything, rank 0
packs the directory back as the archive (a miss, and a stale archive refreshed).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import shutil
import tarfile
import tempfile
import weakref
import zlib
from pathlib import Path
from typing import Any

from ampbench import storage
from ampbench.errors import AmpbenchError
from ampbench.logs import log
from ampbench.process import environment
from ampbench.results import CompileCacheOutcome

INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
TRITON_CACHE_ENV = "TRITON_CACHE_DIR"
# The value that turns the pipeline's default (a cache beside the checkpoints) off.
OFF = "off"


def location_of(setting: str | None) -> str | None:
    """Where a compile_cache setting shares the cache: None for none, or OFF."""
    return None if not setting or setting == OFF else setting


def archive_name(model: str, batch_size: int, precision: str, graph: dict[str, Any]) -> str:
    """The archive of one compiled training step: readable by model, batch and precision,
    then a digest of the rest of what shapes the graph (torch, device, sizes, processes)."""
    digest = hashlib.sha256(json.dumps(graph, sort_keys=True).encode()).hexdigest()[:16]
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{model}-b{batch_size}-{precision}")
    return f"{readable}-{digest}.tar.gz"


class CompileCache:
    """One process's Inductor cache, filled from and written back to a shared archive; the
    directory lives as long as this object (compiled code may still be loaded from it)."""

    def __init__(self, location: str, name: str) -> None:
        self.archive = storage.join(location, name)
        self.directory = Path(tempfile.mkdtemp(prefix="ampbench-inductor-"))
        weakref.finalize(self, shutil.rmtree, self.directory, ignore_errors=True)
        self.fetched = False
        self._unpacked: set[Path] = set()
        self._environment = environment(
            {
                INDUCTOR_CACHE_ENV: str(self.directory),
                TRITON_CACHE_ENV: str(self.directory / "triton"),
            }
        )

    def __enter__(self) -> CompileCache:
        """Unpack the archive, if there is one, and point Inductor and Triton at it."""
        self.fetched = self._unpack()
        self._unpacked = self._files()
        self._environment.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._environment.__exit__(*exc_info)

    def finish(self, store: bool) -> CompileCacheOutcome:
        """Once the step is compiled: a hit where the archive held all Inductor needed (it
        wrote nothing new); otherwise a miss, and with `store` the directory is packed back."""
        if self.fetched and self._files() <= self._unpacked:
            return "hit"
        if store:
            self._store()
        return "miss"

    def _files(self) -> set[Path]:
        return {path for path in self.directory.rglob("*") if path.is_file()}

    def _unpack(self) -> bool:
        if not hasattr(tarfile, "data_filter"):  # Python before 3.10.12 / 3.11.4
            log.warning("compile cache: this Python cannot unpack archives safely; not used")
            return False
        try:
            data = storage.read_bytes_if_any(self.archive)
        except (AmpbenchError, OSError) as error:
            log.warning("compile cache: %s; compiling without it", error)
            return False
        if data is None:
            log.info("compile cache: nothing at %s yet; compiling", self.archive)
            return False
        try:
            # gzip.decompress checks the stream's CRC, which tarfile's reader never reaches.
            with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data)), mode="r:") as archive:
                archive.extractall(self.directory, filter="data")
        except (tarfile.TarError, OSError, EOFError, zlib.error) as error:
            log.warning("compile cache: %s is unreadable (%s); compiling", self.archive, error)
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory.mkdir()
            return False
        log.info("compile cache: %s (%.1f MB) unpacked", self.archive, len(data) / 2**20)
        return True

    def _store(self) -> None:
        """The directory, as compiled, becomes the archive; a failure is a warning (the
        training goes on)."""
        try:
            with storage.writing(self.archive) as packed, tarfile.open(packed, "w:gz") as archive:
                archive.add(self.directory, arcname=".")
        except (AmpbenchError, OSError, tarfile.TarError) as error:
            log.warning("compile cache: %s not written (%s)", self.archive, error)
            return
        log.info("compile cache: wrote %s", self.archive)
