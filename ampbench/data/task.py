"""The pipeline's first task: the data prepared, and the experiment checked before and
against it (ampbench/preflight.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ampbench.data import SourceOptions, prepare_dataset
from ampbench.experiment import Experiment
from ampbench.logs import setup_logging
from ampbench.preflight import preflight


def run_prepare_task(
    data: str,
    output: Path,
    options: SourceOptions,
    experiment: Experiment,
    *,
    val_fraction: float,
) -> dict[str, Any]:
    """Prepare `data` into `output` (at most the experiment's subset per split) and return its
    metadata, having checked the experiment before and each arm's batch and model against the
    data after (no runs: the data alone)."""
    setup_logging()  # a malformed $RANK is one line too
    preflight(experiment, "prepare")
    subset = experiment.dataset.subset
    metadata = prepare_dataset(
        data, output, subset=subset, val_fraction=val_fraction, options=options
    )
    preflight(experiment, "prepared", dataset=metadata)
    return metadata


def dataset_artifact_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """What the prepare step's dataset artifact shows of the prepared data's metadata."""
    return {
        "classes": metadata["classes"],
        "counts": metadata["counts"],
        "image_shape": metadata["image_shape"],
        "source_sha256": metadata["source"]["sha256"],
    }
