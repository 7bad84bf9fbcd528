"""`ampbench run` end to end: real CIFAR-10, the KFP local runner, MLflow, the RESULTS block,
for an experiment matrix of 2 models x 2 batch sizes x 2 precisions (8 training tasks).

Small models (a built-in one and a user's package.module:factory), 128 images, one epoch,
--allow-emulated: the flow is under test, on any CPU; the AMP arms are labelled emulated where
the CPU has no native bf16."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from ampbench.compare.plots import BATCH_PLOT, PLOTS
from ampbench.comparison import read_comparison
from ampbench.results import read_arm_results

# The user's model: a module in the run's directory, importable by every task (PYTHONPATH).
USER_MODEL = "e2e_user_model:tiny_convnet"
MODELS = ("small-cnn", USER_MODEL)
USER_MODULE = """
from torch import nn


def tiny_convnet(num_classes, image_shape):
    channels, _, _ = image_shape
    return nn.Sequential(
        nn.Conv2d(channels, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(8 * 16, num_classes),
    )
"""
ARMS = [f"{m} b{b} {p}" for m in MODELS for b in (32, 64) for p in ("fp32", "amp")]
# The headline pair: the first group's baseline and mixed-precision arms.
FP32, AMP = ARMS[0], ARMS[1]
RESULTS_BLOCK = re.compile(
    r"===== RESULTS =====\n"
    r"FP32 Accuracy: (?P<fp32_acc>\d\.\d{4})\n"
    r"FP32 Memory : (?P<fp32_mem>[\d.]+) MB\n"
    r"FP32 Time   : (?P<fp32_time>[\d.]+) sec\n"
    r"\n"
    r"Mixed Accuracy: (?P<amp_acc>\d\.\d{4})\n"
    r"Mixed Memory  : (?P<amp_mem>[\d.]+) MB\n"
    r"Mixed Time    : (?P<amp_time>[\d.]+) sec\n"
)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory, cifar_archive: Path) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("run")
    (work / "user").mkdir()
    (work / "user" / f"{USER_MODEL.split(':')[0]}.py").write_text(USER_MODULE)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(work / "user"), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "ampbench.cli", "run", "--data", str(cifar_archive)]
    # Two profile steps: the profile's path, at a tenth of its default's cost, in 8 tasks.
    command += ["--subset", "128", "--epochs", "1", "--allow-emulated", "--profile-steps", "2"]
    command += ["--models", ",".join(MODELS), "--batch-sizes", "32,64", "--precisions", "amp"]
    command += ["--output-dir", str(work / "out")]
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {"work": work, "stdout": done.stdout, "uri": env["MLFLOW_TRACKING_URI"]}


def test_prints_the_results_block(local_run: dict[str, Any]) -> None:
    match = RESULTS_BLOCK.search(local_run["stdout"])
    assert match, local_run["stdout"][-2000:]
    comparison = read_comparison(local_run["work"] / "out" / "results.json")
    assert comparison.headline_arm == AMP
    assert float(match["fp32_time"]) == pytest.approx(
        comparison.arms[FP32].train_time_s.value, abs=0.006
    )
    assert float(match["amp_acc"]) == pytest.approx(comparison.arms[AMP].accuracy.value, abs=6e-5)
    assert float(match["amp_mem"]) == pytest.approx(
        comparison.arms[AMP].train_peak_memory_mb.value, abs=0.006
    )
    stdout = local_run["stdout"]
    assert f"Steady-state speedup (images/s, {AMP} / {FP32}): {comparison.speedup:.2f}x" in stdout
    assert f"Verdict: {comparison.verdict}" in stdout
    assert "Every arm against its group's fp32 baseline:" in stdout
    assert "results : " in stdout and "report  : " in stdout


def test_results_json_is_consistent_with_each_training_result(local_run: dict[str, Any]) -> None:
    out = local_run["work"] / "out"
    comparison = read_comparison(out / "results.json")
    arms = comparison.arms
    assert list(arms) == ARMS
    trained = [read_arm_results(path) for path in (out / "pipeline-root").rglob("results")]
    by_arm = {
        f"{r.model} b{r.hyperparameters['batch_size']} {r.precision.requested}": r for r in trained
    }
    assert sorted(by_arm) == sorted(ARMS)
    for name, this in comparison.comparisons.items():
        own, base = by_arm[name], by_arm[this.baseline]
        # Each arm against its own group's baseline (same model and batch size), one seed.
        assert (base.model, base.hyperparameters["batch_size"]) == (
            own.model,
            own.hyperparameters["batch_size"],
        )
        assert base.precision.requested == "fp32"
        assert this.speedup.value == pytest.approx(
            own.timing.throughput_img_s / base.timing.throughput_img_s
        )
        assert this.accuracy_delta_pp.value == pytest.approx(100 * (own.accuracy - base.accuracy))
    assert set(comparison.comparisons) == {a for a in ARMS if a.endswith(" amp")}
    for name, own in by_arm.items():
        assert arms[name].per_seed == [own]
        assert own.dataset.train_images == 128 and len(own.epochs) == 1
        assert own.timing.warmup_s > 0 and own.timing.throughput_img_s > 0
        assert own.requested_resources is None
        assert own.compute is not None and own.compute.flops_per_step > 0
        assert own.compute.mfu is None  # no known peak for a CPU
        expected = "bfloat16" if own.precision.requested == "amp" else None
        assert own.precision.autocast_dtype == expected
    assert set(comparison.best_per_model) == set(MODELS)
    assert comparison.published_differences  # a CPU matrix: a reference, not a reproduction
    report = (out / "report.md").read_text()
    assert "===== RESULTS =====" in report and "3219.65" in report
    assert "## At a glance" in report
    assert "## Published run, for reference only: not a reproduction (model small-cnn" in report
    plots = sorted(p.name for p in (out / "plots").glob("*.png"))
    assert plots == sorted([*PLOTS, BATCH_PLOT])
    assert (out / "report.html").read_text().count("data:image/png;base64,") == len(plots)
    assert sorted(p.name for p in (out / "models").iterdir()) == sorted(
        f"{m}-b{b}-{p}-seed0.pt" for m in MODELS for b in (32, 64) for p in ("fp32", "amp")
    )


def test_mlflow_holds_a_parent_and_two_child_runs_with_metrics(local_run: dict[str, Any]) -> None:
    client = MlflowClient(local_run["uri"])
    experiment = client.get_experiment_by_name("ampbench")
    assert experiment is not None
    # Opens on runs in the MLflow 3 UI, not on traces.
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == len(ARMS)
    parent = parents[0]
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    # Tagged so that the compare view groups them by precision, batch size and model.
    tags = {
        (
            c.data.tags["ampbench.model"],
            c.data.tags["ampbench.batch_size"],
            c.data.tags["ampbench.precision"],
        )
        for c in children
    }
    assert tags == {(m, str(b), p) for m in MODELS for b in (32, 64) for p in ("fp32", "amp")}
    for child in children:
        assert child.data.params["epochs"] == "1"
        assert child.data.params["batch_size"] == child.data.tags["ampbench.batch_size"]
        assert child.data.tags["ampbench.group"] == (
            f"{child.data.tags['ampbench.model']}, batch {child.data.tags['ampbench.batch_size']}"
        )
        history = client.get_metric_history(child.info.run_id, "test_accuracy")
        assert [m.step for m in history] == [1]
        assert child.data.metrics["train_time_s"] > 0
        assert child.data.params["precision.emulated"] in ("True", "False")
        # The images actually used: the prepare step took the subset, so `subset` is 0 here.
        assert child.data.params["train_images"] == child.data.params["test_images"] == "128"
        # Each arm's dtype follows from its precision (amp on a CPU is bf16): swapped or
        # precision-blind tags would fail here. No CUDA graphs on a CPU, as recorded.
        expected_dtype = {"fp32": "none", "amp": "bfloat16"}[child.data.tags["ampbench.precision"]]
        assert child.data.params["precision.autocast_dtype"] == expected_dtype
        assert child.data.tags["ampbench.autocast_dtype"] == expected_dtype
        assert child.data.params["cuda_graphs"] == "False"
        assert child.info.status == "FINISHED"
    # The parent's figures are the comparison's to 4 significant digits, the headline arm's
    # unprefixed.
    comparison = read_comparison(local_run["work"] / "out" / "results.json")
    headline = comparison.comparisons[comparison.headline_arm]
    assert parent.data.metrics["speedup"] == float(f"{headline.speedup.value:.4g}")
    assert parent.data.metrics["end_to_end_ratio"] == float(
        f"{headline.end_to_end_ratio.value:.4g}"
    )
    assert parent.data.params["baseline"] == "fp32" and parent.data.params["arms"] == ",".join(ARMS)
    assert (
        parent.data.params["models"] == ", ".join(sorted(MODELS))
        and parent.data.params["seeds"] == "0"
    )
    assert parent.data.params["batch_sizes"] == "32, 64"
    last = comparison.comparisons[ARMS[-1]]
    assert parent.data.metrics[f"{ARMS[-1].replace(' ', '_')}.speedup"] == float(
        f"{last.speedup.value:.4g}"
    )
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"results.json", "report.md", "report.html", "plots"} <= artifacts
