"""The prepare step as a KFP lightweight component: a thin wrapper over run_prepare_task."""

from kfp import dsl

from ampbench import DEFAULT_IMAGE
from ampbench.components.defaults import with_defaults
from ampbench.data.dataset import DEFAULT_VAL_FRACTION
from ampbench.data.sources import SourceOptions
from ampbench.experiment import (
    ArmSettings,
    DataSettings,
    Resources,
    TrainingSettings,
    section_defaults,
)

# Component parameter -> its default, from the one place each is defined: the pipeline's
# training settings by their names.
DEFAULTS = {
    **section_defaults(TrainingSettings),
    "subset": DataSettings.subset,
    "test_fraction": SourceOptions.test_fraction,
    "val_fraction": DEFAULT_VAL_FRACTION,
    "seed": SourceOptions.seed,
    "skip_bad_images": SourceOptions.skip_bad_images,
    "baseline_precision": ArmSettings.baseline_precision,
    "train_image_size": DataSettings.image_size,
    "gpu_count": Resources.gpu_count,
    "num_nodes": Resources.num_nodes,
}


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
@with_defaults(DEFAULTS)
def prepare(
    data: str,
    dataset: dsl.Output[dsl.Dataset],
    subset: int,
    test_fraction: float,
    seed: int,
    skip_bad_images: bool,
    baseline_precision: str,
    train_image_size: int,
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
    gpu_count: int,
    num_nodes: int,
    val_fraction: float,
    image_size: int = 0,
    max_extract_bytes: int = 0,
    max_members: int = 0,
    max_image_pixels: int = 0,
    max_decoded_bytes: int = 0,
    runs: list = [],  # noqa: B006 - KFP takes list defaults this way
    tracking: bool = False,
) -> None:
    """Prepare a data source (synthetic, cifar10/100, path, s3:// URI) as Parquet shards.

    max_extract_bytes, max_members, max_image_pixels, max_decoded_bytes: 0 keeps ampbench's
    limits (ampbench/data/limits.py).
    runs, baseline_precision, train_image_size (the pipeline's image_size), the training
    settings (epochs to checkpoint_every), gpu_count, num_nodes: the pipeline's experiment
    matrix and training settings, checked here, once, and against the prepared data, rather
    than in the training tasks, which are retried on failure (no runs: not checked). A
    training task runs gpu_count x num_nodes processes (at least 1 each), each with the arm's
    batch size.
    tracking: the pipeline's tracking setting; in a pod, this first step fails at once when it
    is on and no tracking server is configured.
    """
    inputs = dict(locals())  # before any other name is bound here
    from pathlib import Path

    from ampbench.data import SourceOptions
    from ampbench.data.limits import Limits
    from ampbench.data.task import dataset_artifact_metadata, run_prepare_task
    from ampbench.errors import reported_as_step
    from ampbench.experiment import Experiment

    with reported_as_step("prepare"):
        options = SourceOptions(
            image_size=image_size or None,
            test_fraction=test_fraction,
            seed=seed,
            skip_bad_images=skip_bad_images,
            limits=Limits.with_overrides(
                max_extract_bytes, max_members, max_image_pixels, max_decoded_bytes
            ),
        )
        # Each input named as a leaf of the experiment is that leaf; image_size is this
        # step's own resize, the experiment's is train_image_size.
        experiment = Experiment.from_inputs(inputs, image_size=train_image_size)
        metadata = run_prepare_task(
            data, Path(dataset.path), options, experiment, val_fraction=val_fraction
        )
    dataset.metadata.update(dataset_artifact_metadata(metadata))
