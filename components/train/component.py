"""The train step as a KFP lightweight component: a thin wrapper over run_training."""

from kfp import dsl

from ampbench import DEFAULT_IMAGE


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def train(
    dataset: dsl.Input[dsl.Dataset],
    precision: str,
    model: dsl.Output[dsl.Model],
    metrics: dsl.Output[dsl.Metrics],
    results: dsl.Output[dsl.Artifact],
    epochs: int = 2,
    batch_size: int = 128,
    lr: float = 0.1,
    seed: int = 0,
    model_name: str = "resnet18",
    label_smoothing: float = 0.0,
    compile_model: bool = False,
    deterministic: bool = False,
    subset: int = 0,
    checkpoint_dir: str = "",
    checkpoint_every: int = 0,
    experiment: str = "ampbench",
    pipeline_run_id: str = "",
    registered_model_name: str = "",
    tracking: bool = True,
    requested_gpu_type: str = "",
    requested_gpu_count: int = 0,
    requested_cpu: str = "",
    requested_memory: str = "",
) -> None:
    """Train one precision arm; outputs the state dict, headline metrics and results JSON.

    requested_*: what the task asked Kubernetes for, recorded in the results beside the
    device that actually ran it.
    """
    from pathlib import Path

    from ampbench.components.train.config import TrainConfig
    from ampbench.components.train.step import TrackingOptions, run_training, summary
    from ampbench.errors import reported_as_step
    from ampbench.logs import setup_logging

    setup_logging()
    with reported_as_step(f"train-{precision}"):
        # With a checkpoint directory, a retried task (preempted node) resumes from its
        # newest checkpoint; the first attempt finds none and starts fresh.
        run_dir = f"{checkpoint_dir.rstrip('/')}/{pipeline_run_id}/{precision}-seed{seed}"
        outcome = run_training(
            TrainConfig(
                dataset_dir=Path(dataset.path),
                precision=precision,
                epochs=epochs,
                batch_size=batch_size,
                lr=lr,
                seed=seed,
                model=model_name,
                label_smoothing=label_smoothing,
                compile=compile_model,
                deterministic=deterministic,
                subset=subset,
                checkpoint_dir=run_dir if checkpoint_dir else None,
                checkpoint_every=checkpoint_every if checkpoint_dir else 0,
                resume=bool(checkpoint_dir),
            ),
            Path(results.path),
            Path(model.path),
            TrackingOptions(experiment, pipeline_run_id, registered_model_name)
            if tracking
            else None,
            requested_resources={
                "gpu_type": requested_gpu_type,
                "gpu_count": requested_gpu_count,
                "cpu": requested_cpu,
                "memory": requested_memory,
            },
        )
    for name, value in summary(outcome).items():
        metrics.log_metric(name, value)
    model.metadata.update({"framework": "pytorch", "format": "state_dict", "model": model_name})
