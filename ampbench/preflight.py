"""The checks made before anything trains, written once. `ampbench run` and `ampbench submit`
call preflight before they start a pipeline, and the pipeline's prepare step again where it
runs (a submitted run's parameters may have been set in the Kubeflow UI), then
preflight_dataset on the data it prepared: training tasks are retried on failure, so a user's
mistake must reach the user there, once, in one line. Every training process, however it was
started, calls preflight_arm before it reads any data."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ampbench.cluster import check_tracking_server
from ampbench.errors import AmpbenchError
from ampbench.experiment import Experiment, TrainingSettings, section_values
from ampbench.matrix import MatrixRun, check_matrix
from ampbench.train.config import TrainConfig, check_against_dataset

if TYPE_CHECKING:
    import torch

    from ampbench.train.precision import Precision

# run: the local runner trains on this machine; submit: a cluster will; prepare: the
# pipeline's first step, on the cluster or under the local runner.
Where = Literal["run", "submit", "prepare"]


def preflight(experiment: Experiment, where: Where) -> list[MatrixRun]:
    """The experiment's runs, checked; raises AmpbenchError naming the first mistake.

    Everywhere: the resources, the matrix (keys, a baseline in every group, no run twice) and
    every group's training settings. In the prepare step, a tracking server where tracking is
    on (in a pod). For `run`, every precision must run natively on this machine (or emulated
    where allowed). An empty matrix (the prepare step run by itself) checks no runs.
    """
    resources = experiment.resources
    for name, least in (("num_nodes", 1), ("gpu_count", 0)):
        value = int(getattr(resources, name))
        if value < least:
            raise AmpbenchError(
                f"--{name.replace('_', '-')}: must be at least {least}, not {value}"
            )
    if where == "prepare" and experiment.tracking.tracking:
        check_tracking_server()
    arms = experiment.arms
    if not arms.runs and where == "prepare":
        return []
    runs = check_matrix(
        arms.runs,
        arms.baseline_precision,
        subset=experiment.dataset.subset,
        processes=experiment.processes,
        image_size=experiment.dataset.image_size,
        **_train_settings(experiment.training),
    )
    if where == "run":
        precisions = [arms.baseline_precision, *(run.precision for run in runs)]
        _check_precisions_here(list(dict.fromkeys(precisions)), experiment.training.allow_emulated)
    return runs


def preflight_dataset(
    experiment: Experiment, runs: list[MatrixRun], metadata: dict[str, Any]
) -> None:
    """The prepare step's check once the data is prepared: each (model, batch size) group of
    the runs against it (check_against_dataset)."""
    for model, batch_size in sorted({(run.model, run.batch_size) for run in runs}):
        check_against_dataset(
            metadata,
            batch_size=batch_size,
            model=model,
            image_size=experiment.dataset.image_size,
            processes=experiment.processes,
        )


def preflight_arm(
    config: TrainConfig, device: torch.device, processes: int
) -> tuple[Precision, dict[str, Any]]:
    """What every training process checks before it reads any data (data prepared elsewhere,
    a hand-off file, a TrainJob's node): the settings, the precision on this device, and the
    prepared data set against the settings. The precision resolved and the data's metadata."""
    from ampbench.dataset_format import read_metadata
    from ampbench.train.precision import resolve

    config.validate()
    precision = resolve(config.precision, device, config.allow_emulated)
    metadata = read_metadata(Path(config.dataset_dir))
    try:
        check_against_dataset(
            metadata,
            batch_size=config.batch_size,
            model=config.model,
            subset=config.subset,
            image_size=config.image_size,
            processes=processes,
        )
    except AmpbenchError as error:
        raise AmpbenchError(f"{config.dataset_dir}: {error}") from None
    return precision, metadata


# What a training task settles itself: where it checkpoints (in a pod, the ConfigMap's place).
TASK_SETTLED = ("checkpoint_dir", "checkpoint_every")


def _train_settings(training: TrainingSettings) -> dict[str, Any]:
    """The training leaves that are TrainConfig's settings, as each task will check them."""
    config_fields = {f.name for f in fields(TrainConfig)}
    return {
        name: value
        for name, value in section_values(training).items()
        if name in config_fields and name not in TASK_SETTLED
    }


def _check_precisions_here(precisions: list[str], allow_emulated: bool) -> None:
    """The local runner trains on this machine: a precision it cannot run natively stops the
    command now, not after the data is prepared."""
    from ampbench.train.device import pick_device
    from ampbench.train.precision import resolve

    device = pick_device("auto")
    for precision in precisions:
        resolve(precision, device, allow_emulated)
