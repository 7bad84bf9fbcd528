"""The pipeline run's MLflow parent run, which the compare step creates and makes the arms'
runs its children of (MLflow nests runs by their `mlflow.parentRunId` tag), and the arms'
results read back from an experiment (`ampbench report`)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ampbench.errors import AmpbenchError
from ampbench.results import RESULTS_FILE
from ampbench.tracking import (
    BASELINE_TAG,
    MAX_PARAMS_PER_BATCH,
    PARENT_TAG,
    experiment_id,
    flatten_params,
    log_named_artifacts,
    mlflow_client,
    mlflow_errors,
    safe_tracking_uri,
)


def open_parent_run(
    experiment: str,
    run_name: str,
    tags: Mapping[str, str],
    params: Mapping[str, Any],
    children: list[str],
) -> tuple[str, str]:
    """Create the pipeline run's parent run, with its params, and nest the arms' runs under it;
    return its run id and its experiment's id."""
    from mlflow.entities import Param

    with mlflow_errors("creating the pipeline's parent run"):
        client = mlflow_client()
        run = client.create_run(
            experiment_id(client, experiment), run_name=run_name, tags=dict(tags)
        )
        flat = [Param(key, value) for key, value in flatten_params(params).items()]
        for start in range(0, len(flat), MAX_PARAMS_PER_BATCH):
            client.log_batch(run.info.run_id, params=flat[start : start + MAX_PARAMS_PER_BATCH])
        for child in children:
            client.set_tag(child, PARENT_TAG, run.info.run_id)
        return run.info.run_id, run.info.experiment_id


def finish_parent_run(
    run_id: str, artifacts: Mapping[str, Path], metrics: Mapping[str, float]
) -> None:
    """Log the headline metrics and the artifacts (saved under the given names); end the run."""
    from mlflow.entities import Metric

    with mlflow_errors(f"logging the report to run {run_id}"):
        client = mlflow_client()
        now = int(time.time() * 1000)
        client.log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()])
        log_named_artifacts(client, run_id, artifacts)
        client.set_terminated(run_id, "FINISHED")


def pipeline_run_and_arms(
    client: Any, experiment: str, parent_run_id: str | None = None
) -> tuple[Any, list[Any]]:
    """A pipeline run's parent run (without an id, the experiment's newest) and its arm runs,
    oldest first."""
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
        parent = _get_run(client, parent_run_id)
    if not parent.data.tags.get(BASELINE_TAG):
        raise AmpbenchError(f"run {parent.info.run_id}: not the parent run of an ampbench pipeline")
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'",
        order_by=["attributes.start_time ASC"],
    )
    return parent, children


def download_arm_results(
    experiment: str, parent_run_id: str | None, directory: Path
) -> tuple[str, str, list[Path]]:
    """The results.json of every arm run of a pipeline run, from MLflow alone.

    Returns (parent run id, baseline precision, results files); without a parent run id,
    the newest pipeline run of the experiment.
    """
    with mlflow_errors("reading the runs"):
        client = mlflow_client()
        parent, children = pipeline_run_and_arms(client, experiment, parent_run_id)
        arms: list[Path] = []
        for child in children:
            target = directory / child.info.run_id
            target.mkdir(parents=True, exist_ok=True)
            try:
                local = client.download_artifacts(child.info.run_id, RESULTS_FILE, str(target))
            except Exception:
                raise AmpbenchError(
                    f"arm run {child.info.run_id} has no {RESULTS_FILE} (its training did "
                    "not finish?)"
                ) from None
            arms.append(Path(local))
    if not arms:
        raise AmpbenchError(f"run {parent.info.run_id}: has no arm runs")
    return parent.info.run_id, parent.data.tags[BASELINE_TAG], arms


def newest_arm_runs(experiment: str) -> tuple[str, list[str]] | None:
    """The experiment's id and the arm runs of its newest pipeline run (None: it has none)."""
    with mlflow_errors("reading the runs"):
        client = mlflow_client()
        try:
            parent, children = pipeline_run_and_arms(client, experiment)
        except AmpbenchError:
            return None
    return parent.info.experiment_id, [child.info.run_id for child in children]


def find_experiment_id(name: str) -> str | None:
    """The id of the experiment called `name`, or None where the store has none by that name."""
    with mlflow_errors(f"looking up experiment '{name}'"):
        found = mlflow_client().get_experiment_by_name(name)
    return None if found is None else found.experiment_id


def _get_run(client: Any, run_id: str) -> Any:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException as error:
        if error.error_code == "RESOURCE_DOES_NOT_EXIST":
            raise AmpbenchError(f"--parent-run-id {run_id}: no such run") from None
        raise
