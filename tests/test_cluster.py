"""What changes when Kubernetes runs a step: tracking must have a server, checkpoints a place."""

from __future__ import annotations

from pathlib import Path

import pytest

from ampbench.cli import main
from ampbench.cluster import (
    CHECKPOINT_URI_ENV,
    POD_ENV,
    check_tracking_server,
    default_checkpoint_dir,
)
from ampbench.errors import AmpbenchError


@pytest.fixture()
def in_a_pod(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv(POD_ENV, "10.96.0.1")
    return monkeypatch


@pytest.mark.parametrize("uri", [None, "", "sqlite:///mlflow.db", "file:///tmp/mlruns", "mlruns"])
def test_tracking_without_a_server_is_refused_in_a_pod(
    in_a_pod: pytest.MonkeyPatch, uri: str | None
) -> None:
    if uri is None:
        in_a_pod.delenv("MLFLOW_TRACKING_URI", raising=False)
    else:
        in_a_pod.setenv("MLFLOW_TRACKING_URI", uri)
    with pytest.raises(AmpbenchError, match=r"names no tracking server .*ampbench-config"):
        check_tracking_server()


def test_a_tracking_server_or_a_local_run_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(POD_ENV, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db")
    check_tracking_server()  # a local run keeps its sqlite file
    monkeypatch.setenv(POD_ENV, "10.96.0.1")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://ampbench-mlflow:5000")
    check_tracking_server()


def test_checkpoints_default_to_the_config_maps_location_in_a_pod_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CHECKPOINT_URI_ENV, "s3://ampbench/checkpoints")
    monkeypatch.delenv(POD_ENV, raising=False)
    assert default_checkpoint_dir() == ""
    monkeypatch.setenv(POD_ENV, "10.96.0.1")
    assert default_checkpoint_dir() == "s3://ampbench/checkpoints"


def test_a_pipeline_in_a_pod_without_tracking_server_fails_in_its_first_step(
    in_a_pod: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The compiled pipeline's steps, run by the local runner as a cluster would run them (in
    a pod, no ConfigMap): prepare fails first, and no training task starts."""
    in_a_pod.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "o"
    argv = ["run", "--data", "synthetic", "--subset", "100", "--batch-size", "50"]
    assert main([*argv, "--allow-emulated", "--output-dir", str(out)]) == 1
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("ampbench: error: prepare: tracking is on, but"), last
    assert not list(out.rglob("results")), "a training task ran"
