"""Checkpoints that survive preemption: written atomically, the last K kept, loaded safely.

A checkpoint holds tensors, numbers, strings, lists and dicts only, so that it loads with
torch.load(weights_only=True): nothing in it is unpickled as code. The directory may be local
or an s3:// prefix (a PUT is atomic there; locally we write, then rename).
"""

from __future__ import annotations

import io
import os
import pickle
import random
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ampbench import storage
from ampbench.errors import AmpbenchError

NAME = re.compile(r"^ckpt-(\d{9})\.pt$")


def checkpoint_name(global_step: int) -> str:
    return f"ckpt-{global_step:09d}.pt"


def rng_states() -> dict[str, Any]:
    numpy_state = np.random.get_state()
    version, internal, gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {
            "keys": torch.from_numpy(numpy_state[1].astype(np.int64)),
            "pos": int(numpy_state[2]),
            "has_gauss": int(numpy_state[3]),
            "cached_gaussian": float(numpy_state[4]),
        },
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
    }


def restore_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    # Only when the GPU count matches (a job may resume on another node); training draws its
    # randomness from seeded generators, so the global CUDA state is restored for completeness.
    if states["cuda"] and len(states["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(states["cuda"])
    numpy_state = states["numpy"]
    np.random.set_state(
        (
            "MT19937",
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    python_state = states["python"]
    random.setstate(
        (python_state["version"], tuple(python_state["internal"]), python_state["gauss"])
    )


def names(directory: str) -> list[str]:
    """The checkpoints in a directory (local or s3://), oldest first."""
    if storage.is_s3(directory):
        prefix = directory.rstrip("/") + "/"
        entries = [key.rsplit("/", 1)[-1] for key, _, _ in storage.list_keys(prefix)]
    else:
        path = Path(directory)
        entries = [p.name for p in path.iterdir()] if path.is_dir() else []
    return sorted(name for name in entries if NAME.match(name))


def save(directory: str, global_step: int, state: dict[str, Any], keep: int) -> str:
    """Write `state` as the checkpoint of `global_step`; keep the newest `keep` checkpoints."""
    name = checkpoint_name(global_step)
    target = storage.join(directory, name)
    if storage.is_s3(directory):
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / name
            torch.save(state, local)
            storage.upload(local, target)
    else:
        Path(directory).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".partial-", delete=False) as tmp:
            torch.save(state, tmp)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp.name, target)
    for old in names(directory)[:-keep]:
        storage.remove(storage.join(directory, old))
    return target


def load_latest(directory: str) -> tuple[dict[str, Any], str] | None:
    """The newest checkpoint in `directory` (on the CPU) and its location, or None.

    Loaded on the CPU: RNG states must stay there, and load_state_dict moves the rest."""
    found = names(directory)
    if not found:
        return None
    location = storage.join(directory, found[-1])
    data = storage.read_bytes(location)
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as error:
        reason = " ".join(str(error).split())[:200]
        raise AmpbenchError(f"{location}: not a readable checkpoint ({reason})") from None
    if not isinstance(state, dict) or not {"fingerprint", "loop"} <= set(state):
        raise AmpbenchError(f"{location}: not an ampbench checkpoint")
    return state, location
