"""Training: one precision arm trained and measured (loop.py).

The names below are here, free of torch, so that a command line can offer them quickly.
"""

# The --precision names and the published pair, kept in the registry (precisions.py).
from ampbench.train.precisions import AMP_PRECISION, BASELINE_PRECISION, PRECISIONS

# The published experiment's data set, and so what `ampbench run` and the pipeline train on.
DEFAULT_DATA = "cifar10"
# What a data source may be (data/sources.py), for the help of every --data.
DATA_FORMS = (
    "synthetic, cifar10, cifar100, a path or file:// URI (ImageFolder directory, .tar, .tar.gz, "
    ".tgz, .zip, CIFAR python tarball), s3://bucket/key or s3://bucket/prefix/"
)
# The built-in networks (models.py); --model also takes a torchvision classification model
# by name, or package.module:factory.
MODELS = ("resnet18", "resnet18-imagenet", "small-cnn", "vit-s")
# Gradient all-reduce precision under torchrun (distributed.py): DDP's compression hooks; the
# first (no compression) is the default.
GRAD_COMM = ("fp32", "bf16", "fp16")


def train_step_name(precision: str) -> str:
    """What an arm's train step and its training processes call themselves in error lines."""
    return f"train-{precision}"


__all__ = [
    "AMP_PRECISION",
    "BASELINE_PRECISION",
    "DATA_FORMS",
    "DEFAULT_DATA",
    "GRAD_COMM",
    "MODELS",
    "PRECISIONS",
    "train_step_name",
]
