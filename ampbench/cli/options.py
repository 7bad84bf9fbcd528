"""Options that more than one command takes: the training settings and the comparison's."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from ampbench.argtypes import model_name, non_negative_number, positive_int

# The experiment's leaves `run` and `train` share: each an option of the leaf's name.
SHARED_LEAVES = (
    "subset", "epochs", "lr", "image_size", "target_accuracy", "allow_emulated", "cuda_graphs",
    "experiment", "tracking",
)  # fmt: skip


def add_experiment_options(
    parser: argparse.ArgumentParser, sections: Iterable[str] = (), names: Iterable[str] = ()
) -> None:
    """An option per leaf of the experiment (ampbench/experiment.py) in `sections` or `names`,
    unless the parser has its flag already: the leaf's flag, default, type and description."""
    from ampbench.experiment import parameters

    sections, names = set(sections), set(names)
    for leaf in parameters():
        flag = "--" + leaf.flag
        if flag in parser._option_string_actions or not (
            leaf.section in sections or leaf.name in names
        ):
            continue
        options: dict[str, Any] = {"dest": leaf.name, "default": leaf.default}
        if leaf.type is bool:
            options["action"] = argparse.BooleanOptionalAction
        else:
            options["type"] = leaf.parse
            options["metavar"] = leaf.flag.upper().replace("-", "_")
        parser.add_argument(flag, help=leaf.description.replace("%", "%%"), **options)


def add_training_options(parser: argparse.ArgumentParser) -> None:
    """What `run` and `train` share: the model and batch, and SHARED_LEAVES."""
    from ampbench.train.config import MODEL_FORMS, TrainConfig

    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=TrainConfig.batch_size,
        help="images per training step",
    )
    parser.add_argument(
        "--model",
        type=model_name,
        default=TrainConfig.model,
        help=f"the network to train, one of {MODEL_FORMS} (a callable taking num_classes and "
        "image_shape (channels, height, width), returning an nn.Module that maps (N, C, H, W) "
        "images to (N, num_classes) logits)",
    )
    add_experiment_options(parser, names=SHARED_LEAVES)


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
