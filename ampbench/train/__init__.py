"""Training: one precision arm trained and measured (loop.py).

The names below are here, free of torch, so that a command line can offer them quickly.
"""

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "amp", "fp8", "fp8-rowwise")
# Float8 training of the nn.Linear layers (torchao), each a recipe: tensorwise or rowwise scales.
FP8_PRECISIONS = ("fp8", "fp8-rowwise")
# The pair the published experiment compares, and so the pipeline's default arms.
BASELINE_PRECISION = "fp32"
AMP_PRECISION = "amp"
# The published experiment's data set, and so what `ampbench run` and the pipeline train on.
DEFAULT_DATA = "cifar10"
# The built-in networks (models.py); --model also takes a torchvision classification model
# by name, or package.module:factory.
MODELS = ("resnet18", "resnet18-imagenet", "small-cnn", "vit-s")
# Gradient all-reduce precision under torchrun (distributed.py): DDP's compression hooks.
GRAD_COMM = ("fp32", "bf16", "fp16")
