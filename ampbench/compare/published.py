"""The published experiment this project starts from, and how a run's setup differs from it."""

from __future__ import annotations

from collections.abc import Callable

from ampbench.results import ArmResults
from ampbench.train.precisions import AMP_PRECISION, BASELINE_PRECISION

# The published experiment this project starts from (ResNet-18, CIFAR-10, 2 epochs, a GPU).
PUBLISHED_ARMS = (BASELINE_PRECISION, AMP_PRECISION)
PUBLISHED = {
    BASELINE_PRECISION: {"accuracy": 0.7114, "peak_memory_mb": 3219.65, "train_time_s": 309.41},
    AMP_PRECISION: {"accuracy": 0.6969, "peak_memory_mb": 1916.57, "train_time_s": 252.56},
}
PUBLISHED_SETUP: dict[str, Callable[[ArmResults], object]] = {
    "model": lambda r: r.model,
    "epochs": lambda r: r.hyperparameters.get("epochs"),
    "batch size": lambda r: r.hyperparameters.get("batch_size"),
    "training images": lambda r: r.dataset.train_images,
    "test images": lambda r: r.dataset.test_images,
    "classes": lambda r: r.dataset.classes,
    "device": lambda r: r.device.type,
}
PUBLISHED_VALUES = {
    "model": "resnet18",
    "epochs": 2,
    "batch size": 128,
    "training images": 50_000,
    "test images": 10_000,
    "classes": 10,
    "device": "cuda",
}


def published_differences(
    run: ArmResults, baseline: str, headline: str, arm_count: int
) -> list[str]:
    """How our setup differs from the published run's (empty: a reproduction)."""
    found = [
        f"{key} {value_of(run)} (published: {PUBLISHED_VALUES[key]})"
        for key, value_of in PUBLISHED_SETUP.items()
        if value_of(run) != PUBLISHED_VALUES[key]
    ]
    published = " and ".join(PUBLISHED_ARMS)
    if arm_count > 2:
        found.append(f"a matrix of {arm_count} arms (published: {published})")
    elif (baseline, headline) != PUBLISHED_ARMS:
        found.append(f"arms {baseline} and {headline} (published: {published})")
    return found


# Near enough to set beside the published run: CIFAR-10's shape of data (any image classifier).
PUBLISHED_CLASSES = 10
PUBLISHED_IMAGE_SHAPE = [32, 32, 3]


def unlike_published(run: ArmResults) -> str | None:
    """Why the published run is not set beside this one (None: it is a reproduction or a near
    one, on data shaped as CIFAR-10)."""
    shape = run.dataset.image_shape
    if run.dataset.classes == PUBLISHED_CLASSES and shape == PUBLISHED_IMAGE_SHAPE:
        return None

    def images(classes: int, shape: list[int]) -> str:
        return f"{classes} classes of {'x'.join(map(str, shape[:2])) or 'unrecorded'} images"

    published = images(PUBLISHED_CLASSES, PUBLISHED_IMAGE_SHAPE)
    return (
        f"this run trained on {images(run.dataset.classes, shape)}, the published one on "
        f"CIFAR-10 ({published})"
    )
