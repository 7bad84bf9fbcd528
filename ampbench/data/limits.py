"""What a prepare step may take from its input: bytes, members, pixels and memory.

Everything the prepare step reads is held in memory (nothing is extracted to disk), and the
decoded images are one array, so each budget is checked before the bytes are read or the
array allocated, never after: a hostile input is refused with its name, not with an
allocation that a memory limit turns into a traceback or a killed machine.
"""

from __future__ import annotations

import math
import resource
from dataclasses import dataclass
from pathlib import Path

from ampbench.errors import AmpbenchError
from ampbench.process import proc_bytes

DEFAULT_MAX_EXTRACT_BYTES = 8 * 1024**3  # 8 GiB: far above ImageNet-size CIFAR-likes
DEFAULT_MAX_MEMBERS = 5_000_000
# 64 Mpixel (8192 x 8192) per image: above any camera's photo, far below the 30000 x 30000 or
# 65000 x 65000 that a few hundred bytes of PNG or JPEG header can declare.
DEFAULT_MAX_IMAGE_PIXELS = 64 * 2**20
DEFAULT_MAX_DECODED_BYTES = 16 * 1024**3  # the decoded data set, uint8 N x H x W x 3
# What the step leaves to everything else in its process (Python, numpy, pyarrow's buffers).
MEMORY_RESERVE_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Limits:
    max_bytes: int = DEFAULT_MAX_EXTRACT_BYTES
    max_members: int = DEFAULT_MAX_MEMBERS
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES

    @classmethod
    def with_overrides(
        cls,
        max_bytes: int = 0,
        max_members: int = 0,
        max_image_pixels: int = 0,
        max_decoded_bytes: int = 0,
    ) -> Limits:
        """The default limits, with each non-zero argument in place of its default."""
        return cls(
            max_bytes or DEFAULT_MAX_EXTRACT_BYTES,
            max_members or DEFAULT_MAX_MEMBERS,
            max_image_pixels or DEFAULT_MAX_IMAGE_PIXELS,
            max_decoded_bytes or DEFAULT_MAX_DECODED_BYTES,
        )


def _cgroup_headroom() -> int | None:
    """memory.max - memory.current of this process's cgroup (v2), where one is set."""
    try:
        line = Path("/proc/self/cgroup").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    if not line.startswith("0::"):
        return None
    group = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
    tightest = None
    for directory in (group, *group.parents):  # a parent's limit binds its children too
        try:
            limit = (directory / "memory.max").read_text().strip()
            current = int((directory / "memory.current").read_text())
        except (OSError, ValueError):
            continue
        if limit != "max":
            headroom = int(limit) - current
            tightest = headroom if tightest is None else min(tightest, headroom)
        if directory == Path("/sys/fs/cgroup"):
            break
    return tightest


def _address_space_headroom() -> int | None:
    """RLIMIT_AS (ulimit -v) less what this process has mapped already."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    mapped = proc_bytes(Path("/proc/self/status"), "VmSize")
    return soft if mapped is None else soft - mapped


def _meminfo_available() -> int | None:
    return proc_bytes(Path("/proc/meminfo"), "MemAvailable")


def available_memory() -> int | None:
    """Bytes this process can still allocate: the tightest of the machine's free memory, its
    cgroup's limit and its address-space limit; None where none of them can be read."""
    # Pages: what the rest of the process needs is kept back. Address space: none is, since
    # what is mapped already (thread stacks, malloc arenas) is mostly reserved, not used.
    physical = [
        value - MEMORY_RESERVE_BYTES
        for value in (_meminfo_available(), _cgroup_headroom())
        if value is not None
    ]
    address_space = _address_space_headroom()
    known = physical + ([address_space] if address_space is not None else [])
    return max(0, min(known)) if known else None


def _size(count: int) -> str:
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.0f} MiB"


def check_decoded_size(source: str, count: int, shape: tuple[int, ...], limits: Limits) -> None:
    """Refuse a decoded array (count images of `shape`, uint8) that the limits or this
    machine's memory cannot hold, before it is allocated."""
    needed = math.prod((count, *shape))
    described = f"{count:,} images of {'x'.join(str(d) for d in shape)}"
    if needed > limits.max_decoded_bytes:
        raise AmpbenchError(
            f"{source}: the decoded images would take {_size(needed)} ({described}), more than "
            f"the {_size(limits.max_decoded_bytes)} limit; pass --image-size to make them "
            "smaller, --subset to take fewer, or raise --max-decoded-bytes"
        )
    available = available_memory()
    if available is not None and needed > available:
        raise AmpbenchError(
            f"{source}: the decoded images would take {_size(needed)} ({described}), more than "
            f"the {_size(available)} of memory free here; pass --image-size or --subset"
        )
