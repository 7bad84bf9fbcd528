"""Which of the training processes this one is, as torchrun (or Kubeflow Trainer's torch
runtime, which starts torchrun) describes it in RANK, WORLD_SIZE and LOCAL_RANK. Free of
torch: logging reads it before anything heavy is imported."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ampbench.errors import AmpbenchError


@dataclass(frozen=True)
class World:
    """This process's place among the training processes (a single process: rank 0 of 1)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def main(self) -> bool:
        """Rank 0: the one process that writes results, checkpoints and MLflow, and logs."""
        return self.rank == 0


SINGLE_PROCESS = World()


def _environ_int(name: str) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value)
    except ValueError:
        raise AmpbenchError(
            f"${name}: '{value}' is not a whole number (torchrun sets it)"
        ) from None


def world_from_env() -> World:
    """The world torchrun describes in the environment; one process where it describes none."""
    if "WORLD_SIZE" not in os.environ:
        return SINGLE_PROCESS
    world = World(_environ_int("RANK"), _environ_int("WORLD_SIZE"), _environ_int("LOCAL_RANK"))
    if not 0 <= world.rank < world.size:
        raise AmpbenchError(f"$RANK {world.rank}: not within $WORLD_SIZE {world.size}")
    return world
