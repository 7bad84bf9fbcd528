"""The settings of one training run, free of torch so that a command line can read them."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from ampbench.argtypes import (
    model_name,
    non_negative_int,
    non_negative_number,
    one_of,
    positive_int,
)
from ampbench.errors import AmpbenchError
from ampbench.logs import log
from ampbench.settings import setting
from ampbench.train import AMP_PRECISION, GRAD_COMM, MODELS
from ampbench.train.compile_cache import location_of

# --model's three forms, for help texts and errors.
MODEL_FORMS = (
    f"the built-in models ({', '.join(MODELS)}), torchvision's classification models by name "
    "(e.g. mobilenet_v3_small, vit_b_16) or the form package.module:factory"
)
# package.module:factory: a dotted module path, a colon, a (dotted) name in that module.
_FACTORY = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


@dataclass(frozen=True)
class TrainConfig:
    """One arm's training settings. Each described field is `ampbench train`'s option of its
    name; the experiment's training leaves are the same settings (ampbench/experiment.py)."""

    dataset_dir: Path
    precision: str = AMP_PRECISION
    epochs: int = setting(2, "training epochs", parse=positive_int)
    batch_size: int = setting(128, "images per training step", parse=positive_int)
    lr: float = setting(0.1, "peak learning rate")
    seed: int = setting(0, "seed of weights, order and subset")
    model: str = setting(
        "resnet18",
        f"the network to train, one of {MODEL_FORMS} (a callable taking num_classes and "
        "image_shape (channels, height, width), returning an nn.Module that maps (N, C, H, W) "
        "images to (N, num_classes) logits)",
        parse=model_name,
    )
    compile: bool = setting(False, "torch.compile the model")
    compile_cache: str | None = setting(
        None,
        "with --compile: a local directory or s3:// prefix where processes share what they "
        "compiled (Inductor's cache, one archive per model, batch, precision and device), so a "
        "graph compiled once is fetched rather than compiled again (a hit, recorded); a "
        "pipeline's tasks share one beside their checkpoints unless this is 'off'",
        parse=str,
    )
    deterministic: bool = setting(False, "deterministic algorithms")
    label_smoothing: float = setting(0.0, "label smoothing of the loss")
    momentum: float = setting(0.9, "SGD's Nesterov momentum")
    weight_decay: float = setting(5e-4, "SGD's weight decay")
    warmup_fraction: float = setting(0.25, "share of the steps the learning rate warms up over")
    eval_batch_size: int = setting(
        0,
        "images per evaluation batch (0: the training batch, whose kernels the warm-up chose)",
        parse=non_negative_int,
    )
    subset: int = setting(0, "at most this many images per split (0: all)", parse=non_negative_int)
    device: str = setting("auto", "auto, cpu, cuda or cuda:N")
    checkpoint_dir: str | None = setting(
        None,
        "where to checkpoint: a local directory or an s3:// prefix (a retried pipeline task "
        "resumes there)",
        parse=str,
    )
    checkpoint_every: int = setting(
        0,
        "training steps between checkpoints (0: none; needs a checkpoint dir)",
        parse=non_negative_int,
    )
    keep_checkpoints: int = setting(
        3, "how many of the newest checkpoints to keep", parse=positive_int
    )
    resume: bool = setting(False, "continue from the newest checkpoint")
    max_skipped_steps: int = setting(
        50, "fp16: stop after this many loss-scale skips in a row", parse=positive_int
    )
    initial_loss_scale: float = setting(2.0**16, "fp16: the GradScaler's first loss scale")
    warmup_steps: int = setting(
        3, "untimed training steps before the clock starts, then undone", parse=non_negative_int
    )
    allow_emulated: bool = setting(
        False, "measure a precision the device has no native math for (labelled emulated)"
    )
    target_accuracy: float = setting(
        0.0,
        "stop at the first epoch whose test accuracy reaches this and record its time to "
        "target (0: off; the epochs are the limit)",
        parse=non_negative_number,
    )
    image_size: int = setting(
        0,
        "train and evaluate on images of this size squared, resized bilinearly on the device "
        "per batch (0: as prepared)",
        parse=non_negative_int,
    )
    grad_comm: str = setting(
        GRAD_COMM[0],
        "with several processes (torchrun): the precision DDP all-reduces gradients in "
        f"({', '.join(GRAD_COMM)})",
        parse=one_of(GRAD_COMM),
    )
    profile_steps: int = setting(
        20,
        "after the timed epochs, this many more steps under torch.profiler, off the clock and "
        "undone: why the arm gained what it gained, and a Chrome trace (0: off)",
        parse=non_negative_int,
    )
    cuda_graphs: bool = setting(
        True,
        "on a CUDA GPU, replay each training step as one CUDA graph (the kernel launches out "
        "of the way); off, it trains eagerly. Not under torchrun",
    )

    @classmethod
    def from_inputs(
        cls, inputs: Mapping[str, Any], dataset_dir: Path, **renamed: Any
    ) -> TrainConfig:
        """The config that `ampbench train`'s parsed options or the train step's inputs state:
        each field is the input of its name (batch_size: --batch-size), or one of `renamed`;
        a field neither gives keeps its default, and other inputs are ignored."""
        names = {f.name for f in fields(cls)} - {"dataset_dir"}
        given = {name: value for name, value in inputs.items() if name in names}
        return cls(dataset_dir, **(given | renamed))

    def validate(self) -> None:
        positive = {
            "--epochs": self.epochs,
            "--batch-size": self.batch_size,
            "--keep-checkpoints": self.keep_checkpoints,
            "--max-skipped-steps": self.max_skipped_steps,
        }
        for option, value in positive.items():
            if value < 1:
                raise AmpbenchError(f"{option}: must be at least 1, not {value}")
        if not self.lr > 0:
            raise AmpbenchError(f"--lr: must be positive, not {self.lr}")
        # SGD takes Nesterov momentum only above 0; NaN fails every comparison here.
        if not 0 < self.momentum < 1:
            raise AmpbenchError(f"--momentum: must be in (0, 1), not {self.momentum}")
        if not self.weight_decay >= 0:
            raise AmpbenchError(f"--weight-decay: must be 0 or positive, not {self.weight_decay}")
        if not self.initial_loss_scale > 0:
            raise AmpbenchError(
                f"--initial-loss-scale: must be positive, not {self.initial_loss_scale}"
            )
        if not 0 <= self.target_accuracy <= 1:
            raise AmpbenchError(
                f"--target-accuracy: must be in [0, 1] (0: off), not {self.target_accuracy}"
            )
        if not 0 <= self.label_smoothing < 1:
            raise AmpbenchError(f"--label-smoothing: must be in [0, 1), not {self.label_smoothing}")
        if not 0 < self.warmup_fraction < 1:
            raise AmpbenchError(f"--warmup-fraction: must be in (0, 1), not {self.warmup_fraction}")
        if self.grad_comm not in GRAD_COMM:
            raise AmpbenchError(
                f"--grad-comm: '{self.grad_comm}' is not one of {', '.join(GRAD_COMM)}"
            )
        if self.image_size < 0:
            raise AmpbenchError(
                f"--image-size: must be 0 (as prepared) or positive, not {self.image_size}"
            )
        if min(self.subset, self.checkpoint_every, self.warmup_steps, self.eval_batch_size) < 0:
            raise AmpbenchError(
                "--subset, --checkpoint-every, --warmup-steps and --eval-batch-size: must be 0 "
                "(off; for --eval-batch-size, the training batch) or positive"
            )
        if self.compile and self.warmup_steps == 0:
            raise AmpbenchError(
                "--compile with --warmup-steps 0: compilation would be timed as training; "
                "give it at least one warm-up step"
            )
        if location_of(self.compile_cache) and not self.compile:
            raise AmpbenchError("--compile-cache: needs --compile (nothing is compiled without)")
        if (self.resume or self.checkpoint_every) and not self.checkpoint_dir:
            raise AmpbenchError("--resume and --checkpoint-every: need --checkpoint-dir")

    def hyperparameters(self) -> dict[str, Any]:
        # What changes neither the training nor its measurement (emulation is recorded with
        # the precision).
        skip = {"dataset_dir", "device", "checkpoint_dir", "resume", "keep_checkpoints"}
        skip |= {"compile_cache"}  # where compiled code is kept, not what it computes
        skip |= {"allow_emulated"}
        skip |= {"profile_steps"}  # after the timed epochs, and undone
        values = {k: v for k, v in asdict(self).items() if k not in skip}
        return {**values, "optimizer": "sgd-nesterov", "schedule": "one-cycle-linear"}


# A first try on a small --subset must learn something: 4 steps of 128 on 512 images do not.
MIN_STEPS_PER_EPOCH = 16


# A run's batch_size of 0 (what `ampbench run` sends where --batch-size is not given): chosen by
# the train task from the training split it reads, automatic_batch_size's.
AUTOMATIC_BATCH = 0


def automatic_batch_size(train_images: int) -> int:
    """The batch an arm of AUTOMATIC_BATCH trains with: TrainConfig's, or where the training
    split holds too few images for MIN_STEPS_PER_EPOCH steps of it (a small data set, a
    --subset), the largest power of two that gives them (at least 8, or every image of a split
    smaller than that). The full experiment's batch is unchanged."""
    batch = TrainConfig.batch_size
    while batch > 8 and train_images // batch < MIN_STEPS_PER_EPOCH:
        batch //= 2
    return max(1, min(batch, train_images))


def with_batch_for_data(config: TrainConfig, processes: int) -> TrainConfig:
    """`config` with an AUTOMATIC_BATCH made each process's automatic_batch_size of the
    training images it will see (its prepared data's, less --subset's); a batch that was
    given is kept, whatever the data."""
    if config.batch_size != AUTOMATIC_BATCH:
        return config
    from ampbench.dataset_format import read_metadata

    counts = read_metadata(Path(config.dataset_dir))["counts"]
    train_images = min(counts["train"], config.subset) if config.subset else counts["train"]
    batch = automatic_batch_size(train_images // processes)
    log.info(
        "batch %d (automatic): %d steps an epoch of the %s training images; --batch-size sets it",
        batch,
        train_images // (batch * processes),
        f"{train_images:,}",
    )
    return replace(config, batch_size=batch)


def model_name_problem(name: str) -> str | None:
    """What is wrong with a --model value as a name (None: nothing), checked cheaply: a
    built-in name or the package.module:factory form without importing torch (the module
    itself is imported only where the model is built, which may be another machine's image);
    any other name against torchvision's list of classification models."""
    if name in MODELS:
        return None
    if ":" in name:
        if _FACTORY.fullmatch(name):
            return None
        return "not of the form package.module:factory (a dotted module path, a colon, a name)"
    from ampbench.train.models import torchvision_models

    known = torchvision_models()
    if name in known:
        return None
    close = difflib.get_close_matches(name, [*MODELS, *known], n=1)
    return f"not one of {MODEL_FORMS}" + (f"; did you mean {close[0]}?" if close else "")


def check_model_name(name: str) -> None:
    problem = model_name_problem(name)
    if problem is not None:
        raise AmpbenchError(f"--model: '{name}' is {problem}")


def model_input_shape(image_shape: Sequence[int], image_size: int = 0) -> tuple[int, int, int]:
    """The (channels, height, width) of the batches a model sees: the prepared data's
    (height, width, channels), or image_size x image_size when --image-size resizes them."""
    height, width, channels = (int(size) for size in image_shape)
    if image_size:
        height = width = image_size
    return channels, height, width


def processes_per_arm(gpu_count: int, num_nodes: int) -> int:
    """The training processes of one arm: one per GPU (at least one) on each node."""
    return max(1, gpu_count) * max(1, num_nodes)


def _batch_text(batch_size: int, processes: int) -> str:
    """How a batch too large for the data is named: the option, and the global batch."""
    if processes == 1:
        return f"--batch-size {batch_size}"
    return (
        f"--batch-size {batch_size} x {processes} processes (a global batch of "
        f"{batch_size * processes:,})"
    )


def check_pipeline_settings(
    *, batch_size: int, model: str, subset: int = 0, processes: int = 1, **training: Any
) -> None:
    """The training settings of a pipeline run, checked by preflight (ampbench/preflight.py
    says why there) with TrainConfig's own rules.
    training: TrainConfig's other fields (epochs, lr, ...). batch_size is each of the arm's
    `processes`' (processes_per_arm). Whether the model fits the data is for
    check_against_dataset, once the data is known."""
    checked = batch_size or TrainConfig.batch_size  # an automatic one is chosen to fit
    TrainConfig(Path(), batch_size=checked, model=model, subset=subset, **training).validate()
    check_model_name(model)
    if subset and batch_size * processes > subset:
        raise AmpbenchError(
            f"{_batch_text(batch_size, processes)}: larger than the at most {subset:,} training "
            f"images that --subset {subset} keeps"
        )


def check_against_dataset(
    metadata: dict[str, Any],
    *,
    batch_size: int = 0,
    model: str = "",
    subset: int = 0,
    image_size: int = 0,
    processes: int = 1,
) -> None:
    """Refuse settings that a prepared data set rules out (preflight, where prepared and train).
    A setting left at 0 or "" is not checked. batch_size is each of the arm's `processes`'
    (processes_per_arm): one step takes batch_size x processes images. The model is built and
    run on its images (as --image-size resizes them) on the meta device: models.check_model."""
    if model:
        check_model_name(model)
    counts = metadata["counts"]
    if "test" not in counts:
        raise AmpbenchError("the prepared dataset has no test split to measure on")
    train_images = min(counts["train"], subset) if subset else counts["train"]
    if batch_size * processes > train_images:
        raise AmpbenchError(
            f"{_batch_text(batch_size, processes)}: larger than the {train_images:,} training "
            "images"
        )
    if model:
        from ampbench.train.models import check_model

        shape = model_input_shape(metadata["image_shape"], image_size)
        check_model(model, len(metadata["classes"]), shape)
