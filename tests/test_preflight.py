"""preflight: the checks every entry point makes before anything trains, each a one-line
error, and which of them each makes: `ampbench run`, `ampbench submit` and the prepare step
(before and after its data) on the experiment, every training process on its arm."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ampbench.cluster import POD_ENV
from ampbench.errors import AmpbenchError
from ampbench.experiment import Experiment
from ampbench.matrix import DEFAULT_RUNS, matrix_runs
from ampbench.preflight import preflight
from ampbench.train.config import TrainConfig

WHERE = ("run", "submit", "prepare")
RUNS = matrix_runs(["small-cnn"], [32], ["bf16"], [0, 1])


def plan(runs: list | None = None, **settings: object) -> Experiment:
    """An experiment of these runs (none by default) and settings (pipeline parameters)."""
    return Experiment.from_parameters({"runs": runs or [], **settings})


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize(
    ("resources", "error"),
    [
        ({"num_nodes": 0}, "--num-nodes: must be at least 1, not 0"),
        ({"gpu_count": -1}, "--gpu-count: must be at least 0, not -1"),
    ],
)
def test_resources_are_checked_everywhere(where: str, resources: dict, error: str) -> None:
    with pytest.raises(AmpbenchError) as raised:
        preflight(plan(RUNS, **resources), where)  # type: ignore[arg-type]
    assert str(raised.value) == error


@pytest.mark.parametrize("where", WHERE)
def test_the_matrix_and_its_settings_are_checked_everywhere(where: str) -> None:
    runs = preflight(plan(RUNS, allow_emulated=True), where)  # type: ignore[arg-type]
    assert [(run.precision, run.seed) for run in runs] == [
        ("fp32", 0), ("fp32", 1), ("bf16", 0), ("bf16", 1)
    ]  # fmt: skip
    with pytest.raises(AmpbenchError, match=r"^runs: model small-cnn at batch size 32 has no"):
        preflight(plan([run for run in RUNS if run["precision"] != "fp32"]), where)  # type: ignore[arg-type]
    # Each group's settings, as its training tasks would check them, and against --subset.
    with pytest.raises(AmpbenchError, match=r"^--lr: must be positive, not 0"):
        preflight(plan(RUNS, lr=0.0), where)  # type: ignore[arg-type]
    with pytest.raises(AmpbenchError, match=r"^--batch-size 32 x 2 processes .* --subset 40"):
        preflight(plan(RUNS, subset=40, gpu_count=2), where)  # type: ignore[arg-type]


def test_only_the_prepare_step_may_have_no_matrix() -> None:
    assert preflight(plan(), "prepare") == []
    for where in ("run", "submit"):
        with pytest.raises(AmpbenchError, match=r"^runs"):
            preflight(plan(), where)  # type: ignore[arg-type]


def test_the_prepare_step_in_a_pod_refuses_tracking_without_a_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(POD_ENV, "10.0.0.1")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(AmpbenchError, match=r"^tracking is on, but MLFLOW_TRACKING_URI names no"):
        preflight(plan(DEFAULT_RUNS, tracking=True), "prepare")
    assert preflight(plan(DEFAULT_RUNS, tracking=False), "prepare")
    # The server is the cluster's business: submit, from a laptop, does not ask.
    assert preflight(plan(DEFAULT_RUNS, tracking=True), "submit")


def test_the_prepare_step_checks_each_group_against_the_data_it_prepared(
    synthetic_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prepared: the groups against the data (global batch, model on its images); the
    tracking server was the first call's to check, and the step alone has no runs."""
    from ampbench.dataset_format import read_metadata

    metadata = read_metadata(synthetic_dataset)  # 1,000 training images
    monkeypatch.setenv(POD_ENV, "10.0.0.1")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    fits = matrix_runs(["small-cnn"], [500], ["bf16"], [0])
    assert len(preflight(plan(fits, tracking=True), "prepared", dataset=metadata)) == 2
    assert preflight(plan(), "prepared", dataset=metadata) == []
    with pytest.raises(AmpbenchError) as raised:
        preflight(plan(fits, gpu_count=3), "prepared", dataset=metadata)
    assert str(raised.value) == (
        "--batch-size 500 x 3 processes (a global batch of 1,500): larger than the 1,000 "
        "training images"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="TF32 runs on a CUDA GPU")
def test_run_trains_here_so_each_precision_must_run_here() -> None:
    """TF32 is a CUDA mode: a CPU refuses it, emulation or not, for `run` alone."""
    runs = matrix_runs(["small-cnn"], [32], ["tf32"], [0])
    with pytest.raises(AmpbenchError, match=r"^--precision tf32: TF32 is a CUDA tensor-core mode"):
        preflight(plan(runs, allow_emulated=True), "run")
    for where in ("submit", "prepare"):
        assert len(preflight(plan(runs), where)) == 2  # type: ignore[arg-type]


@pytest.mark.parametrize("where", WHERE)
def test_every_training_leaf_is_checked_as_a_task_would(where: str) -> None:
    """The training section's settings reach TrainConfig's rules before anything trains; the
    checkpoint place is the task's to settle (in a pod, from the ConfigMap)."""
    with pytest.raises(AmpbenchError, match=r"^--target-accuracy: must be in \[0, 1\]"):
        preflight(plan(RUNS, target_accuracy=2.0), where)  # type: ignore[arg-type]
    with pytest.raises(AmpbenchError, match=r"^--grad-comm: 'fp64' is not one of"):
        preflight(plan(RUNS, grad_comm="fp64"), where)  # type: ignore[arg-type]
    settled = plan(RUNS, checkpoint_dir="", checkpoint_every=200, allow_emulated=True)
    assert preflight(settled, where)  # type: ignore[arg-type]


def test_every_training_process_checks_settings_then_precision_then_data(
    synthetic_dataset: Path, tmp_path: Path
) -> None:
    """preflight(config, "train"), as each training process calls it: a bad setting or a
    precision this device cannot run is refused before any data set is read (here there is
    none), and what the data rules out names the data set."""
    cpu = torch.device("cpu")
    nowhere = tmp_path / "no-dataset"
    with pytest.raises(AmpbenchError, match=r"^--lr: must be positive, not 0.0$"):
        preflight(TrainConfig(nowhere, precision="fp32", lr=0.0), "train", device=cpu, processes=1)
    with pytest.raises(AmpbenchError, match=r"^--precision tf32: TF32 is a CUDA tensor-core mode"):
        preflight(
            TrainConfig(nowhere, precision="tf32", allow_emulated=True),
            "train",
            device=cpu,
            processes=1,
        )
    with pytest.raises(AmpbenchError, match="not a prepared dataset"):
        preflight(TrainConfig(nowhere, precision="fp32"), "train", device=cpu, processes=1)
    config = TrainConfig(synthetic_dataset, precision="fp32", batch_size=100, model="small-cnn")
    precision, metadata = preflight(config, "train", device=cpu, processes=10)
    assert precision.name == "fp32" and metadata["counts"]["train"] == 1000
    with pytest.raises(AmpbenchError) as raised:
        preflight(config, "train", device=cpu, processes=11)
    assert str(raised.value) == (
        f"{synthetic_dataset}: --batch-size 100 x 11 processes (a global batch of 1,100): "
        "larger than the 1,000 training images"
    )


def test_a_config_checked_where_it_does_not_belong_is_a_programming_error(tmp_path: Path) -> None:
    """The experiment for the pipeline's places, one arm's TrainConfig where it trains."""
    with pytest.raises(TypeError):
        preflight(plan(RUNS), "train")  # type: ignore[call-overload]
    with pytest.raises(TypeError):
        preflight(TrainConfig(tmp_path), "run")  # type: ignore[call-overload]
    with pytest.raises(TypeError):
        preflight(TrainConfig(tmp_path), "train")  # type: ignore[call-overload]
