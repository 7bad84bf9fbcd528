"""The train step as a plain function: train one arm, write its outputs, track it in MLflow."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ampbench.components.train.config import TrainConfig
from ampbench.components.train.engine import Trainer, device_name
from ampbench.components.train.models import example_input
from ampbench.tracking import (
    DEFAULT_EXPERIMENT,
    PIPELINE_RUN_TAG,
    PRECISION_TAG,
    RESULTS_ARTIFACT,
    ArmRun,
    preload,
    safe_tracking_uri,
)

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
    "peak_memory_mb": "epoch_peak_memory_mb",
    "peak_memory_reserved_mb": "epoch_peak_memory_reserved_mb",
    "lr": "lr",
    "loss_scale": "loss_scale",
    "skipped_steps": "epoch_skipped_steps",
}
SUMMARY_METRICS = (
    "accuracy",
    "peak_memory_mb",
    "train_time_s",
    "throughput_img_s",
    "eval_time_s",
    "compile_time_s",
    "skipped_steps",
)


@dataclass(frozen=True)
class TrackingOptions:
    experiment: str = DEFAULT_EXPERIMENT
    pipeline_run_id: str = ""
    registered_model_name: str = ""


def summary(results: dict[str, Any]) -> dict[str, float]:
    return {key: results[key] for key in SUMMARY_METRICS if results.get(key) is not None}


def run_training(
    config: TrainConfig,
    results_path: Path,
    model_path: Path,
    tracking: TrackingOptions | None = None,
    requested_resources: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train one arm; write results JSON and the state dict; log the run to MLflow."""
    if tracking is not None:
        preload()  # before the Trainer starts measuring memory
    trainer = Trainer(config)
    arm_run = None
    if tracking is not None:
        precision = trainer.precision
        run_name = f"{precision.requested}-seed{config.seed}"
        tags = {
            PRECISION_TAG: precision.requested,
            "ampbench.resolved_precision": precision.name,
            "ampbench.autocast_dtype": precision.autocast_dtype_name or "none",
            "ampbench.device": trainer.device.type,
            "ampbench.device_name": device_name(trainer.device),
            "ampbench.seed": str(config.seed),
            "ampbench.model": config.model,
        }
        if tracking.pipeline_run_id:
            tags[PIPELINE_RUN_TAG] = tracking.pipeline_run_id
        params = {
            **config.hyperparameters(),
            **precision.describe(),
            "dataset_source": trainer.metadata["source"]["spec"],
            "dataset_sha256": trainer.metadata["source"]["sha256"],
            "device": trainer.device.type,
        }
        arm_run = ArmRun(tracking.experiment, run_name, tags, params)
        trainer.on_epoch = lambda record: arm_run.log_metrics(
            {name: record.get(key) for key, name in EPOCH_METRICS.items()}, step=record["epoch"]
        )
    results = trainer.run()
    if requested_resources is not None:
        results["requested_resources"] = requested_resources
    if arm_run is not None:
        results["mlflow"] = {
            "tracking_uri": safe_tracking_uri(),
            "experiment": arm_run.experiment,
            "run_id": arm_run.run_id,
        }
        arm_run.log_metrics(summary(results), step=config.epochs)
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(results, indent=2) + "\n")
    model_path.parent.mkdir(parents=True, exist_ok=True)
    # On the host: the file then loads on a machine without the GPU it was trained on.
    torch.save({k: v.cpu() for k, v in trainer.model.state_dict().items()}, model_path)
    if arm_run is not None:
        # After the outputs are written: if MLflow is down for good, nothing is lost.
        model = trainer.model.to("cpu", memory_format=torch.contiguous_format).eval()
        example = example_input(tuple(trainer.metadata["image_shape"])).numpy()
        run_id = arm_run.finish(
            {RESULTS_ARTIFACT: results_path}, model, example, tracking.registered_model_name or None
        )
        results["mlflow"]["run_id"] = run_id
        results_path.write_text(json.dumps(results, indent=2) + "\n")
    return results
