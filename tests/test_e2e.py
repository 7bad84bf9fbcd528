"""`ampbench run` end to end: real CIFAR-10, the KFP local runner, MLflow, the RESULTS block."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

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
    command += ["--subset", "256", "--epochs", "1", "--output-dir", str(work / "out")]
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {"work": work, "stdout": done.stdout, "uri": env["MLFLOW_TRACKING_URI"]}


def test_prints_the_results_block(local_run: dict[str, Any]) -> None:
    match = RESULTS_BLOCK.search(local_run["stdout"])
    assert match, local_run["stdout"][-2000:]
    results = json.loads((local_run["work"] / "out" / "results.json").read_text())
    assert float(match["fp32_time"]) == pytest.approx(
        results["runs"]["fp32"]["train_time_s"], abs=0.006
    )
    assert float(match["amp_acc"]) == pytest.approx(results["runs"]["amp"]["accuracy"], abs=6e-5)
    assert "results : " in local_run["stdout"] and "report  : " in local_run["stdout"]


def test_results_json_is_consistent_with_each_training_result(local_run: dict[str, Any]) -> None:
    out = local_run["work"] / "out"
    results = json.loads((out / "results.json").read_text())
    runs = results["runs"]
    assert results["speedup"] == pytest.approx(
        runs["fp32"]["train_time_s"] / runs["amp"]["train_time_s"]
    )
    assert results["memory_ratio"] == pytest.approx(
        runs["amp"]["peak_memory_mb"] / runs["fp32"]["peak_memory_mb"]
    )
    assert results["accuracy_delta_pp"] == pytest.approx(
        100 * (runs["amp"]["accuracy"] - runs["fp32"]["accuracy"])
    )
    assert runs["fp32"]["autocast_dtype"] is None
    assert runs["amp"]["autocast_dtype"] == "bfloat16"
    for arm in ("fp32", "amp"):
        for field in ("precision", "device", "accuracy", "peak_memory_mb", "train_time_s"):
            assert runs[arm][field] is not None, (arm, field)
        assert runs[arm]["throughput_img_s"] > 0
        assert len(runs[arm]["epochs"]) == 1
    # Each arm's own results file, as the train step wrote it, says the same.
    trained = [
        json.loads(path.read_text())
        for path in (out / "pipeline-root").rglob("results")
        if path.is_file()
    ]
    by_precision = {r["precision"]: r for r in trained}
    assert set(by_precision) == {"fp32", "amp"}
    for arm, own in by_precision.items():
        assert runs[arm]["accuracy"] == own["accuracy"]
        assert runs[arm]["train_time_s"] == own["train_time_s"]
        assert runs[arm]["peak_memory_mb"] == own["peak_memory_mb"]
        assert own["dataset"]["train_images"] == 256
    report = (out / "report.md").read_text()
    assert "===== RESULTS =====" in report and "3219.65" in report
    assert (out / "report.html").read_text().count("data:image/png;base64,") == 3
    assert len(list((out / "plots").glob("*.png"))) == 3


def test_mlflow_holds_a_parent_and_two_child_runs_with_metrics(local_run: dict[str, Any]) -> None:
    client = MlflowClient(local_run["uri"])
    experiment = client.get_experiment_by_name("ampbench")
    assert experiment is not None
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
        assert child.info.status == "FINISHED"
    assert parent.data.metrics["speedup"] > 0
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"results.json", "report.md", "report.html", "plots"} <= artifacts
