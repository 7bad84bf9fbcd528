"""The train step as a KFP lightweight component: a thin wrapper over run_train_task."""

from kfp import dsl

from ampbench import DEFAULT_IMAGE
from ampbench.components.defaults import with_defaults
from ampbench.experiment import Resources, TrackingSettings, TrainingSettings, section_defaults
from ampbench.train.config import TrainConfig
from ampbench.train.trainjob import DEFAULT_TIMEOUT_S

# Component parameter -> its default, from the one place each is defined: the pipeline's
# training and tracking settings by their names, an arm's own settings from TrainConfig.
DEFAULTS = {
    **section_defaults(TrainingSettings),
    **section_defaults(TrackingSettings),
    "batch_size": TrainConfig.batch_size,
    "seed": TrainConfig.seed,
    "model_name": TrainConfig.model,
    "image_size": TrainConfig.image_size,
    "subset": TrainConfig.subset,
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
    trace: dsl.Output[dsl.Artifact],
    epochs: int,
    lr: float,
    target_accuracy: float,
    allow_emulated: bool,
    cuda_graphs: bool,
    grad_comm: str,
    compile: bool,
    deterministic: bool,
    label_smoothing: float,
    profile_steps: int,
    compile_cache: str,
    checkpoint_dir: str,
    checkpoint_every: int,
    experiment: str,
    tracking: bool,
    registered_model_name: str,
    batch_size: int,
    seed: int,
    model_name: str,
    image_size: int,
    subset: int,
    num_nodes: int,
    trainer_runtime: str,
    timeout_s: int,
    pipeline_run_id: str = "",
    requested_gpu_type: str = "",
    requested_gpu_count: int = 0,
    requested_cpu: str = "",
    requested_memory: str = "",
    trainjob_image: str = "",
    node_selector: dict = {},  # noqa: B006 - KFP takes a literal default
    config_map: str = "",
    s3_secret: str = "",
) -> None:
    """Train one precision arm; outputs the state dict, headline metrics, results JSON and
    the profile's Chrome trace (gzipped JSON for Perfetto; empty with profile_steps 0).

    requested_*: what the task asked Kubernetes for, recorded in the results beside the
    device that actually ran it (inside a pod only). With requested_gpu_count above 1 the
    training runs in that many processes (torchrun, one per GPU; gloo between CPU processes
    where there is no GPU). With num_nodes above 1 it runs on that many nodes of
    requested_gpu_count GPUs each, as a Kubeflow Trainer TrainJob of trainer_runtime on
    trainjob_image, with the task's node_selector, ConfigMap and Secret, and timeout_s as
    its deadline (the task's own timeout).
    """
    inputs = dict(locals())  # before any other name is bound here
    from pathlib import Path

    from ampbench.errors import reported_as_step
    from ampbench.train import train_step_name
    from ampbench.train.config import TrainConfig
    from ampbench.train.task import Placement, model_artifact_metadata, run_train_task
    from ampbench.train.tracker import TrackingOptions, summary

    with reported_as_step(train_step_name(precision)):
        # Each input named as a TrainConfig field is that setting (the checkpoint settings are
        # the task's request, which run_train_task settles).
        config = TrainConfig.from_inputs(inputs, Path(dataset.path), model=model_name)
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
            checkpoint_dir, checkpoint_every, pipeline_run_id, Path(trace.path),
        )  # fmt: skip
    for name, value in summary(outcome).items():
        metrics.log_metric(name, value)
    model.metadata.update(model_artifact_metadata(config))
