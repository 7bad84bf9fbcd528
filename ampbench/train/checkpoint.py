"""Checkpoints that survive preemption: written atomically, the last K kept, loaded safely;
what the training state is (TrainingState), and the run's checkpoints (Checkpointer).

A checkpoint holds tensors, numbers, strings, lists and dicts only, so that it loads with
torch.load(weights_only=True): nothing in it is unpickled as code. The directory may be local
or an s3:// prefix (a PUT is atomic there; locally we write, then rename).
"""

from __future__ import annotations

import io
import pickle
import random
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ampbench import storage
from ampbench.errors import AmpbenchError, one_line
from ampbench.logs import log
from ampbench.train import distributed
from ampbench.train.config import TrainConfig
from ampbench.train.state import DeviceCounters, LoopState
from ampbench.world import World

NAME = re.compile(r"^ckpt-(\d{9})\.pt$")


def checkpoint_name(global_step: int) -> str:
    return f"ckpt-{global_step:09d}.pt"


def rng_states() -> dict[str, Any]:
    numpy_state: tuple[Any, ...] = np.random.get_state(legacy=True)  # type: ignore[assignment]
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
    # To a file object: given a path, torch.save names its archive after the file name up to
    # its last dot: nothing, for a hidden partial file.
    with storage.writing(target) as local, local.open("wb") as written:
        torch.save(state, written)
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
        reason = one_line(str(error))[:200]
        raise AmpbenchError(f"{location}: not a readable checkpoint ({reason})") from None
    if not isinstance(state, dict) or not {"fingerprint", "loop"} <= set(state):
        raise AmpbenchError(f"{location}: not an ampbench checkpoint")
    return state, location


def host_copy(value: Any) -> Any:
    """A deep copy with every tensor on the host (a state dict holds references to live ones)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: host_copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(host_copy(item) for item in value)
    return value


@dataclass
class TrainingState:
    """Everything a training step changes: what a checkpoint holds and the warm-up puts back."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    lr: torch.Tensor  # the rate the optimizer reads, filled in place (a CUDA graph replays it)
    counters: DeviceCounters

    def references(self) -> dict[str, Any]:
        """The state, as references to the live tensors."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": rng_states(),
            "counters": self.counters.state(),
        }

    def load(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:  # the loaded group holds a copy of the rate
            self.lr.copy_(torch.as_tensor(group["lr"]))
            group["lr"] = self.lr
        self.scaler.load_state_dict(state["scaler"])
        restore_rng_states(state["rng"])
        self.counters.load(state["counters"])


def fingerprint(
    config: TrainConfig, metadata: dict[str, Any], precision: str, world_size: int
) -> dict[str, Any]:
    """What must match for a checkpoint to continue this run (not how it is measured)."""
    measurement_only = {"compile", "warmup_steps", "cuda_graphs", "eval_batch_size"}
    return {
        "dataset_sha256": metadata["source"]["sha256"],
        "dataset_counts": metadata["counts"],
        "precision": precision,
        "world_size": world_size,
        **{k: v for k, v in config.hyperparameters().items() if k not in measurement_only},
    }


class Checkpointer:
    """The run's checkpoints in --checkpoint-dir: rank 0 writes them, every rank resumes from
    the newest, and a checkpoint of another run (its fingerprint differs) is refused."""

    def __init__(self, config: TrainConfig, world: World, fingerprint: dict[str, Any]) -> None:
        self.config = config
        self.world = world
        self.fingerprint = fingerprint

    def start(self, training: TrainingState) -> tuple[LoopState, str] | None:
        """With --resume, restore; otherwise refuse a directory an earlier run wrote to."""
        directory = self.config.checkpoint_dir
        if self.config.resume:
            return self.restore(training)
        if directory and names(directory):
            raise AmpbenchError(
                f"--checkpoint-dir {directory}: holds checkpoints of an earlier run; "
                "pass --resume to continue it, or use an empty directory"
            )
        return None

    def restore(self, training: TrainingState) -> tuple[LoopState, str] | None:
        """Load the newest checkpoint into `training`; where the loop stood and the
        checkpoint's location, or None where there is none yet."""
        directory = self.config.checkpoint_dir
        assert directory is not None
        found = load_latest(directory)
        if found is None:
            log.info("resume: no checkpoint in %s yet; starting fresh", directory)
            return None
        state, location = found
        if state["fingerprint"] != self.fingerprint:
            raise AmpbenchError(
                f"{location}: checkpoint belongs to a different run (dataset, precision or "
                "hyperparameters differ); use another --checkpoint-dir"
            )
        training.load(state)
        if not self.world.main:  # rank 0 holds the sums of every rank's steps so far
            training.counters.loss_sum.zero_()
            training.counters.correct.zero_()
        loop = LoopState(**state["loop"])
        log.info("resume: %s (epoch %d, step %d)", location, loop.epoch + 1, loop.step)
        return loop, location

    def write(self, training: TrainingState, loop: LoopState) -> None:
        """Save a checkpoint (every rank takes part: the counters are summed); its time goes to
        loop.checkpoint_time_s."""
        assert self.config.checkpoint_dir is not None
        counters = training.counters
        # The epoch's running sums are each rank's own: the checkpoint holds their total,
        # which rank 0 takes back on resume while the others start from zero.
        sums = distributed.all_reduce(torch.stack([counters.loss_sum, counters.correct]))
        if not self.world.main:  # every rank holds the same state otherwise; rank 0 writes it
            return
        started = time.perf_counter()
        state = training.references()
        state["counters"] = {**state["counters"], "loss_sum": sums[0], "correct": sums[1]}
        try:
            location = save(
                self.config.checkpoint_dir,
                loop.global_step,
                {"fingerprint": self.fingerprint, "loop": asdict(loop), **state},
                self.config.keep_checkpoints,
            )
            log.debug("checkpoint %s", location)
        except AmpbenchError as error:
            # A checkpoint insures the run; losing one must not end it. A retry would resume
            # from the one before.
            log.warning(
                "checkpoint at step %d not saved (%s); training goes on", loop.global_step, error
            )
        loop.checkpoint_time_s += time.perf_counter() - started
