"""The train step: one precision arm trained and measured (engine.py), and its KFP wrapper.

The names below are here, free of torch, so that a command line can offer them quickly.
"""

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "amp")
MODELS = ("resnet18", "resnet18-imagenet", "small-cnn")
