"""The checks made before anything trains, written once, in the one function every entry point
calls: preflight(config, where). A user's mistake must reach the user once, in one line, before
any work: a pipeline's training tasks are retried on failure, so the pipeline checks its
experiment before it starts and in its prepare step, and every training process checks its own
arm before it reads any data."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from ampbench.cluster import check_tracking_server
from ampbench.errors import AmpbenchError
from ampbench.experiment import Experiment, TrainingSettings, section_values
from ampbench.matrix import MatrixRun, check_matrix
from ampbench.train.config import TrainConfig, check_against_dataset

if TYPE_CHECKING:
    import torch

    from ampbench.train.precision import Precision

# Where preflight runs, in the order a pipeline run meets them:
#   run       `ampbench run`: the local runner will train on this machine;
#   submit    `ampbench submit`: a cluster will;
#   prepare   the pipeline's first step, before its data (a submitted run's parameters may
#             have been set in the Kubeflow UI);
#   prepared  the same step with its data prepared: each group of runs against the data;
#   train     a training process however started (the train step, `ampbench train`, a
#             torchrun rank, a TrainJob's node): its arm on its device and data.
Where = Literal["run", "submit", "prepare", "prepared", "train"]
ExperimentWhere = Literal["run", "submit", "prepare"]


@overload
def preflight(config: Experiment, where: ExperimentWhere) -> list[MatrixRun]: ...
@overload
def preflight(
    config: Experiment, where: Literal["prepared"], *, dataset: dict[str, Any]
) -> list[MatrixRun]: ...
@overload
def preflight(
    config: TrainConfig, where: Literal["train"], *, device: torch.device, processes: int
) -> tuple[Precision, dict[str, Any]]: ...
def preflight(
    config: Experiment | TrainConfig,
    where: Where,
    *,
    dataset: dict[str, Any] | None = None,
    device: torch.device | None = None,
    processes: int = 1,
) -> list[MatrixRun] | tuple[Precision, dict[str, Any]]:
    """Check `config` where it is about to be used; raises AmpbenchError naming the first
    mistake.

    An experiment (run, submit, prepare, prepared): the resources, the matrix (keys, a baseline
    in every group, no run twice) and every group's training settings as its tasks will check
    them. prepare: a tracking server where tracking is on (in a pod); an empty matrix (the
    step run by itself) checks no runs. prepared: each group against `dataset`, the prepared
    data's metadata. run: every precision native on this machine (or emulated where allowed).
    Returns the runs.

    One arm (train): its settings, its precision on `device`, and its prepared data set
    (config.dataset_dir) against the settings with `processes` processes. Returns the
    precision resolved and the data's metadata.
    """
    if isinstance(config, TrainConfig) != (where == "train"):
        raise TypeError("preflight: 'train' checks a TrainConfig, the other places an Experiment")
    if isinstance(config, TrainConfig):
        if device is None:
            raise TypeError("preflight: an arm is checked on its device")
        return _check_arm(config, device, processes)
    runs = _check_experiment(config, where)
    if where == "prepared":
        if dataset is None:
            raise TypeError("preflight: 'prepared' checks the runs against the prepared data")
        _check_against_data(config, runs, dataset)
    return runs


def _check_experiment(experiment: Experiment, where: Where) -> list[MatrixRun]:
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
    if not arms.runs and where in ("prepare", "prepared"):
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


def _check_against_data(
    experiment: Experiment, runs: list[MatrixRun], metadata: dict[str, Any]
) -> None:
    """Each (model, batch size) group of the runs against the prepared data."""
    for model, batch_size in sorted({(run.model, run.batch_size) for run in runs}):
        check_against_dataset(
            metadata,
            batch_size=batch_size,
            model=model,
            image_size=experiment.dataset.image_size,
            processes=experiment.processes,
        )


def _check_arm(
    config: TrainConfig, device: torch.device, processes: int
) -> tuple[Precision, dict[str, Any]]:
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
