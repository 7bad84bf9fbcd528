"""`ampbench run` end to end: real CIFAR-10, the KFP local runner, MLflow, the RESULTS block.

small-cnn and --allow-emulated: the flow is under test, on any CPU; the AMP arm is labelled
emulated where the CPU has no native bf16."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from ampbench.results import read_arm_results, read_comparison

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
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"}
    command = [sys.executable, "-m", "ampbench.cli", "run", "--data", str(cifar_archive)]
    command += ["--subset", "256", "--epochs", "1", "--model", "small-cnn", "--allow-emulated"]
    command += ["--output-dir", str(work / "out")]
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {"work": work, "stdout": done.stdout, "uri": env["MLFLOW_TRACKING_URI"]}


def test_prints_the_results_block(local_run: dict[str, Any]) -> None:
    match = RESULTS_BLOCK.search(local_run["stdout"])
    assert match, local_run["stdout"][-2000:]
    comparison = read_comparison(local_run["work"] / "out" / "results.json")
    assert float(match["fp32_time"]) == pytest.approx(
        comparison.arms["fp32"].train_time_s.value, abs=0.006
    )
    assert float(match["amp_acc"]) == pytest.approx(comparison.arms["amp"].accuracy.value, abs=6e-5)
    assert float(match["amp_mem"]) == pytest.approx(
        comparison.arms["amp"].train_peak_memory_mb.value, abs=0.006
    )
    stdout = local_run["stdout"]
    assert f"Steady-state speedup (images/s, amp / fp32): {comparison.speedup:.2f}x" in stdout
    assert f"Verdict: {comparison.verdict}" in stdout
    assert "results : " in stdout and "report  : " in stdout


def test_results_json_is_consistent_with_each_training_result(local_run: dict[str, Any]) -> None:
    out = local_run["work"] / "out"
    comparison = read_comparison(out / "results.json")
    arms = comparison.arms
    trained = [read_arm_results(path) for path in (out / "pipeline-root").rglob("results")]
    by_precision = {r.precision.requested: r for r in trained}
    assert set(by_precision) == {"fp32", "amp"}
    fp32, amp = by_precision["fp32"], by_precision["amp"]
    # One seed: the headline figures are the two runs' own ratios.
    assert comparison.speedup == pytest.approx(
        amp.timing.throughput_img_s / fp32.timing.throughput_img_s
    )
    assert comparison.end_to_end_ratio == pytest.approx(
        fp32.timing.end_to_end_s / amp.timing.end_to_end_s
    )
    assert comparison.memory_ratio == pytest.approx(
        amp.memory.train_peak_mb / fp32.memory.train_peak_mb
    )
    assert comparison.accuracy_delta_pp == pytest.approx(100 * (amp.accuracy - fp32.accuracy))
    assert arms["fp32"].precision.autocast_dtype is None
    assert arms["amp"].precision.autocast_dtype == "bfloat16"
    assert arms["amp"].precision.emulated == ("amp" in comparison.emulated)
    for arm, own in by_precision.items():
        assert arms[arm].per_seed == [own]
        assert own.dataset.train_images == 256 and len(own.epochs) == 1
        assert own.timing.warmup_s > 0 and own.timing.throughput_img_s > 0
        assert own.requested_resources is None
    assert comparison.published_differences  # small-cnn on a CPU: a reference, not a reproduction
    report = (out / "report.md").read_text()
    assert "===== RESULTS =====" in report and "3219.65" in report
    assert "## Published run, for reference only: not a reproduction (model small-cnn" in report
    assert (out / "report.html").read_text().count("data:image/png;base64,") == 3
    assert len(list((out / "plots").glob("*.png"))) == 3
    assert sorted(p.name for p in (out / "models").iterdir()) == ["amp-seed0.pt", "fp32-seed0.pt"]


def test_mlflow_holds_a_parent_and_two_child_runs_with_metrics(local_run: dict[str, Any]) -> None:
    client = MlflowClient(local_run["uri"])
    experiment = client.get_experiment_by_name("ampbench")
    assert experiment is not None
    # Opens on runs in the MLflow 3 UI, not on traces.
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 2
    parent = parents[0]
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert {c.data.tags["ampbench.precision"] for c in children} == {"fp32", "amp"}
    for child in children:
        assert child.data.params["epochs"] == "1"
        assert child.data.params["batch_size"] == "128"
        history = client.get_metric_history(child.info.run_id, "test_accuracy")
        assert [m.step for m in history] == [1]
        assert child.data.metrics["train_time_s"] > 0
        assert child.data.params["precision.emulated"] in ("True", "False")
        # The images actually used: the prepare step took the subset, so `subset` is 0 here.
        assert child.data.params["train_images"] == child.data.params["test_images"] == "256"
        assert child.data.params["precision.autocast_dtype"] in ("none", "bfloat16")
        assert child.info.status == "FINISHED"
    assert parent.data.metrics["speedup"] > 0 and parent.data.metrics["end_to_end_ratio"] > 0
    assert parent.data.params["baseline"] == "fp32" and parent.data.params["arms"] == "fp32,amp"
    assert parent.data.params["model"] == "small-cnn" and parent.data.params["seeds"] == "0"
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"results.json", "report.md", "report.html", "plots"} <= artifacts
