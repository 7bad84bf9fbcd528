"""Each KFP component under the KFP local runner (SubprocessRunner, this Python)."""

import json
import warnings
from pathlib import Path

import pytest
import torch
from kfp import dsl, local

from ampbench.comparison import read_comparison
from ampbench.components.prepare.component import DEFAULTS as PREPARE_DEFAULTS
from ampbench.components.prepare.component import prepare
from ampbench.components.train.component import train
from ampbench.matrix import matrix_runs
from ampbench.pipelines.pipeline import build_pipeline
from ampbench.results import read_arm_results
from ampbench.train.config import TrainConfig


@pytest.fixture()
def local_runner(tmp_path: Path) -> Path:
    root = tmp_path / "pipeline-root"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root))
    warnings.filterwarnings("ignore", message=".*custom or non-Python base image")
    warnings.filterwarnings("ignore", message=".*have no effect in the current local runner")
    return root


def test_prepare_component(local_runner: Path) -> None:
    task = prepare(data="synthetic", subset=50)
    dataset = task.outputs["dataset"]
    metadata = json.loads((Path(dataset.path) / "metadata.json").read_text())
    assert metadata["counts"] == {"train": 50, "test": 50}
    assert dataset.metadata["counts"] == {"train": 50, "test": 50}


def test_prepare_component_fails_cleanly_on_bad_input(
    local_runner: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(RuntimeError, match="FAILURE"):
        prepare(data="/no/such/dataset")
    step_log = capsys.readouterr().out  # the local runner prints the step's output here
    errors = [line for line in step_log.splitlines() if "ERROR: prepare:" in line]
    assert len(errors) == 1 and "/no/such/dataset: no such file or directory" in errors[0]
    assert "Traceback" not in step_log


@pytest.mark.parametrize(
    ("gpu_count", "num_nodes", "error"),
    [
        (2, 1, ""),  # 2 processes x 25 = the 50 training images
        (0, 2, ""),  # CPU nodes: one process each
        (
            2,
            2,
            "ERROR: prepare: --batch-size 25 x 4 processes (a global batch of 100): larger "
            "than the 50 training images",
        ),
    ],
)
def test_prepare_checks_each_arms_global_batch(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    gpu_count: int,
    num_nodes: int,
    error: str,
) -> None:
    """A training task runs gpu_count x num_nodes processes of the arm's batch each: a global
    batch the data cannot fill is the prepare step's one line, before any task trains. Only
    the prepared data tells here (a folder of 50 training images, no --subset)."""
    from datagen import make_image_folder

    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 25, "test": 2})
    dataset = dsl.Dataset(name="dataset", uri=str(tmp_path / "dataset"), metadata={})
    runs = matrix_runs(["small-cnn"], [25], ["amp"], [0])
    # python_func is the source as written: the parameters with_defaults gives defaults to
    # have none there.
    settings = {**PREPARE_DEFAULTS, "data": str(tmp_path / "tree"), "runs": runs, "epochs": 1}
    settings |= {"gpu_count": gpu_count, "num_nodes": num_nodes}
    if not error:
        prepare.python_func(dataset=dataset, **settings)
        assert dataset.metadata["counts"]["train"] == 50
        return
    with pytest.raises(SystemExit):
        prepare.python_func(dataset=dataset, **settings)
    assert capsys.readouterr().err.strip().splitlines()[-1] == error


def test_prepare_checks_every_training_setting_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The training settings a task would refuse are the prepare step's one line, before any
    retried training task starts (here one only the pipeline's training section carries)."""
    dataset = dsl.Dataset(name="dataset", uri=str(tmp_path / "dataset"), metadata={})
    runs = matrix_runs(["small-cnn"], [25], ["amp"], [0])
    settings = {**PREPARE_DEFAULTS, "data": "synthetic", "subset": 50, "runs": runs}
    with pytest.raises(SystemExit):
        prepare.python_func(dataset=dataset, **settings | {"label_smoothing": 1.5})
    error = "ERROR: prepare: --label-smoothing: must be in [0, 1), not 1.5"
    assert capsys.readouterr().err.strip().splitlines()[-1] == error
    assert not (tmp_path / "dataset").exists()


def test_train_component(local_runner: Path) -> None:
    @dsl.pipeline
    def one_arm() -> dsl.Metrics:
        data = prepare(data="synthetic", subset=200)
        return train(
            dataset=data.outputs["dataset"],
            precision="fp32",
            epochs=1,
            batch_size=50,
            model_name="small-cnn",
            tracking=False,
        ).outputs["metrics"]

    metrics = one_arm().output
    assert metrics.metadata["train_time_s"] > 0 and metrics.metadata["warmup_s"] > 0
    assert 0 <= metrics.metadata["accuracy"] <= 1
    run_dir = next(local_runner.iterdir())
    results = read_arm_results(next(p for p in run_dir.rglob("results") if p.is_file()))
    assert results.precision.resolved == "fp32"
    assert results.accuracy == metrics.metadata["accuracy"]
    # Every metric the component outputs is the results file's own figure, under its name.
    timing, memory = results.timing, results.memory
    from_results = {
        "accuracy": results.accuracy,
        "train_time_s": timing.train_time_s,
        "throughput_img_s": timing.throughput_img_s,
        "end_to_end_s": timing.end_to_end_s,
        "warmup_s": timing.warmup_s,
        "compile_s": timing.compile_s,
        "eval_s": timing.eval_s,
        "train_peak_memory_mb": memory.train_peak_mb,
        "total_peak_memory_mb": memory.total_peak_mb,
        "resident_memory_mb": memory.resident_mb,
        "train_peak_reserved_mb": memory.train_peak_reserved_mb,
        "skipped_steps": results.skipped_steps,
    }
    expected = {name: float(value) for name, value in from_results.items() if value is not None}
    assert metrics.metadata == expected
    # The component's defaults are the training config's: none was given for lr or seed.
    assert results.hyperparameters["lr"] == TrainConfig.lr
    assert results.hyperparameters["warmup_steps"] == TrainConfig.warmup_steps
    assert results.requested_resources is None  # the local runner requests nothing
    state = torch.load(next(p for p in run_dir.rglob("model") if p.is_file()), weights_only=True)
    assert all(isinstance(v, torch.Tensor) for v in state.values())


def test_compare_component_in_the_pipeline_over_two_seeds(local_runner: Path) -> None:
    pipeline = build_pipeline(schedule="sequential")
    task = pipeline(
        data="synthetic",
        subset=100,
        epochs=1,
        runs=matrix_runs(["small-cnn"], [25], ["amp"], [0, 1]),
        allow_emulated=True,
        tracking=False,
        profile_steps=2,
    )
    comparison = read_comparison(Path(task.outputs["comparison"].path))
    assert comparison.arms["fp32"].seeds == [0, 1]
    assert comparison.arms["amp"].accuracy.n == 2
    speedup = comparison.comparisons["amp"].speedup
    assert speedup.low is not None and speedup.low < speedup.value < speedup.high
    report = Path(task.outputs["report"].path).read_text()
    assert "===== RESULTS =====" in report and "95% CI" in report and "**Verdict.**" in report
