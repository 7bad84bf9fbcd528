"""Tracking against real services: an MLflow server (both artifact modes) whose artifacts land
in Ceph RGW, exports to S3, the report rebuilt from MLflow, and tracking outages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from mlflow import MlflowClient

from ampbench import tracking
from ampbench.compare.plots import PLOTS
from ampbench.compare.step import CompareOutputs, ParentRunOptions, run_comparison
from ampbench.errors import AmpbenchError
from ampbench.pipelines.local import LocalRun, summary_lines
from ampbench.results import read_arm_results
from ampbench.system_metrics import SystemMetrics
from ampbench.train.config import TrainConfig
from ampbench.train.loop import Trainer
from ampbench.train.step import run_training
from ampbench.train.tracker import TrackingOptions

if TYPE_CHECKING:
    from services import MlflowServer, Rgw

pytest_plugins = ["services"]

SMALL_RUN = ["--data", "synthetic", "--subset", "50", "--epochs", "2", "--batch-size", "10"]
SMALL_RUN += ["--model", "small-cnn", "--allow-emulated", "--profile-steps", "2"]


def ampbench(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "ampbench.cli", *args],
        env={**os.environ, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def search_runs(server: MlflowServer, experiment: str) -> list[Any]:
    client = MlflowClient(tracking_uri=server.uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None
    return client.search_runs([found.experiment_id])


@pytest.fixture(scope="module")
def proxied_run(
    mlflow_server: MlflowServer, rgw: Rgw, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """`ampbench run` tracked on the server (artifacts proxied into RGW), exported to RGW."""
    work = tmp_path_factory.mktemp("proxied")
    experiment = f"proxied-{uuid.uuid4().hex[:8]}"
    bucket = rgw.make_bucket("ampbench-exports")
    export = f"s3://{bucket}/{experiment}"
    env = {"MLFLOW_TRACKING_URI": mlflow_server.uri, **rgw.env()}
    done = ampbench(
        env, work, "run", *SMALL_RUN, "--experiment", experiment,
        "--register-model", f"ampbench-{experiment}",
        "--output-dir", str(work / "out"), "--export", export,
    )  # fmt: skip
    # No credentials in what the tests get: pytest prints fixture values when a test fails.
    return {"work": work, "experiment": experiment, "export": export, "stdout": done.stdout}


def test_runs_metrics_and_models_arrive_on_the_server(
    proxied_run: dict[str, Any], mlflow_server: MlflowServer, rgw: Rgw
) -> None:
    runs = search_runs(mlflow_server, proxied_run["experiment"])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 2
    parent = parents[0]
    assert parent.data.tags["ampbench.baseline"] == "fp32"
    pipeline_run = parent.data.tags["ampbench.pipeline_run_id"]
    assert pipeline_run and parent.data.tags["kfp.run_id"] == pipeline_run
    client = MlflowClient(tracking_uri=mlflow_server.uri)
    for child in children:
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.data.tags["ampbench.pipeline_run_id"] == pipeline_run
        assert child.data.tags["ampbench.device"] == "cpu"
        # The dtype follows from the arm's precision (amp on a CPU is bf16, fp32 none).
        expected_dtype = {"fp32": "none", "amp": "bfloat16"}[child.data.tags["ampbench.precision"]]
        assert child.data.tags["ampbench.autocast_dtype"] == expected_dtype
        assert child.data.tags["ampbench.emulated"] in ("true", "false")
        assert child.data.params["model"] == "small-cnn"
        assert child.data.params["precision.autocast_dtype"] == expected_dtype
        assert len(child.data.params["dataset_sha256"]) == 64
        history = client.get_metric_history(child.info.run_id, "test_accuracy")
        assert sorted(m.step for m in history) == [1, 2]
    # The same metric names in every arm, so that MLflow's compare view lines them up.
    assert len({frozenset(tracked(child.data.metrics)) for child in children}) == 1
    models = client.search_logged_models(experiment_ids=[parent.info.experiment_id])
    assert {m.source_run_id for m in models} == {c.info.run_id for c in children}
    # The end of the run names the experiment's runs table on the server.
    table = f"{mlflow_server.uri.rstrip('/')}/#/experiments/{parent.info.experiment_id}/runs"
    assert f"runs    : {table}\n" in proxied_run["stdout"]
    versions = client.search_model_versions(f"name='ampbench-{proxied_run['experiment']}'")
    assert len(versions) == 2
    # Proxied mode: every artifact went through the server into the bucket.
    keys = rgw.list_keys(mlflow_server.bucket, "mlflow/")
    for run in runs:
        assert any(run.info.run_id in key and key.endswith("results.json") for key in keys), run
    assert any(key.endswith("report.html") for key in keys)
    assert any("MLmodel" in key for key in keys)


def test_export_copies_report_plots_results_and_models(
    proxied_run: dict[str, Any], rgw: Rgw
) -> None:
    bucket, prefix = proxied_run["export"].removeprefix("s3://").split("/", 1)
    keys = {key.removeprefix(prefix + "/") for key in rgw.list_keys(bucket, prefix)}
    assert {"results.json", "report.md", "report.html"} <= keys
    models = {"models/small-cnn-b10-fp32-seed0.pt", "models/small-cnn-b10-amp-seed0.pt"}
    assert models <= keys
    assert len([k for k in keys if k.startswith("plots/")]) == len(PLOTS)
    local = json.loads((proxied_run["work"] / "out" / "results.json").read_text())
    body = rgw.client().get_object(Bucket=bucket, Key=f"{prefix}/results.json")["Body"].read()
    assert json.loads(body) == local
    # results, the two reports, the plots and the two models
    assert f"exported {5 + len(PLOTS)} files to {proxied_run['export']}" in proxied_run["stdout"]


def test_report_is_rebuilt_from_mlflow_alone(
    proxied_run: dict[str, Any], mlflow_server: MlflowServer, tmp_path: Path
) -> None:
    env = {"MLFLOW_TRACKING_URI": mlflow_server.uri}
    done = ampbench(
        env, tmp_path, "report", "--experiment", proxied_run["experiment"],
        "--output-dir", str(tmp_path / "again"),
    )  # fmt: skip
    assert "===== RESULTS =====" in done.stdout
    original = json.loads((proxied_run["work"] / "out" / "results.json").read_text())
    rebuilt = json.loads((tmp_path / "again" / "results.json").read_text())
    for key in ("speedup", "end_to_end_ratio", "memory_ratio", "accuracy_delta_pp", "verdict"):
        assert rebuilt[key] == original[key]
    assert rebuilt["arms"]["amp"]["per_seed"] == original["arms"]["amp"]["per_seed"]
    assert (tmp_path / "again" / "report.html").is_file()


def test_direct_artifact_mode(
    mlflow_server_direct: MlflowServer, rgw: Rgw, synthetic_dataset: Path, tmp_path: Path
) -> None:
    """The client writes the artifacts to S3 itself; the server only records where."""
    experiment = f"direct-{uuid.uuid4().hex[:8]}"
    env = {"MLFLOW_TRACKING_URI": mlflow_server_direct.uri, **mlflow_server_direct.client_env()}
    ampbench(
        env, tmp_path, "train", "--dataset", str(synthetic_dataset), "--precision", "amp",
        "--model", "small-cnn", "--epochs", "1", "--batch-size", "10", "--subset", "50",
        "--allow-emulated", "--experiment", experiment, "--output-dir", str(tmp_path / "o"),
    )  # fmt: skip
    (run,) = search_runs(mlflow_server_direct, experiment)
    assert run.info.artifact_uri.startswith(f"s3://{mlflow_server_direct.bucket}/direct/")
    keys = rgw.list_keys(mlflow_server_direct.bucket, "direct/")
    assert any(run.info.run_id in key and key.endswith("results.json") for key in keys)
    assert any(run.info.run_id in key and key.endswith("model/state_dict.pth") for key in keys)


def train_config(dataset: Path, epochs: int) -> TrainConfig:
    return TrainConfig(
        dataset_dir=dataset, precision="fp32", model="small-cnn", epochs=epochs,
        batch_size=50, subset=200, device="cpu",
    )  # fmt: skip


def test_outage_mid_training_loses_nothing(
    mlflow_server: MlflowServer,
    synthetic_dataset: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
    experiment = f"outage-{uuid.uuid4().hex[:8]}"
    finish_epoch = Trainer.finish_epoch

    def with_outage(self: Trainer, epoch: int, *args: Any) -> dict[str, Any]:
        if epoch == 0:  # down before epoch 1's metrics are sent...
            mlflow_server.stop(grace=0)
        if epoch == 2:  # ...and back before epoch 3's
            mlflow_server.start()
        return finish_epoch(self, epoch, *args)

    monkeypatch.setattr(Trainer, "finish_epoch", with_outage)
    try:
        results = run_training(
            train_config(synthetic_dataset, epochs=3),
            tmp_path / "results.json",
            tmp_path / "model.pt",
            TrackingOptions(experiment=experiment),
        )
    finally:
        mlflow_server.start()
    client = MlflowClient(tracking_uri=mlflow_server.uri)
    assert results.mlflow is not None
    run_id = results.mlflow.run_id
    for metric in ("train_loss", "test_accuracy", "epoch_time_s"):
        assert [m.step for m in client.get_metric_history(run_id, metric)] == [1, 2, 3], metric
    assert client.get_run(run_id).info.status == "FINISHED"


def test_server_down_to_the_end_fails_after_writing_the_outputs(
    mlflow_server: MlflowServer,
    synthetic_dataset: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # fail fast: the server is down
    monkeypatch.setattr(tracking, "FINAL_FLUSH_ATTEMPTS", 2)
    with mlflow_server.outage(), pytest.raises(AmpbenchError) as raised:
        run_training(
            train_config(synthetic_dataset, epochs=1),
            tmp_path / "results.json",
            tmp_path / "model.pt",
            TrackingOptions(experiment=f"down-{uuid.uuid4().hex[:8]}"),
        )
    message = str(raised.value)
    assert "stayed unreachable" in message and "the run itself" in message
    assert "metric values" in message and "\n" not in message
    assert read_arm_results(tmp_path / "results.json").accuracy is not None
    assert (tmp_path / "model.pt").is_file()


def test_system_metrics_are_sampled_on_a_thread_and_sent_with_the_epochs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLflow's own collectors under its `system/` names (the run's System metrics tab), held
    until the next flush: the sampler itself never talks to MLflow."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    sampler = SystemMetrics(interval_s=0.05)
    run = tracking.ArmRun("system", "sampled", {}, {"a": 1}, sampler)
    assert run.run_id is not None
    sampler.start()
    client = MlflowClient(uri)
    deadline = time.monotonic() + 10
    while len(sampler.samples) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not client.get_run(run.run_id).data.metrics  # sampled, not yet sent
    assert run.flush()
    history = client.get_metric_history(run.run_id, "system/cpu_utilization_percentage")
    assert len(history) >= 3 and [m.step for m in history] == list(range(len(history)))
    memory = client.get_run(run.run_id).data.metrics["system/system_memory_usage_megabytes"]
    assert memory > 0
    run.finish({})
    assert not sampler._thread.is_alive()


def tracked(metrics: dict[str, float]) -> set[str]:
    """The training metrics' names: system metrics (system/...) arrive every 10 s, so an arm
    shorter than that has none."""
    return {name for name in metrics if not name.startswith("system/")}


@pytest.mark.parametrize(("preset", "seen"), [(None, "true"), ("false", "false")])
def test_mlflow_telemetry_is_off_unless_the_user_turned_it_on(
    preset: str | None, seen: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_DISABLE_TELEMETRY"}
    if preset is not None:
        env["MLFLOW_DISABLE_TELEMETRY"] = preset
    # MLflow's own reading of the switch (it also turns telemetry off under CI and pytest).
    probe = (
        "import ampbench.tracking, os\n"
        "from mlflow.environment_variables import MLFLOW_DISABLE_TELEMETRY as switch\n"
        "print(os.environ['MLFLOW_DISABLE_TELEMETRY'], switch.get())"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.split() == [seen, str(seen == "true")]


def test_the_end_of_a_run_names_its_experiments_runs_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLflow 3's UI opens an experiment on its GenAI overview, where a training run does not
    show: the last lines of `ampbench run` give the address of the runs table instead."""
    from arms import arm_result, write_results

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    MlflowClient(store).create_experiment("earlier")  # so that ours is not the first id
    paths = [
        write_results(tmp_path / f"{p}.json", arm_result(p, 0, 0.7, 1000.0, 10.0))
        for p in ("fp32", "amp")
    ]
    outputs = CompareOutputs.in_directory(tmp_path / "out")
    comparison = run_comparison(paths, outputs, parent_run=ParentRunOptions(experiment="mine"))
    experiment = MlflowClient(store).get_experiment_by_name("mine")
    assert experiment is not None and comparison.mlflow is not None
    assert comparison.mlflow["experiment_id"] == experiment.experiment_id != "0"
    run = LocalRun(tmp_path, comparison, outputs, tmp_path / "root", tmp_path / "run.log")
    table = f"/#/experiments/{experiment.experiment_id}/runs"
    assert [line for line in summary_lines(run) if line.startswith("runs    :")][-1] == (
        f"runs    : http://127.0.0.1:5000{table} (served by `ampbench ui`)"
    )
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://user:hunter2@mlflow.example.com/team/")
    lines = summary_lines(run)
    assert lines[-1] == f"runs    : https://mlflow.example.com/team{table}"
    assert not any("hunter2" in line for line in lines)
    # A store with no UI known to ampbench: no address rather than a wrong one.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql://db.example.com/mlflow")
    assert not any(line.startswith("runs    :") for line in summary_lines(run))


@pytest.mark.parametrize("registered", [False, True])
def test_an_arm_run_holds_its_weights_a_loadable_model_and_its_data(
    registered: bool, synthetic_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The weights are the state dict the step wrote, logged as it is; the model is also a
    LoggedModel of the run that mlflow.pytorch.load_model loads, computing what the weights
    compute, with the headline metrics linked to it; the data set is the run's input; and the
    model is registered only when asked."""
    import mlflow.pytorch
    import torch
    from mlflow.artifacts import download_artifacts

    from ampbench.train.models import build_model

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    name = "ampbench-registered" if registered else ""
    results = run_training(
        train_config(synthetic_dataset, epochs=1),
        tmp_path / "results.json",
        tmp_path / "model.pt",
        TrackingOptions(experiment="weights", registered_model_name=name),
    )
    assert results.mlflow is not None and results.mlflow.run_id is not None
    run_id = results.mlflow.run_id
    client = MlflowClient(store)
    weights = download_artifacts(
        f"runs:/{run_id}/{tracking.STATE_DICT_ARTIFACT}", dst_path=str(tmp_path / "down")
    )
    assert Path(weights).read_bytes() == (tmp_path / "model.pt").read_bytes()
    model = build_model("small-cnn", results.dataset.classes, (3, 32, 32))
    model.load_state_dict(torch.load(weights, weights_only=True))
    experiment = client.get_experiment_by_name("weights")
    assert experiment is not None
    (logged,) = client.search_logged_models(experiment_ids=[experiment.experiment_id])
    assert logged.source_run_id == run_id
    linked = {metric.key: metric.value for metric in logged.metrics or []}
    assert linked["accuracy"] == pytest.approx(results.accuracy)
    assert linked["throughput_img_s"] == pytest.approx(results.timing.throughput_img_s)
    loaded = mlflow.pytorch.load_model(f"models:/{logged.model_id}", map_location="cpu")
    images = torch.rand(4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(images), model.eval()(images))
    (data,) = client.get_run(run_id).inputs.dataset_inputs
    assert data.dataset.digest == results.dataset.sha256[:36]
    assert data.dataset.source_type == "local"
    tags = {tag.key: tag.value for tag in data.tags}
    assert tags["train_images"] == str(results.dataset.train_images)
    assert tags["mlflow.data.context"] == "training"
    if registered:
        (version,) = client.search_model_versions(f"name='{name}'")
        assert version.run_id == run_id
    else:
        assert not client.search_registered_models()


def test_only_rank_0_of_a_tracked_run_tracks() -> None:
    """Under torchrun every rank trains; rank 0 alone has an MLflow run (MlflowTracker
    imports MLflow when made, so none is made here for the others)."""
    from ampbench.train.tracker import MlflowTracker, NoTracker, TrackingOptions, tracker_for

    assert isinstance(tracker_for(None, 0), NoTracker)
    assert isinstance(tracker_for(TrackingOptions("e"), 1), NoTracker)
    assert isinstance(tracker_for(TrackingOptions("e"), 0), MlflowTracker)
