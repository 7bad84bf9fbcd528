"""Who hears of an arm's training: MLflow, or no one. run_training calls its Tracker at fixed
points, none inside the timed steps; the run's tags and metric names are the tracker's."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ampbench.matrix import group_label, run_name
from ampbench.results import RESULTS_FILE, ArmResults, EpochRecord, TrackingRecord, write_json
from ampbench.system_metrics import SystemMetrics
from ampbench.tracking import (
    DEFAULT_EXPERIMENT,
    PIPELINE_RUN_TAG,
    PRECISION_TAG,
    STATE_DICT_ARTIFACT,
    ArmRun,
    DatasetInput,
    LoggedModelSpec,
    preload,
    safe_tracking_uri,
)
from ampbench.train.profile import TRACE_FILE

if TYPE_CHECKING:
    from ampbench.train.loop import Trainer

# Per-epoch record field -> MLflow metric name. The names are the same in every arm's run so
# that MLflow's compare view lines them up.
EPOCH_METRICS = {
    "train_loss": "train_loss",
    "train_accuracy": "train_accuracy",
    "val_loss": "val_loss",
    "val_accuracy": "val_accuracy",
    "test_loss": "test_loss",
    "test_accuracy": "test_accuracy",
    "time_s": "epoch_time_s",
    "throughput_img_s": "epoch_throughput_img_s",
    "train_peak_memory_mb": "epoch_train_peak_memory_mb",
    "lr": "lr",
    "loss_scale": "loss_scale",
    "skipped_steps": "epoch_skipped_steps",
}


@dataclass(frozen=True)
class TrackingOptions:
    experiment: str = DEFAULT_EXPERIMENT
    pipeline_run_id: str = ""
    registered_model_name: str = ""


def summary(results: ArmResults) -> dict[str, float]:
    """The run's headline figures, as MLflow and KFP metrics."""
    timing, memory = results.timing, results.memory
    values: dict[str, float | None] = {
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
    energy = results.energy
    if energy is not None:
        values |= {
            "train_energy_j": energy.train_j,
            "end_to_end_energy_j": energy.end_to_end_j,
            "energy_j_per_image": energy.j_per_image,
        }
    return {key: float(value) for key, value in values.items() if value is not None}


class Tracker(Protocol):
    def start(self, trainer: Trainer) -> None:
        """Before the clock starts: the run, its tags and params."""

    def epoch(self, record: EpochRecord) -> None:
        """Between epochs: the epoch's figures."""

    def stop(self) -> None:
        """The training ended, well or not: nothing more is sampled."""

    def record(self, results: ArmResults) -> ArmResults:
        """The results, naming the run; the headline figures sent."""

    def finish(
        self, results: ArmResults, trainer: Trainer, outputs: tuple[Path, Path, Path | None]
    ) -> ArmResults:
        """After the outputs (results, weights) are written: they are logged with the run,
        which ends; the results as finally written."""


class NoTracker:
    def start(self, trainer: Trainer) -> None:
        pass

    def epoch(self, record: EpochRecord) -> None:
        pass

    def stop(self) -> None:
        pass

    def record(self, results: ArmResults) -> ArmResults:
        return results

    def finish(
        self, results: ArmResults, trainer: Trainer, outputs: tuple[Path, Path, Path | None]
    ) -> ArmResults:
        return results


class MlflowTracker:
    """The arm's MLflow run. MLflow is imported before the Trainer starts measuring memory."""

    def __init__(self, options: TrackingOptions) -> None:
        self.options = options
        self.run: ArmRun | None = None
        self.last_step = 0  # the headline figures' step: the epochs asked for
        preload()

    def start(self, trainer: Trainer) -> None:
        config, precision = trainer.config, trainer.precision
        self.last_step = config.epochs
        system_metrics = SystemMetrics()
        system_metrics.start()
        name = run_name(config.model, config.batch_size, precision.requested, config.seed)
        self.run = ArmRun(
            self.options.experiment, name, self.tags(trainer), self.params(trainer), system_metrics
        )

    def tags(self, trainer: Trainer) -> dict[str, str]:
        config, precision, device = trainer.config, trainer.precision, trainer.device_record
        tags = {
            PRECISION_TAG: precision.requested,
            "ampbench.resolved_precision": precision.name,
            "ampbench.autocast_dtype": precision.autocast_dtype_name or "none",
            "ampbench.emulated": str(precision.emulated).lower(),
            "ampbench.device": device.type,
            "ampbench.device_name": device.name,
            "ampbench.seed": str(config.seed),
            "ampbench.model": config.model,
            # What the MLflow compare view groups a matrix's runs by.
            "ampbench.batch_size": str(config.batch_size),
            "ampbench.world_size": str(trainer.world.size),
            "ampbench.group": group_label(config.model, config.batch_size),
        }
        if self.options.pipeline_run_id:
            tags[PIPELINE_RUN_TAG] = self.options.pipeline_run_id
        return tags

    @staticmethod
    def params(trainer: Trainer) -> dict[str, Any]:
        precision = trainer.precision
        return {
            **trainer.hyperparameters(),
            **{f"precision.{k}": v for k, v in dataclasses.asdict(precision.record()).items()},
            "dataset_source": trainer.metadata["source"]["spec"],
            "dataset_sha256": trainer.metadata["source"]["sha256"],
            **(
                {"dataset_cached_from": trainer.metadata["source"]["cached_from"]}
                if "cached_from" in trainer.metadata["source"]
                else {}
            ),
            # What was trained and tested on, whichever step took the subset.
            "train_images": len(trainer.train_data),
            **{f"{split}_images": len(data) for split, data in trainer.eval_data.items()},
            "device": trainer.device_record.type,
        }

    def epoch(self, record: EpochRecord) -> None:
        assert self.run is not None
        values = dataclasses.asdict(record)
        metrics = {name: values[key] for key, name in EPOCH_METRICS.items()}
        self.run.log_metrics(metrics, step=record.epoch)
        self.run.flush()

    def stop(self) -> None:
        if self.run is not None and self.run.system_metrics is not None:
            self.run.system_metrics.stop()  # finish() stops it too; this is for a failed run

    def record(self, results: ArmResults) -> ArmResults:
        assert self.run is not None
        mlflow = TrackingRecord(safe_tracking_uri(), self.run.experiment, self.run.run_id)
        return dataclasses.replace(results, mlflow=mlflow)

    def finish(
        self, results: ArmResults, trainer: Trainer, outputs: tuple[Path, Path, Path | None]
    ) -> ArmResults:
        # The weights are logged twice over: the state dict the step wrote, as it is, and the
        # model as a LoggedModel, with the run's headline metrics linked to it.
        assert self.run is not None and results.mlflow is not None
        results_path, model_path, trace_path = outputs
        artifacts = {RESULTS_FILE: results_path, STATE_DICT_ARTIFACT: model_path}
        if trace_path is not None and results.profile is not None and results.profile.trace:
            # Named for what it is (a KFP output is named `trace`): Perfetto opens it.
            artifacts[f"profile/{TRACE_FILE}"] = trace_path
        dataset = results.dataset
        splits = {"train": dataset.train_images, "test": dataset.test_images}
        model = LoggedModelSpec(
            module=trainer.model.to("cpu", memory_format=torch.contiguous_format).eval(),
            input_shape=tuple(trainer.train_data.image_shape),  # type: ignore[arg-type]
            classes=dataset.classes,
            metrics=summary(results),
            dataset=DatasetInput(
                name=f"{Path(dataset.source).name or dataset.source} ({dataset.sha256[:12]})",
                source=dataset.source,
                digest=dataset.sha256[:36],
                splits=splits,
            ),
            step=self.last_step,
            registered_model_name=self.options.registered_model_name or None,
        )
        run_id = self.run.finish(artifacts, model)
        results = dataclasses.replace(
            results, mlflow=dataclasses.replace(results.mlflow, run_id=run_id)
        )
        write_json(results_path, results)
        return results


def tracker_for(options: TrackingOptions | None, rank: int) -> Tracker:
    """MLflow where asked, on rank 0 only (under torchrun the others train untracked)."""
    if options is None or rank != 0:
        return NoTracker()
    return MlflowTracker(options)
