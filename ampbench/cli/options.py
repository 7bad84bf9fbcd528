"""Options that more than one command takes: the training settings and the comparison's."""

from __future__ import annotations

import argparse

from ampbench.argtypes import model_name, non_negative_int, non_negative_number, positive_int
from ampbench.tracking import DEFAULT_EXPERIMENT


def add_training_options(parser: argparse.ArgumentParser) -> None:
    """What `run` and `train` share, with TrainConfig's defaults."""
    from ampbench.train.config import MODEL_FORMS, TrainConfig

    parser.add_argument(
        "--subset",
        type=non_negative_int,
        default=TrainConfig.subset,
        help="at most N images per split (0: all)",
    )
    parser.add_argument(
        "--epochs", type=positive_int, default=TrainConfig.epochs, help="training epochs"
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=TrainConfig.batch_size,
        help="images per training step",
    )
    parser.add_argument("--lr", type=float, default=TrainConfig.lr, help="peak learning rate")
    parser.add_argument(
        "--model",
        type=model_name,
        default=TrainConfig.model,
        help=f"the network to train, one of {MODEL_FORMS} (a callable taking num_classes and "
        "image_shape (channels, height, width), returning an nn.Module that maps (N, C, H, W) "
        "images to (N, num_classes) logits)",
    )
    parser.add_argument(
        "--image-size",
        type=non_negative_int,
        default=TrainConfig.image_size,
        metavar="SIZE",
        help="train and evaluate on SIZE x SIZE images, resized bilinearly on the device per "
        "batch (0: as prepared)",
    )
    parser.add_argument(
        "--target-accuracy",
        type=non_negative_number,
        default=TrainConfig.target_accuracy,
        metavar="A",
        help="stop each arm at the first epoch whose test accuracy reaches A and record its "
        "time to target (0: off; the epochs are the limit)",
    )
    parser.add_argument(
        "--allow-emulated",
        action="store_true",
        help="measure a precision this device has no native math for (labelled emulated)",
    )
    parser.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=TrainConfig.cuda_graphs,
        help="on a CUDA GPU, replay each training step as one CUDA graph (the kernel launches "
        "out of the way); --no-cuda-graphs trains eagerly. Not under torchrun",
    )
    parser.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment")
    parser.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")


def add_comparison_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-accuracy-drop",
        type=non_negative_number,
        metavar="PP",
        help="fail when the AMP arm loses more than PP percentage points of accuracy",
    )
    parser.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="compare arms that differ in more than precision (GPU model, versions, settings) "
        "instead of refusing; the report then carries a warning",
    )
