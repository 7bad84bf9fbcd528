"""The test services themselves: MLflow servers whose artifacts land in the RGW bucket."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from services import MlflowServer, Rgw

# The fixtures; importing services here instead would skip pytest's assert rewriting.
pytest_plugins = ["services"]


def rest_get(server: MlflowServer, endpoint: str, **query: str) -> dict[str, Any]:
    url = f"{server.uri}/api/2.0/mlflow/{endpoint}?{urllib.parse.urlencode(query)}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as response:
        return json.loads(response.read())


def log_run(server: MlflowServer, tmp_path: Path, files: dict[str, bytes]) -> tuple[str, str]:
    """A run with one metric and `files` as artifacts; (experiment id, run id)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=server.uri)
    experiment_id = client.create_experiment(f"services-{server.mode}-{uuid.uuid4().hex[:8]}")
    run_id = client.create_run(experiment_id).info.run_id
    client.log_metric(run_id, "loss", 0.25, step=3)
    for name, data in files.items():
        path = tmp_path / name
        path.write_bytes(data)
        client.log_artifact(run_id, str(path))
    client.set_terminated(run_id)
    listed = {item.path: item.file_size for item in client.list_artifacts(run_id)}
    assert listed == {name: len(data) for name, data in files.items()}
    return experiment_id, run_id


def check_run(server: MlflowServer, run_id: str) -> dict[str, Any]:
    run = rest_get(server, "runs/get", run_id=run_id)["run"]
    metrics = {m["key"]: (m["value"], m["step"]) for m in run["data"]["metrics"]}
    assert metrics == {"loss": (0.25, 3)}
    assert run["info"]["status"] == "FINISHED"
    return run


def check_bucket(rgw: Rgw, server: MlflowServer, prefix: str, files: dict[str, bytes]) -> None:
    keys = set(rgw.list_keys(server.bucket, prefix))
    assert keys == {prefix + name for name in files}
    client = rgw.client()
    for name, data in files.items():
        body = client.get_object(Bucket=server.bucket, Key=prefix + name)["Body"].read()
        assert body == data


def test_proxied_artifacts_land_in_the_bucket(
    rgw: Rgw, mlflow_server: MlflowServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The client knows nothing about S3: the server holds the endpoint and the keys.
    for key in list(os.environ):
        if key.startswith("AWS_") or key.startswith("MLFLOW_S3"):
            monkeypatch.delenv(key)
    # Over 8 MiB: the server's upload to RGW is multipart.
    files = {"summary.json": b'{"speedup": 1.7}', "weights.bin": os.urandom(9 * 1024 * 1024)}
    experiment_id, run_id = log_run(mlflow_server, tmp_path, files)

    run = check_run(mlflow_server, run_id)
    assert run["info"]["artifact_uri"] == f"mlflow-artifacts:/{experiment_id}/{run_id}/artifacts"
    check_bucket(rgw, mlflow_server, f"mlflow/{experiment_id}/{run_id}/artifacts/", files)


def test_direct_artifacts_land_in_the_bucket(
    rgw: Rgw,
    mlflow_server_direct: MlflowServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key, value in mlflow_server_direct.client_env().items():
        monkeypatch.setenv(key, value)
    files = {"summary.json": b'{"speedup": 1.5}'}
    experiment_id, run_id = log_run(mlflow_server_direct, tmp_path, files)

    run = check_run(mlflow_server_direct, run_id)
    prefix = f"direct/{experiment_id}/{run_id}/artifacts/"
    assert run["info"]["artifact_uri"] == f"s3://{mlflow_server_direct.bucket}/{prefix}".rstrip("/")
    check_bucket(rgw, mlflow_server_direct, prefix, files)


def test_mlflow_server_restarts_with_its_data(mlflow_server: MlflowServer, tmp_path: Path) -> None:
    _, run_id = log_run(mlflow_server, tmp_path, {"a.txt": b"a"})
    port = mlflow_server.port

    with mlflow_server.outage():
        assert not mlflow_server.running
        with pytest.raises(urllib.error.URLError):
            rest_get(mlflow_server, "runs/get", run_id=run_id)

    assert mlflow_server.running
    assert mlflow_server.port == port
    check_run(mlflow_server, run_id)
