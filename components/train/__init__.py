"""The train step: one precision arm trained and measured (engine.py), and its KFP wrapper.

The names below are here, free of torch, so that a command line can offer them quickly.
"""

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "amp")
# The pair the published experiment compares, and so the pipeline's default arms.
BASELINE_PRECISION = "fp32"
AMP_PRECISION = "amp"
# The published experiment's data set, and so what `ampbench run` and the pipeline train on.
DEFAULT_DATA = "cifar10"
MODELS = ("resnet18", "resnet18-imagenet", "small-cnn")
# The smallest images each model takes (small-cnn halves them three times).
MIN_IMAGE_SIZE = {"resnet18": 1, "resnet18-imagenet": 1, "small-cnn": 8}
