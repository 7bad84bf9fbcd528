"""The pipeline's first task: the data prepared, and the training settings checked against it
once, before any training task (those are retried on failure) starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ampbench.cluster import check_tracking_server
from ampbench.data import SourceOptions, prepare_dataset
from ampbench.logs import setup_logging
from ampbench.matrix import check_matrix
from ampbench.train import BASELINE_PRECISION
from ampbench.train.config import TrainConfig, check_against_dataset, processes_per_arm


@dataclass(frozen=True)
class TrainingPlan:
    """What the pipeline's training tasks will run: the matrix and the settings they share.
    Each task runs gpu_count x num_nodes processes (at least 1 each) of the arm's batch."""

    runs: list[Any] = field(default_factory=list)
    baseline_precision: str = BASELINE_PRECISION
    image_size: int = 0
    epochs: int = 0
    lr: float = 0.0
    gpu_count: int = 1
    num_nodes: int = 1
    grad_comm: str = TrainConfig.grad_comm


def run_prepare_task(
    data: str,
    output: Path,
    options: SourceOptions,
    plan: TrainingPlan,
    *,
    subset: int = 0,
    val_fraction: float = 0.0,
    tracking: bool = False,
) -> dict[str, Any]:
    """Prepare `data` into `output` and return its metadata, having checked the plan (no runs:
    nothing to check) and, in a pod with tracking on, that a tracking server is configured."""
    setup_logging()  # a malformed $RANK is one line too
    if tracking:
        check_tracking_server()
    processes = processes_per_arm(plan.gpu_count, plan.num_nodes)
    checked = []
    if plan.runs:
        checked = check_matrix(
            plan.runs,
            plan.baseline_precision,
            epochs=plan.epochs,
            lr=plan.lr,
            subset=subset,
            image_size=plan.image_size,
            grad_comm=plan.grad_comm,
            processes=processes,
        )
    metadata = prepare_dataset(
        data, output, subset=subset, val_fraction=val_fraction, options=options
    )
    for model, batch_size in sorted({(run.model, run.batch_size) for run in checked}):
        check_against_dataset(
            metadata,
            batch_size=batch_size,
            model=model,
            image_size=plan.image_size,
            processes=processes,
        )
    return metadata
