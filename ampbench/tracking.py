"""MLflow tracking that never costs a training run: buffered, batched, retried, never silent.

Each training arm is a child run; the compare step creates the pipeline run's parent run and
adopts the children (MLflow nests runs by their `mlflow.parentRunId` tag), so that parallel
training tasks never race to create the parent.

Default tracking URI: a sqlite file `mlflow.db` in the current directory; MLFLOW_TRACKING_URI
overrides it (an http(s):// server, for example).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ampbench.errors import AmpbenchError
from ampbench.logs import log

DEFAULT_EXPERIMENT = "ampbench"
PARENT_TAG = "mlflow.parentRunId"
PIPELINE_RUN_TAG = "ampbench.pipeline_run_id"
BASELINE_TAG = "ampbench.baseline"  # on a parent run: which arm the others are compared with
PRECISION_TAG = "ampbench.precision"  # on an arm run: the precision asked for, its arm's name
RESULTS_ARTIFACT = "results.json"
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
FINAL_FLUSH_ATTEMPTS = 5


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def _client() -> Any:
    # A server that is down should cost seconds, not MLflow's default of minutes of retries;
    # our own buffer retries later instead.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri())


def experiment_id(client: Any, name: str) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    try:
        return client.create_experiment(name)
    except Exception:  # another task created it a moment ago
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def flatten_params(values: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_params(value, f"{name}."))
        else:
            flat[name] = "" if value is None else str(value)
    return flat


class ArmRun:
    """The MLflow run of one training arm. Nothing raised by MLflow reaches the training loop:
    what cannot be sent now is kept and sent later; `finish` says what never arrived."""

    def __init__(
        self, experiment: str, run_name: str, tags: Mapping[str, str], params: Mapping[str, Any]
    ) -> None:
        self.experiment = experiment
        self.run_name = run_name
        self.tags = dict(tags)
        self.params = flatten_params(params)
        self.pending: list[Any] = []
        self.run_id: str | None = None
        self.client = _client()
        self._failing_since: float | None = None
        self.flush()

    def _ensure_run(self) -> str:
        if self.run_id is None:
            from mlflow.entities import Param

            run = self.client.create_run(
                experiment_id(self.client, self.experiment), run_name=self.run_name, tags=self.tags
            )
            params = [Param(k, v) for k, v in self.params.items()]
            for start in range(0, len(params), MAX_PARAMS_PER_BATCH):
                self.client.log_batch(
                    run.info.run_id, params=params[start : start + MAX_PARAMS_PER_BATCH]
                )
            self.run_id = run.info.run_id
        return self.run_id

    def flush(self) -> bool:
        """Send the run and everything pending; False (and kept for later) if MLflow is down."""
        try:
            run_id = self._ensure_run()
            while self.pending:
                chunk = self.pending[:MAX_METRICS_PER_BATCH]
                self.client.log_batch(run_id, metrics=chunk)
                del self.pending[:MAX_METRICS_PER_BATCH]
        except Exception as error:
            if self._failing_since is None:
                self._failing_since = time.monotonic()
                log.warning(
                    "MLflow at %s unreachable (%s); buffering, will retry",
                    safe_tracking_uri(),
                    type(error).__name__,
                )
            return False
        if self._failing_since is not None:
            log.info("MLflow reachable again; buffered values sent")
            self._failing_since = None
        return True

    def log_metrics(self, values: Mapping[str, float | int | None], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.pending += [
            Metric(key, float(value), now, step)
            for key, value in values.items()
            if value is not None
        ]
        self.flush()

    def finish(
        self,
        artifacts: Mapping[str, Path],
        model: Any = None,
        input_example: Any = None,
        registered_model_name: str | None = None,
    ) -> str:
        """Flush (retrying), log artifacts and the model, end the run; raise if any is lost."""
        for attempt in range(FINAL_FLUSH_ATTEMPTS):
            if self.flush():
                break
            time.sleep(min(30, 2**attempt))
        else:
            what = f"{len(self.pending)} metric values" + (
                "" if self.run_id else ", the run itself"
            )
            raise AmpbenchError(
                f"MLflow at {safe_tracking_uri()} stayed unreachable: {what}, the artifacts and "
                f"the model of run '{self.run_name}' were not logged (they are in this step's "
                "outputs)"
            )
        run_id = self._ensure_run()
        try:
            log_named_artifacts(self.client, run_id, artifacts)
            if model is not None:
                log_model(run_id, model, input_example, registered_model_name)
            self.client.set_terminated(run_id, "FINISHED")
        except Exception as error:
            raise AmpbenchError(
                f"MLflow at {safe_tracking_uri()}: logging the artifacts or model of run "
                f"'{self.run_name}' failed ({type(error).__name__}: {error})"
            ) from None
        return run_id


def log_model(
    run_id: str, model: Any, input_example: Any, registered_model_name: str | None
) -> None:
    import mlflow
    import mlflow.pytorch

    mlflow.set_tracking_uri(tracking_uri())
    with mlflow.start_run(run_id=run_id):
        mlflow.pytorch.log_model(
            model,
            name="model",
            input_example=input_example,
            # Inferring requirements imports and inspects the environment: seconds per call.
            pip_requirements=_pip_requirements(),
            registered_model_name=registered_model_name,
        )


def _pip_requirements() -> list[str]:
    import torch
    import torchvision

    return [
        f"torch=={torch.__version__.split('+')[0]}",
        f"torchvision=={torchvision.__version__.split('+')[0]}",
    ]


def safe_tracking_uri() -> str:
    """The tracking URI without any user:password part."""
    uri = tracking_uri()
    if "@" in uri and "://" in uri:
        scheme, rest = uri.split("://", 1)
        return f"{scheme}://{rest.split('@', 1)[1]}"
    return uri


def open_parent_run(
    experiment: str, run_name: str, tags: Mapping[str, str], children: list[str]
) -> str:
    """Create the pipeline run's parent run and nest the arms' runs under it."""
    client = _client()
    run = client.create_run(experiment_id(client, experiment), run_name=run_name, tags=dict(tags))
    for child in children:
        client.set_tag(child, PARENT_TAG, run.info.run_id)
    return run.info.run_id


def log_named_artifacts(client: Any, run_id: str, artifacts: Mapping[str, Path]) -> None:
    """Log files under the given artifact names (KFP names its output files 'results',
    'report', ...; MLflow users should see results.json, report.md, ...)."""
    with tempfile.TemporaryDirectory() as staging:
        for name, path in artifacts.items():
            (Path(staging) / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, Path(staging) / name)
        client.log_artifacts(run_id, staging)


def finish_parent_run(
    run_id: str, artifacts: Mapping[str, Path], metrics: Mapping[str, float]
) -> None:
    """Log the headline metrics and the artifacts (saved under the given names); end the run."""
    from mlflow.entities import Metric

    client = _client()
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()])
    log_named_artifacts(client, run_id, artifacts)
    client.set_terminated(run_id, "FINISHED")


def download_arm_results(
    experiment: str, parent_run_id: str | None, directory: Path
) -> tuple[str, str, dict[str, list[Path]]]:
    """The results.json of every arm run of a pipeline run, from MLflow alone.

    Returns (parent run id, baseline arm, {arm: [results files]}); without a parent run id,
    the newest pipeline run of the experiment.
    """
    client = _client()
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise AmpbenchError(
            f"--experiment {experiment}: no such experiment at {safe_tracking_uri()}"
        )
    if parent_run_id is None:
        parents = client.search_runs(
            [found.experiment_id],
            filter_string=f"tags.`{BASELINE_TAG}` != ''",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        if not parents:
            raise AmpbenchError(f"--experiment {experiment}: holds no ampbench pipeline run")
        parent = parents[0]
    else:
        try:
            parent = client.get_run(parent_run_id)
        except Exception:
            raise AmpbenchError(f"--parent-run-id {parent_run_id}: no such run") from None
    baseline = parent.data.tags.get(BASELINE_TAG)
    if not baseline:
        raise AmpbenchError(f"run {parent.info.run_id}: not the parent run of an ampbench pipeline")
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'",
    )
    arms: dict[str, list[Path]] = {}
    for child in children:
        arm = child.data.tags.get(PRECISION_TAG, "")
        target = directory / child.info.run_id
        target.mkdir(parents=True, exist_ok=True)
        local = client.download_artifacts(child.info.run_id, RESULTS_ARTIFACT, str(target))
        arms.setdefault(arm, []).append(Path(local))
    if not arms:
        raise AmpbenchError(f"run {parent.info.run_id}: has no arm runs")
    return parent.info.run_id, baseline, arms
