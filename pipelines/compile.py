"""Compile the pipeline to the YAML that Kubeflow Pipelines runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from kfp import compiler

from ampbench import DEFAULT_IMAGE
from ampbench.argtypes import image_reference
from ampbench.image_reference import check_image_reference
from ampbench.pipelines.pipeline import SCHEDULES, build_pipeline

DEFAULT_OUTPUT = Path("ampbench-pipeline.yaml")


def compile_pipeline(
    output: Path = DEFAULT_OUTPUT, image: str = DEFAULT_IMAGE, schedule: str = SCHEDULES[0]
) -> Path:
    check_image_reference(image)
    output.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build_pipeline(image=image, schedule=schedule), str(output))
    return output


def add_build_options(parser: argparse.ArgumentParser) -> None:
    """--image and --schedule, for the commands that compile the pipeline."""
    parser.add_argument(
        "--image",
        type=image_reference,
        default=DEFAULT_IMAGE,
        help="component image (default: %(default)s)",
    )
    parser.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default=SCHEDULES[0],
        help="train the arms at once (one GPU node each) or one after another",
    )
