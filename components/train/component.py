"""The train step as a KFP lightweight component: a thin wrapper over run_training."""

from kfp import dsl

from ampbench import DEFAULT_IMAGE
from ampbench.components.defaults import with_defaults
from ampbench.tracking import DEFAULT_EXPERIMENT
from ampbench.train.config import TrainConfig

# Component parameter -> its default, from the one place each is defined.
DEFAULTS = {
    "epochs": TrainConfig.epochs,
    "batch_size": TrainConfig.batch_size,
    "lr": TrainConfig.lr,
    "seed": TrainConfig.seed,
    "model_name": TrainConfig.model,
    "image_size": TrainConfig.image_size,
    "target_accuracy": TrainConfig.target_accuracy,
    "label_smoothing": TrainConfig.label_smoothing,
    "compile_model": TrainConfig.compile,
    "deterministic": TrainConfig.deterministic,
    "subset": TrainConfig.subset,
    "checkpoint_every": TrainConfig.checkpoint_every,
    "allow_emulated": TrainConfig.allow_emulated,
    "cuda_graphs": TrainConfig.cuda_graphs,
    "grad_comm": TrainConfig.grad_comm,
    "experiment": DEFAULT_EXPERIMENT,
}


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
@with_defaults(DEFAULTS)
def train(
    dataset: dsl.Input[dsl.Dataset],
    precision: str,
    model: dsl.Output[dsl.Model],
    metrics: dsl.Output[dsl.Metrics],
    results: dsl.Output[dsl.Artifact],
    epochs: int,
    batch_size: int,
    lr: float,
    seed: int,
    model_name: str,
    image_size: int,
    target_accuracy: float,
    label_smoothing: float,
    compile_model: bool,
    deterministic: bool,
    subset: int,
    checkpoint_every: int,
    allow_emulated: bool,
    cuda_graphs: bool,
    grad_comm: str,
    experiment: str,
    checkpoint_dir: str = "",
    pipeline_run_id: str = "",
    registered_model_name: str = "",
    tracking: bool = True,
    requested_gpu_type: str = "",
    requested_gpu_count: int = 0,
    requested_cpu: str = "",
    requested_memory: str = "",
    num_nodes: int = 1,
    trainer_runtime: str = "torch-distributed",
    trainjob_image: str = "",
    node_selector: dict = {},  # noqa: B006 - KFP takes a literal default
    config_map: str = "",
    s3_secret: str = "",
) -> None:
    """Train one precision arm; outputs the state dict, headline metrics and results JSON.

    requested_*: what the task asked Kubernetes for, recorded in the results beside the
    device that actually ran it (inside a pod only). With requested_gpu_count above 1 the
    training runs in that many processes (torchrun, one per GPU; gloo between CPU processes
    where there is no GPU). With num_nodes above 1 it runs on that many nodes of
    requested_gpu_count GPUs each, as a Kubeflow Trainer TrainJob of trainer_runtime on
    trainjob_image, with the task's node_selector, ConfigMap and Secret.
    """
    from pathlib import Path

    from ampbench.cluster import (
        CHECKPOINT_URI_ENV,
        CONFIG_MAP_KEYS,
        SECRET_KEYS,
        check_tracking_server,
        default_checkpoint_dir,
        in_pod,
    )
    from ampbench.errors import AmpbenchError, reported_as_step
    from ampbench.logs import log, setup_logging
    from ampbench.matrix import run_name
    from ampbench.train.config import TrainConfig
    from ampbench.train.launch import (
        train_in_processes,
        train_on_nodes,
        trainjob_name,
    )
    from ampbench.train.step import (
        TrackingOptions,
        requested_resources_in_pod,
        run_training,
        summary,
    )
    from ampbench.train.trainjob import TrainJobSpec

    with reported_as_step(f"train-{precision}"):
        setup_logging()  # a malformed $RANK is one line too
        if tracking:
            check_tracking_server()
        # With a checkpoint directory, a retried task (preempted node) resumes from its
        # newest checkpoint; the first attempt finds none and starts fresh. In a pod, the
        # ConfigMap's location is the default.
        checkpoint_dir = checkpoint_dir or default_checkpoint_dir()
        if in_pod() and not checkpoint_dir:
            log.warning(
                "no checkpoint location (the checkpoint_dir parameter, or %s in the "
                "ConfigMap): if this task is retried, it trains again from scratch",
                CHECKPOINT_URI_ENV,
            )
        name = run_name(model_name, batch_size, precision, seed)
        run_dir = f"{checkpoint_dir.rstrip('/')}/{pipeline_run_id}/{name}"
        config = TrainConfig(
            dataset_dir=Path(dataset.path),
            precision=precision,
            epochs=epochs,
            batch_size=batch_size,
            lr=lr,
            seed=seed,
            model=model_name,
            image_size=image_size,
            target_accuracy=target_accuracy,
            label_smoothing=label_smoothing,
            compile=compile_model,
            deterministic=deterministic,
            subset=subset,
            checkpoint_dir=run_dir if checkpoint_dir else None,
            checkpoint_every=checkpoint_every if checkpoint_dir else 0,
            resume=bool(checkpoint_dir),
            allow_emulated=allow_emulated,
            cuda_graphs=cuda_graphs,
            grad_comm=grad_comm,
        )
        outputs = (Path(results.path), Path(model.path))
        tracked = (
            TrackingOptions(experiment, pipeline_run_id, registered_model_name)
            if tracking
            else None
        )
        requested = requested_resources_in_pod(
            requested_gpu_type, requested_gpu_count, requested_cpu, requested_memory
        )
        if num_nodes > 1:
            job = TrainJobSpec(
                name=trainjob_name(pipeline_run_id, name),
                namespace="",  # the pod's own
                image=trainjob_image,
                arguments=[],
                num_nodes=num_nodes,
                gpus_per_node=requested_gpu_count,
                gpu_resource=requested_gpu_type,
                cpu=requested_cpu,
                memory=requested_memory,
                runtime=trainer_runtime,
                config_map=config_map,
                config_map_keys=CONFIG_MAP_KEYS,
                secret=s3_secret,
                secret_keys=SECRET_KEYS,
                node_selector=dict(node_selector),
            )
            shared = run_dir if checkpoint_dir else ""
            if in_pod() and shared and not shared.startswith("s3://"):
                raise AmpbenchError(
                    f"num_nodes {num_nodes}: checkpoint_dir {checkpoint_dir} is not on S3; the "
                    "nodes of a TrainJob mount nothing of this pod's, so only an s3:// "
                    "location reaches them"
                )
            outcome = train_on_nodes(config, job, shared, *outputs, tracked, requested)
        elif requested_gpu_count > 1:
            outcome = train_in_processes(config, requested_gpu_count, *outputs, tracked, requested)
        else:
            outcome = run_training(config, *outputs, tracked, requested_resources=requested)
    for name, value in summary(outcome).items():
        metrics.log_metric(name, value)
    model.metadata.update({"framework": "pytorch", "format": "state_dict", "model": model_name})
