"""One arm as a pipeline's train task runs it: in this process, in one process per GPU
(torchrun), or on several nodes through a Kubeflow Trainer TrainJob."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ampbench import storage
from ampbench.cluster import (
    CHECKPOINT_URI_ENV,
    CONFIG_MAP_KEYS,
    SECRET_KEYS,
    check_tracking_server,
    default_checkpoint_dir,
    in_pod,
)
from ampbench.errors import AmpbenchError
from ampbench.logs import log, setup_logging
from ampbench.matrix import run_name
from ampbench.results import ArmResults
from ampbench.train.config import TrainConfig, processes_per_arm, with_batch_for_data
from ampbench.train.launch import train_in_processes, train_on_nodes, trainjob_name
from ampbench.train.step import requested_resources_in_pod, run_training
from ampbench.train.tracker import TrackingOptions
from ampbench.train.trainjob import DEFAULT_RUNTIME, DEFAULT_TIMEOUT_S, TrainJobSpec

COMPILE_CACHE_DIR = "compile-cache"  # under a task's checkpoint location


@dataclass(frozen=True)
class Placement:
    """What a train task asked Kubernetes for, and how many nodes its arm spans."""

    gpu_type: str = ""
    gpu_count: int = 0
    cpu: str = ""
    memory: str = ""
    num_nodes: int = 1
    trainer_runtime: str = DEFAULT_RUNTIME
    trainjob_image: str = ""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    config_map: str = ""
    s3_secret: str = ""
    # The task's own limit, which a TrainJob it creates is given as its deadline too.
    timeout_s: int = DEFAULT_TIMEOUT_S


def run_train_task(
    config: TrainConfig,
    results_path: Path,
    model_path: Path,
    tracking: TrackingOptions | None,
    placement: Placement,
    checkpoint_dir: str = "",
    checkpoint_every: int = 0,
    pipeline_run_id: str = "",
    trace_path: Path | None = None,
) -> ArmResults:
    """Train the arm `config` describes where `placement` says; write its results and weights.

    With a checkpoint directory (the parameter, or in a pod the ConfigMap's), a retried task
    (a preempted node) resumes from its newest checkpoint, which it writes every
    checkpoint_every steps (0: at epoch ends); a first attempt starts fresh. A compiled arm
    shares its compiled step in config.compile_cache, or else beside the checkpoints ("off":
    nowhere).
    """
    setup_logging()  # a malformed $RANK is one line too
    if tracking is not None:
        check_tracking_server()
    checkpoint_dir = checkpoint_dir or default_checkpoint_dir()
    if in_pod() and not checkpoint_dir:
        log.warning(
            "no checkpoint location (the checkpoint_dir parameter, or %s in the "
            "ConfigMap): if this task is retried, it trains again from scratch",
            CHECKPOINT_URI_ENV,
        )
    config = with_batch_for_data(
        config, processes_per_arm(placement.gpu_count, placement.num_nodes)
    )
    name = run_name(config.model, config.batch_size, config.precision, config.seed)
    run_dir = storage.join(checkpoint_dir, pipeline_run_id, name) if checkpoint_dir else ""
    # Beside the checkpoints, a compiled step is shared across seeds and pipeline runs.
    beside_checkpoints = storage.join(checkpoint_dir, COMPILE_CACHE_DIR) if checkpoint_dir else None
    config = dataclasses.replace(
        config,
        checkpoint_dir=run_dir or None,
        checkpoint_every=checkpoint_every if checkpoint_dir else 0,
        resume=bool(checkpoint_dir),
        compile_cache=(config.compile_cache or beside_checkpoints) if config.compile else None,
    )
    requested = requested_resources_in_pod(
        placement.gpu_type, placement.gpu_count, placement.cpu, placement.memory
    )
    if placement.num_nodes > 1:
        if in_pod() and run_dir and not storage.is_s3(run_dir):
            raise AmpbenchError(
                f"num_nodes {placement.num_nodes}: checkpoint_dir {checkpoint_dir} is not on "
                "S3; the nodes of a TrainJob mount nothing of this pod's, so only an s3:// "
                "location reaches them"
            )
        job = trainjob_spec(placement, trainjob_name(pipeline_run_id, name))
        return train_on_nodes(
            config, job, run_dir, results_path, model_path, tracking, requested,
            trace_path=trace_path,
        )  # fmt: skip
    if placement.gpu_count > 1:
        return train_in_processes(
            config, placement.gpu_count, results_path, model_path, tracking, requested,
            trace_path=trace_path,
        )  # fmt: skip
    return run_training(
        config, results_path, model_path, tracking, requested_resources=requested,
        trace_path=trace_path,
    )  # fmt: skip


def model_artifact_metadata(config: TrainConfig) -> dict[str, str]:
    """What the train step's model artifact says of itself; `run` names the file `ampbench
    run` copies it to (pipelines/local.py)."""
    return {
        "framework": "pytorch",
        "format": "state_dict",
        "model": config.model,
        "run": run_name(config.model, config.batch_size, config.precision, config.seed),
    }


def trainjob_spec(placement: Placement, name: str) -> TrainJobSpec:
    """The TrainJob of a task's arm: `placement.num_nodes` nodes like the task's own pod."""
    return TrainJobSpec(
        name=name,
        namespace="",  # the pod's own
        image=placement.trainjob_image,
        arguments=[],  # train_on_nodes adds the worker's
        num_nodes=placement.num_nodes,
        gpus_per_node=placement.gpu_count,
        gpu_resource=placement.gpu_type,
        cpu=placement.cpu,
        memory=placement.memory,
        runtime=placement.trainer_runtime,
        config_map=placement.config_map,
        config_map_keys=CONFIG_MAP_KEYS,
        secret=placement.s3_secret,
        secret_keys=SECRET_KEYS,
        node_selector=dict(placement.node_selector),
        active_deadline_s=placement.timeout_s,
    )
