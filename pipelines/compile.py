"""Compile the pipeline to the YAML that Kubeflow Pipelines runs."""

from __future__ import annotations

from pathlib import Path

from kfp import compiler

from ampbench import DEFAULT_IMAGE
from ampbench.pipelines.pipeline import build_pipeline

DEFAULT_OUTPUT = Path("ampbench-pipeline.yaml")


def compile_pipeline(
    output: Path = DEFAULT_OUTPUT, image: str = DEFAULT_IMAGE, schedule: str = "parallel"
) -> Path:
    output.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build_pipeline(image=image, schedule=schedule), str(output))
    return output
