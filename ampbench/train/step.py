"""The train step as a plain function: train one arm, write its outputs, track it in MLflow."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from ampbench.cluster import in_pod
from ampbench.results import ArmResults, RequestedResources, write_json
from ampbench.train.config import TrainConfig
from ampbench.train.loop import Trainer
from ampbench.train.tracker import TrackingOptions, tracker_for
from ampbench.world import world_from_env


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
    trace_path: Path | None = None,
) -> ArmResults:
    """Train one arm; write results JSON, the state dict and (where it profiles) the Chrome
    trace at `trace_path`; log the run to MLflow.

    The MLflow run is created, with its params, before the clock starts, and metrics are sent
    between epochs: nothing of MLflow's runs while training steps are timed. Under torchrun
    every rank trains and rank 0 alone tracks and writes; the others return the same results.
    """
    tracker = tracker_for(tracking, world_from_env().rank)
    trainer = Trainer(config)
    trainer.trace_path = trace_path if trainer.world.main else None
    tracker.start(trainer)
    trainer.on_epoch = tracker.epoch
    try:
        results = trainer.run()
    finally:
        tracker.stop()
    if requested_resources is not None:
        results = dataclasses.replace(results, requested_resources=requested_resources)
    if not trainer.world.main:
        return results
    results = tracker.record(results)
    write_json(results_path, results)
    model_path.parent.mkdir(parents=True, exist_ok=True)
    # On the host: the file then loads on a machine without the GPU it was trained on.
    torch.save({k: v.cpu() for k, v in trainer.model.state_dict().items()}, model_path)
    # After the outputs are written: if MLflow is down for good, nothing is lost.
    return tracker.finish(results, trainer, (results_path, model_path, trace_path))
