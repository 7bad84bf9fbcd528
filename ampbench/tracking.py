"""MLflow tracking that never costs a timed step: buffered, batched, retried, never silent.

Each training arm is a child run (ArmRun); the compare step creates the pipeline run's parent
run and adopts the children (parent_run.py), so that parallel training tasks never race to
create the parent.

Default tracking URI: a sqlite file `mlflow.db` in the current directory; MLFLOW_TRACKING_URI
overrides it (an http(s):// server, for example).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit, urlunsplit

from ampbench.errors import AmpbenchError, one_line
from ampbench.logs import log

if TYPE_CHECKING:
    from ampbench.system_metrics import SystemMetrics

TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"  # MLflow's own

DEFAULT_EXPERIMENT = "ampbench"
PARENT_TAG = "mlflow.parentRunId"
PIPELINE_RUN_TAG = "ampbench.pipeline_run_id"
KFP_RUN_TAG = "kfp.run_id"  # the pipeline run's id again, under KFP's name for it
PIPELINE_TAG = "ampbench.pipeline"  # on a parent run: the pipeline's name
BASELINE_TAG = "ampbench.baseline"  # on a parent run: which arm the others are compared with
PRECISION_TAG = "ampbench.precision"  # on an arm run: the precision asked for, its arm's name
# An arm run's trained weights (the train step's state dict), where mlflow.pytorch's
# load_state_dict("runs:/<run id>/model") looks for them.
STATE_DICT_ARTIFACT = "model/state_dict.pth"
# The experiment tag the MLflow 3 UI reads to choose between its model-training and GenAI views.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"
UI_HOST = "127.0.0.1"  # `ampbench ui` serves this machine only
UI_PORT = 5000  # `ampbench ui`'s default port
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
FINAL_FLUSH_ATTEMPTS = 5
# Before MLflow's first import, unless the user set them: a down server costs seconds, not
# minutes (our buffer retries later), and no telemetry threads run while steps are timed.
MLFLOW_ENV_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
    "MLFLOW_DISABLE_TELEMETRY": "true",
}
for _name, _value in MLFLOW_ENV_DEFAULTS.items():
    os.environ.setdefault(_name, _value)


def tracking_uri() -> str:
    return os.environ.get(TRACKING_URI_ENV) or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def local_store() -> bool:
    """Whether the store is a sqlite file, whose UI `ampbench ui` serves (a server has its own)."""
    return tracking_uri().startswith("sqlite:")


def local_ui_base(port: int = UI_PORT) -> str:
    """Where `ampbench ui` serves a local store's UI."""
    return f"http://{UI_HOST}:{port}"


def ui_base() -> str | None:
    """The address of the tracking store's UI, without credentials: the server itself, or for
    a sqlite file what `ampbench ui` serves; None for a store with no UI of its own known."""
    if local_store():
        return local_ui_base()
    uri = tracking_uri()
    if urlsplit(uri).scheme in ("http", "https"):
        return without_credentials(uri).rstrip("/")
    return None


def runs_table_url(base: str, experiment_id: str) -> str:
    """The experiment's runs table in MLflow's UI. MLflow 3's UI opens an experiment on its
    GenAI overview (traces), where nothing of a training run shows; this address does not."""
    return f"{base}/#/experiments/{experiment_id}/runs"


def compare_runs_url(base: str, experiment_id: str, run_ids: Sequence[str]) -> str:
    """MLflow's compare-runs page for `run_ids`: their params and metrics side by side."""
    runs = quote(json.dumps(list(run_ids), separators=(",", ":")))
    experiments = quote(json.dumps([experiment_id], separators=(",", ":")))
    return f"{base}/#/compare-runs?runs={runs}&experiments={experiments}"


def mlflow_client() -> Any:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri())


def experiment_id(client: Any, name: str) -> str:
    """The experiment's id, created if missing, and marked as model training where it has no
    kind yet: MLflow 3 otherwise opens it in its GenAI view (traces, judges), not on runs."""
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING})
        except Exception:  # another task created it a moment ago
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                raise
    if EXPERIMENT_KIND_TAG not in experiment.tags:
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
    return experiment.experiment_id


def flatten_params(values: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_params(value, f"{name}."))
        else:
            flat[name] = "none" if value is None else str(value)  # as the tags say it
    return flat


class ArmRun:
    """The MLflow run of one training arm.

    The run and its params are created when this is made, before training starts; metric
    values are queued by `log_metrics` and sent by `flush`, which the train step calls between
    epochs: nothing of MLflow's runs while training steps are timed. A server that is slow,
    down or restarting costs the training nothing but those between-epoch attempts: what
    cannot be sent is kept, and tried again once RETRY_AFTER_S has passed. `finish` sends what
    is left, retrying, and raises an error naming what never arrived.
    """

    RETRY_AFTER_S = 30.0  # back-off between attempts while the server does not answer

    def __init__(
        self,
        experiment: str,
        run_name: str,
        tags: Mapping[str, str],
        params: Mapping[str, Any],
        system_metrics: SystemMetrics | None = None,
    ) -> None:
        self.experiment = experiment
        self.system_metrics = system_metrics
        self.system_step = 0
        self.run_name = run_name
        self.tags = dict(tags)
        self.params = flatten_params(params)
        self.params_logged = False
        self.pending: list[Any] = []
        self.run_id: str | None = None
        self.client = mlflow_client()
        self._failing = False
        self._next_attempt = 0.0  # time.monotonic() before which flush() does not try
        self.flush()  # create the run now, before the clock starts

    def _ensure_run(self) -> str:
        from mlflow.entities import Param

        if self.run_id is None:
            run = self.client.create_run(
                experiment_id(self.client, self.experiment), run_name=self.run_name, tags=self.tags
            )
            self.run_id = run.info.run_id
        if not self.params_logged:
            params = [Param(k, v) for k, v in self.params.items()]
            for start in range(0, len(params), MAX_PARAMS_PER_BATCH):
                self.client.log_batch(
                    self.run_id, params=params[start : start + MAX_PARAMS_PER_BATCH]
                )
            self.params_logged = True
        return self.run_id

    def flush(self) -> bool:
        """Send the run and everything pending now; False (and kept for later) if MLflow is
        down or was down less than RETRY_AFTER_S ago."""
        if time.monotonic() < self._next_attempt:
            return False
        if self.system_metrics is not None:
            from mlflow.entities import Metric

            for timestamp, values in self.system_metrics.drain():
                self.pending += [
                    Metric(f"system/{key}", float(value), timestamp, self.system_step)
                    for key, value in values.items()
                ]
                self.system_step += 1
        try:
            run_id = self._ensure_run()
            while self.pending:
                chunk = self.pending[:MAX_METRICS_PER_BATCH]
                self.client.log_batch(run_id, metrics=chunk)
                del self.pending[: len(chunk)]
        except Exception as error:
            self._next_attempt = time.monotonic() + self.RETRY_AFTER_S
            if not self._failing:
                self._failing = True
                log.warning(
                    "MLflow at %s unreachable (%s); buffering, will retry between epochs",
                    safe_tracking_uri(),
                    type(error).__name__,
                )
            return False
        if self._failing:
            log.info("MLflow reachable again; buffered values sent")
            self._failing = False
        return True

    def log_metrics(self, values: Mapping[str, float | int | None], step: int) -> None:
        """Queue values (None ones are left out) for the next flush."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.pending += [
            Metric(key, float(value), now, step)
            for key, value in values.items()
            if value is not None
        ]

    def finish(self, artifacts: Mapping[str, Path], model: LoggedModelSpec | None = None) -> str:
        """Flush (retrying), log artifacts and the model, end the run; raise if any is lost."""
        import tenacity

        if self.system_metrics is not None:
            self.system_metrics.stop()

        def flush_now() -> bool:
            self._next_attempt = 0.0
            return self.flush()

        flushed = tenacity.Retrying(
            retry=tenacity.retry_if_result(lambda sent: not sent),
            stop=tenacity.stop_after_attempt(FINAL_FLUSH_ATTEMPTS),
            wait=tenacity.wait_exponential(multiplier=1, max=30),
            retry_error_callback=lambda state: False,
        )(flush_now)
        if not flushed:
            what = f"{len(self.pending)} metric values"
            if self.run_id is None:
                what += ", the run itself"
            elif not self.params_logged:
                what += ", its params"
            raise AmpbenchError(
                f"MLflow at {safe_tracking_uri()} stayed unreachable: {what}, the artifacts and "
                f"the model of run '{self.run_name}' were not logged (they are in this step's "
                "outputs)"
            )
        assert self.run_id is not None
        try:
            log_named_artifacts(self.client, self.run_id, artifacts)
            if model is not None:
                log_model(self.run_id, model)
            self.client.set_terminated(self.run_id, "FINISHED")
        except Exception as error:
            raise AmpbenchError(
                f"MLflow at {safe_tracking_uri()}: logging the artifacts or model of run "
                f"'{self.run_name}' failed ({describe(error)})"
            ) from None
        return self.run_id


@dataclass(frozen=True)
class DatasetInput:
    """The prepared data set an arm trained on, as the run's MLflow dataset input."""

    name: str
    source: str  # what the user gave --data (a path, s3:// or synthetic)
    digest: str  # the content hash of the prepared data
    splits: Mapping[str, int]  # images per split trained and evaluated on


@dataclass(frozen=True)
class LoggedModelSpec:
    """An arm's trained model as an MLflow LoggedModel: the module (on the CPU), the shape of
    its input batches (channels, height, width) and classes for its signature, the headline
    metrics linked to it, the data it was trained on, and a registered name if any."""

    module: Any
    input_shape: tuple[int, int, int]
    classes: int
    metrics: Mapping[str, float]
    dataset: DatasetInput
    step: int  # the metrics' step: the epochs trained
    registered_model_name: str | None = None


def model_signature(input_shape: tuple[int, int, int], classes: int) -> Any:
    """Images (N, C, H, W) in, logits (N, classes) out, float32: stated, so that MLflow runs
    nothing to infer it."""
    import numpy as np
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import Schema, TensorSpec

    return ModelSignature(
        inputs=Schema([TensorSpec(np.dtype(np.float32), (-1, *input_shape), "images")]),
        outputs=Schema([TensorSpec(np.dtype(np.float32), (-1, classes), "logits")]),
    )


def log_model(run_id: str, spec: LoggedModelSpec) -> None:
    """The model as a LoggedModel of the run, in MLflow's pickle format with a stated signature
    (a fraction of a second; torch.export's pt2 with an input example takes seconds), the
    headline metrics linked to it, and the data set as the run's training input."""
    import mlflow
    import mlflow.pytorch
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    mlflow.set_tracking_uri(tracking_uri())
    data = spec.dataset
    with warnings.catch_warnings():  # it warns that a source it resolved is not a known kind
        warnings.simplefilter("ignore")
        source = resolve_dataset_source(data.source)
    dataset = MetaDataset(source, name=data.name, digest=data.digest)
    with mlflow.start_run(run_id=run_id):
        mlflow.log_input(
            dataset,
            context="training",
            tags={f"{split}_images": str(count) for split, count in data.splits.items()},
        )
        info = mlflow.pytorch.log_model(
            spec.module,
            name="model",
            signature=model_signature(spec.input_shape, spec.classes),
            serialization_format="pickle",
            # Inferring requirements imports and inspects the environment: seconds per call.
            pip_requirements=_pip_requirements(),
            registered_model_name=spec.registered_model_name,
        )
        mlflow.log_metrics(
            dict(spec.metrics), step=spec.step, model_id=info.model_id, dataset=dataset
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
    return without_credentials(tracking_uri())


def without_credentials(uri: str) -> str:
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def describe(error: Exception) -> str:
    """An MLflow error in one line, with any URL in it stripped of credentials (MLflow puts
    the request URL, user:password included, into its messages)."""
    text = one_line(str(error)) or type(error).__name__
    text = re.sub(
        r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"]+", lambda m: without_credentials(m.group()), text
    )
    return f"{type(error).__name__}: {text[:300]}"


def preload() -> None:
    """Import MLflow's client now: a training run's memory readings start after this, and
    the import (with sqlalchemy for a sqlite store) is no part of training. Not its PyTorch
    flavour: only a model to register needs it, after training."""
    import mlflow  # noqa: F401
    from mlflow.store.tracking import sqlalchemy_store  # noqa: F401


@contextmanager
def mlflow_errors(what: str) -> Iterator[None]:
    """Any MLflow failure inside becomes one line naming the server (no credentials)."""
    try:
        yield
    except AmpbenchError:
        raise
    except Exception as error:
        raise AmpbenchError(
            f"MLflow at {safe_tracking_uri()}: {what} failed ({describe(error)})"
        ) from None


def log_named_artifacts(client: Any, run_id: str, artifacts: Mapping[str, Path]) -> None:
    """Log files under the given artifact names (KFP names its output files 'results',
    'report', ...; MLflow users should see results.json, report.md, ...)."""
    with tempfile.TemporaryDirectory() as staging:
        for name, path in artifacts.items():
            (Path(staging) / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, Path(staging) / name)
        client.log_artifacts(run_id, staging)
