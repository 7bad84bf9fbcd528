"""The train step as a plain function: train one arm, write its outputs, track it in MLflow."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from ampbench.cluster import in_pod
from ampbench.matrix import group_label, run_name
from ampbench.results import ArmResults, EpochRecord, RequestedResources, TrackingRecord, write_json
from ampbench.tracking import (
    DEFAULT_EXPERIMENT,
    PIPELINE_RUN_TAG,
    PRECISION_TAG,
    RESULTS_FILE,
    STATE_DICT_ARTIFACT,
    ArmRun,
    SystemMetrics,
    preload,
    safe_tracking_uri,
)
from ampbench.train.config import TrainConfig
from ampbench.train.loop import Trainer
from ampbench.train.models import example_input
from ampbench.world import world_from_env

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
    return {key: float(value) for key, value in values.items() if value is not None}


def requested_resources_in_pod(
    gpu_type: str, gpu_count: int, cpu: str, memory: str
) -> RequestedResources | None:
    """What a pipeline task asked Kubernetes for, recorded only where Kubernetes ran it (the
    local runner ignores resource requests: recording them would claim what did not happen)."""
    if not in_pod():
        return None
    return RequestedResources(gpu_type, gpu_count, cpu, memory)


def run_training(
    config: TrainConfig,
    results_path: Path,
    model_path: Path,
    tracking: TrackingOptions | None = None,
    requested_resources: RequestedResources | None = None,
) -> ArmResults:
    """Train one arm; write results JSON and the state dict; log the run to MLflow.

    The MLflow run is created, with its params, before the clock starts, and metrics are sent
    between epochs: nothing of MLflow's runs while training steps are timed. Under torchrun
    every rank trains and rank 0 alone tracks and writes; the others return the same results.
    """
    if world_from_env().rank != 0:
        tracking = None
    if tracking is not None:
        preload()  # before the Trainer starts measuring memory
    trainer = Trainer(config)
    arm_run = None
    if tracking is not None:
        precision = trainer.precision
        device = trainer.device_record
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
        if tracking.pipeline_run_id:
            tags[PIPELINE_RUN_TAG] = tracking.pipeline_run_id
        params = {
            **trainer.hyperparameters(),
            **{f"precision.{k}": v for k, v in dataclasses.asdict(precision.record()).items()},
            "dataset_source": trainer.metadata["source"]["spec"],
            "dataset_sha256": trainer.metadata["source"]["sha256"],
            # What was trained and tested on, whichever step took the subset (`subset` is 0
            # when the prepare step did).
            "train_images": len(trainer.train_data),
            **{f"{split}_images": len(data) for split, data in trainer.eval_data.items()},
            "device": device.type,
        }
        system_metrics = SystemMetrics()
        system_metrics.start()
        arm_run = ArmRun(
            tracking.experiment,
            run_name(config.model, config.batch_size, precision.requested, config.seed),
            tags,
            params,
            system_metrics,
        )

        def send_epoch(record: EpochRecord) -> None:
            values = dataclasses.asdict(record)
            arm_run.log_metrics(
                {name: values[key] for key, name in EPOCH_METRICS.items()}, step=record.epoch
            )
            arm_run.flush()

        trainer.on_epoch = send_epoch
    try:
        results = trainer.run()
    finally:
        if arm_run is not None and arm_run.system_metrics is not None:
            arm_run.system_metrics.stop()  # finish() stops it too; this is for a failed run
    if requested_resources is not None:
        results = dataclasses.replace(results, requested_resources=requested_resources)
    if not trainer.world.main:
        return results
    if arm_run is not None:
        results = dataclasses.replace(
            results, mlflow=TrackingRecord(safe_tracking_uri(), arm_run.experiment, arm_run.run_id)
        )
        arm_run.log_metrics(summary(results), step=config.epochs)
    write_json(results_path, results)
    model_path.parent.mkdir(parents=True, exist_ok=True)
    # On the host: the file then loads on a machine without the GPU it was trained on.
    torch.save({k: v.cpu() for k, v in trainer.model.state_dict().items()}, model_path)
    if arm_run is not None:
        # After the outputs are written: if MLflow is down for good, nothing is lost. The
        # weights are the file just written; only a model to register is exported as an MLflow
        # model (torch.export and MLflow's checks of it: seconds per task).
        model = example = None
        if tracking.registered_model_name:
            model = trainer.model.to("cpu", memory_format=torch.contiguous_format).eval()
            example = example_input(trainer.train_data.image_shape).numpy()
        run_id = arm_run.finish(
            {RESULTS_FILE: results_path, STATE_DICT_ARTIFACT: model_path},
            model,
            example,
            tracking.registered_model_name or None,
        )
        assert results.mlflow is not None
        results = dataclasses.replace(
            results, mlflow=dataclasses.replace(results.mlflow, run_id=run_id)
        )
        write_json(results_path, results)
    return results
