"""The train step as a KFP lightweight component: a thin wrapper over run_train_task."""

from kfp import dsl

from ampbench import DEFAULT_IMAGE
from ampbench.components.defaults import with_defaults
from ampbench.experiment import Resources, TrackingSettings
from ampbench.train.config import TrainConfig
from ampbench.train.trainjob import DEFAULT_TIMEOUT_S

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
    "experiment": TrackingSettings.experiment,
    "tracking": TrackingSettings.tracking,
    "num_nodes": Resources.num_nodes,
    "trainer_runtime": Resources.trainer_runtime,
    "timeout_s": DEFAULT_TIMEOUT_S,
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
    tracking: bool,
    num_nodes: int,
    trainer_runtime: str,
    timeout_s: int,
    checkpoint_dir: str = "",
    pipeline_run_id: str = "",
    registered_model_name: str = "",
    requested_gpu_type: str = "",
    requested_gpu_count: int = 0,
    requested_cpu: str = "",
    requested_memory: str = "",
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
    trainjob_image, with the task's node_selector, ConfigMap and Secret, and timeout_s as
    its deadline (the task's own timeout).
    """
    from pathlib import Path

    from ampbench.errors import reported_as_step
    from ampbench.train import train_step_name
    from ampbench.train.config import TrainConfig
    from ampbench.train.task import Placement, run_train_task
    from ampbench.train.tracker import TrackingOptions, summary

    with reported_as_step(train_step_name(precision)):
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
            allow_emulated=allow_emulated,
            cuda_graphs=cuda_graphs,
            grad_comm=grad_comm,
        )
        placement = Placement(
            requested_gpu_type, requested_gpu_count, requested_cpu, requested_memory,
            num_nodes, trainer_runtime, trainjob_image, node_selector, config_map, s3_secret,
            timeout_s,
        )  # fmt: skip
        tracked = (
            TrackingOptions(experiment, pipeline_run_id, registered_model_name)
            if tracking
            else None
        )
        outcome = run_train_task(
            config, Path(results.path), Path(model.path), tracked, placement,
            checkpoint_dir, checkpoint_every, pipeline_run_id,
        )  # fmt: skip
    for name, value in summary(outcome).items():
        metrics.log_metric(name, value)
    model.metadata.update({"framework": "pytorch", "format": "state_dict", "model": model_name})
