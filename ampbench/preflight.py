"""The checks made before anything trains, written once. `ampbench run` and `ampbench submit`
call preflight before they start a pipeline, and the pipeline's prepare step again where it
runs (a submitted run's parameters may have been set in the Kubeflow UI): training tasks are
retried on failure, so a user's mistake must reach the user there, once, in one line."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

from ampbench.cluster import check_tracking_server
from ampbench.errors import AmpbenchError
from ampbench.matrix import MatrixRun, check_matrix
from ampbench.train import BASELINE_PRECISION
from ampbench.train.config import TrainConfig, processes_per_arm

# run: the local runner trains on this machine; submit: a cluster will; prepare: the
# pipeline's first step, on the cluster or under the local runner.
Where = Literal["run", "submit", "prepare"]


@dataclass(frozen=True)
class Plan:
    """What a pipeline run will train: its matrix, and the settings its training tasks share.
    Each task runs gpu_count x num_nodes processes (at least one each) of the arm's batch."""

    runs: list[Any] = field(default_factory=list)
    baseline_precision: str = BASELINE_PRECISION
    epochs: int = TrainConfig.epochs
    lr: float = TrainConfig.lr
    subset: int = TrainConfig.subset
    image_size: int = TrainConfig.image_size
    grad_comm: str = TrainConfig.grad_comm
    gpu_count: int = 1
    num_nodes: int = 1
    allow_emulated: bool = TrainConfig.allow_emulated
    tracking: bool = False

    @property
    def processes(self) -> int:
        return processes_per_arm(self.gpu_count, self.num_nodes)


# Each of Plan's fields is the pipeline parameter of its name (tests/test_pipeline.py).
PLAN_PARAMETERS = tuple(f.name for f in fields(Plan))


def preflight(plan: Plan, where: Where) -> list[MatrixRun]:
    """The plan's runs, checked; raises AmpbenchError naming the first mistake.

    Everywhere: the resources, the matrix (keys, a baseline in every group, no run twice) and
    every group's training settings. In the prepare step, a tracking server where tracking is
    on (in a pod). For `run`, every precision must run natively on this machine (or emulated
    where allowed). An empty matrix (the prepare step run by itself) checks no runs.
    """
    for name, least in (("num_nodes", 1), ("gpu_count", 0)):
        value = int(getattr(plan, name))
        if value < least:
            raise AmpbenchError(
                f"--{name.replace('_', '-')}: must be at least {least}, not {value}"
            )
    if where == "prepare" and plan.tracking:
        check_tracking_server()
    if not plan.runs and where == "prepare":
        return []
    runs = check_matrix(
        plan.runs,
        plan.baseline_precision,
        epochs=plan.epochs,
        lr=plan.lr,
        subset=plan.subset,
        image_size=plan.image_size,
        grad_comm=plan.grad_comm,
        processes=plan.processes,
    )
    if where == "run":
        precisions = [plan.baseline_precision, *(run.precision for run in runs)]
        _check_precisions_here(list(dict.fromkeys(precisions)), plan.allow_emulated)
    return runs


def _check_precisions_here(precisions: list[str], allow_emulated: bool) -> None:
    """The local runner trains on this machine: a precision it cannot run natively stops the
    command now, not after the data is prepared."""
    from ampbench.train.device import pick_device
    from ampbench.train.precision import resolve

    device = pick_device("auto")
    for precision in precisions:
        resolve(precision, device, allow_emulated)
