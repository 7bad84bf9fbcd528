"""An experiment's configuration, defined once: what a pipeline run trains, measures, tracks and
asks the cluster for. Each leaf is a pipeline parameter of its name, type (its default's) and
description, and a command-line option of them: the pipeline's signature, `ampbench submit`'s
and `ampbench run`'s options, the arguments `run` passes, and preflight all read this tree.
Free of KFP and torch."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import Field, dataclass, field, fields
from typing import Any

from ampbench.argtypes import accuracy_drop, json_list, json_object, non_negative_number, one_of
from ampbench.cluster import CONFIG_MAP, GPU_RESOURCE, SECRET, TRAIN_CPU, TRAIN_MEMORY
from ampbench.errors import AmpbenchError
from ampbench.matrix import DEFAULT_RUNS
from ampbench.settings import Setting, described, same_as, setting
from ampbench.tracking import DEFAULT_EXPERIMENT
from ampbench.train import BASELINE_PRECISION, DATA_FORMS, DEFAULT_DATA, PRECISIONS
from ampbench.train.config import TrainConfig, processes_per_arm
from ampbench.train.trainjob import DEFAULT_RUNTIME


@dataclass(frozen=True)
class DataSettings:
    data: str = setting(DEFAULT_DATA, DATA_FORMS)
    subset: int = same_as(TrainConfig, "subset")
    image_size: int = same_as(TrainConfig, "image_size")


@dataclass(frozen=True)
class ArmSettings:
    runs: list = setting(
        DEFAULT_RUNS,
        'the experiment matrix: [{"model", "batch_size", "precision", "seed"}, ...], one '
        "training task each (`ampbench submit --models --batch-sizes --precisions --seeds` "
        "makes it); every (model, batch size) group needs a baseline_precision run",
        parse=json_list,
    )
    baseline_precision: str = setting(
        BASELINE_PRECISION, "the precision every arm is compared with", parse=one_of(PRECISIONS)
    )


@dataclass(frozen=True)
class TrainingSettings:
    epochs: int = same_as(TrainConfig, "epochs")
    lr: float = same_as(TrainConfig, "lr")
    target_accuracy: float = same_as(TrainConfig, "target_accuracy")
    allow_emulated: bool = same_as(TrainConfig, "allow_emulated")
    cuda_graphs: bool = same_as(TrainConfig, "cuda_graphs")
    grad_comm: str = same_as(TrainConfig, "grad_comm")
    compile: bool = same_as(TrainConfig, "compile")
    deterministic: bool = same_as(TrainConfig, "deterministic")
    label_smoothing: float = same_as(TrainConfig, "label_smoothing")
    profile_steps: int = same_as(TrainConfig, "profile_steps")
    # A pipeline's tasks share it beside their checkpoints where none is given (run_train_task).
    compile_cache: str = same_as(TrainConfig, "compile_cache", default="")
    # A pipeline's tasks checkpoint periodically where a directory is given; a bare
    # `ampbench train` only when asked.
    checkpoint_dir: str = same_as(TrainConfig, "checkpoint_dir", default="")
    checkpoint_every: int = same_as(TrainConfig, "checkpoint_every", default=200)


@dataclass(frozen=True)
class TrackingSettings:
    experiment: str = setting(DEFAULT_EXPERIMENT, "the MLflow experiment")
    tracking: bool = setting(True, "log the runs to MLflow")
    registered_model_name: str = setting(
        "", "register the models in MLflow under this name", flag="register-model"
    )


@dataclass(frozen=True)
class ComparisonSettings:
    allow_mismatch: bool = setting(
        False,
        "compare arms that differ in more than precision (GPU model, versions, settings) "
        "instead of refusing; the report then carries a warning",
    )
    max_accuracy_drop: float = setting(
        -1.0,
        "fail when an arm loses more than this many percentage points of accuracy (-1: off)",
        parse=accuracy_drop,
    )
    gpu_hour_price: float = setting(
        0.0,
        "price of one device (a GPU, or the CPU machine) for an hour, for each arm's cost and "
        "what it saves (0: no price, no cost figures)",
        parse=non_negative_number,
    )
    energy_price: float = setting(
        0.0,
        "price of a kWh of the energy measured, for the cost figures (0: no price)",
        parse=non_negative_number,
    )


@dataclass(frozen=True)
class Resources:
    gpu_resource: str = setting(GPU_RESOURCE, "the GPU's extended resource name")
    gpu_count: int = setting(
        1, "GPUs per training task (more than 1: torchrun, one process per GPU)"
    )
    num_nodes: int = setting(
        1,
        "nodes per training task (more than 1: a Kubeflow Trainer TrainJob of trainer_runtime, "
        "each node gpu_count GPUs; needs checkpoint_dir, or the ConfigMap's, on S3)",
    )
    trainer_runtime: str = setting(DEFAULT_RUNTIME, "the Kubeflow Trainer runtime of a TrainJob")
    gpu_node_selector: dict = setting(
        {},
        'node labels for training tasks, e.g. {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}',
        parse=json_object,
    )
    train_cpu: str = setting(TRAIN_CPU, "CPU request and limit of a training task")
    train_memory: str = setting(TRAIN_MEMORY, "memory request and limit of a training task")
    prepare_cpu: str = setting("2", "CPU request and limit of the prepare step")
    prepare_memory: str = setting("8Gi", "memory request and limit of the prepare step")
    config_map: str = setting(CONFIG_MAP, "the ConfigMap the pods read endpoints from")
    s3_secret: str = setting(SECRET, "the Secret the pods read S3 keys from")


@dataclass(frozen=True)
class Experiment:
    dataset: DataSettings = field(default_factory=DataSettings)
    arms: ArmSettings = field(default_factory=ArmSettings)
    training: TrainingSettings = field(default_factory=TrainingSettings)
    tracking: TrackingSettings = field(default_factory=TrackingSettings)
    comparison: ComparisonSettings = field(default_factory=ComparisonSettings)
    resources: Resources = field(default_factory=Resources)

    @property
    def processes(self) -> int:
        """The processes of each training task (processes_per_arm)."""
        return processes_per_arm(self.resources.gpu_count, self.resources.num_nodes)

    def parameters(self) -> dict[str, Any]:
        """The pipeline's arguments: every leaf by its name."""
        return {
            leaf.name: getattr(getattr(self, section), leaf.name) for section, leaf in _leaves()
        }

    @classmethod
    def from_parameters(cls, values: Mapping[str, Any]) -> Experiment:
        """The experiment the named leaves state, the others at their defaults (the values may
        be KFP's placeholders when the pipeline is built)."""
        unknown = set(values) - {leaf.name for _, leaf in _leaves()}
        if unknown:
            raise AmpbenchError(f"not pipeline parameters: {', '.join(sorted(unknown))}")
        sections: dict[str, Any] = {}
        for section in fields(cls):
            kind: Any = section.default_factory  # the section's class
            given = {leaf.name: values[leaf.name] for leaf in fields(kind) if leaf.name in values}
            sections[section.name] = kind(**given)
        return cls(**sections)

    @classmethod
    def from_inputs(cls, inputs: Mapping[str, Any], **renamed: Any) -> Experiment:
        """The experiment a pipeline step's inputs state: each input named as a leaf, and
        `renamed`, the leaves the step takes under another name (its other inputs ignored)."""
        names = {leaf.name for _, leaf in _leaves()}
        return cls.from_parameters(
            {name: value for name, value in inputs.items() if name in names} | renamed
        )


@dataclass(frozen=True)
class Parameter(Setting):
    """One leaf as a pipeline parameter and a command-line option, and its section."""

    section: str


def section_values(section: object) -> dict[str, Any]:
    """A section's leaves by name, uncopied (when the pipeline is built, KFP's placeholders)."""
    return {leaf.name: getattr(section, leaf.name) for leaf in fields(section)}  # type: ignore[arg-type]


def section_defaults(section: type) -> dict[str, Any]:
    """A section's leaves' defaults by name (a step's inputs of the same names take them)."""
    return {leaf.name: leaf.default for leaf in described(section)}


def _leaves() -> Iterator[tuple[str, Field[Any]]]:
    """(section name, leaf) of every leaf, in the tree's order."""
    for section in fields(Experiment):
        yield from ((section.name, leaf) for leaf in fields(section.default_factory))  # type: ignore[arg-type]


def parameters() -> list[Parameter]:
    """The pipeline's parameters, in the tree's order."""
    return [
        Parameter(**vars(leaf), section=section.name)
        for section in fields(Experiment)
        for leaf in described(section.default_factory)  # type: ignore[arg-type]
    ]
