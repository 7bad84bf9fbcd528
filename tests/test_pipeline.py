"""The compiled pipeline: its shape, and what it asks of a Kubeflow cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from ampbench.pipelines.compile import compile_pipeline


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    path = compile_pipeline(tmp_path_factory.mktemp("yaml") / "pipeline.yaml")
    return list(yaml.safe_load_all(path.read_text()))


def executor_of(spec: dict[str, Any], task: dict[str, Any]) -> dict[str, Any]:
    component = spec["components"][task["componentRef"]["name"]]
    return spec["deploymentSpec"]["executors"][component["executorLabel"]]["container"]


def all_tasks(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every task of every DAG (root and the ParallelFor's), by display name or task name."""
    dags = [spec["root"]["dag"]] + [c["dag"] for c in spec["components"].values() if "dag" in c]
    tasks = {}
    for dag in dags:
        for name, task in dag["tasks"].items():
            tasks[task.get("taskInfo", {}).get("name", name)] = task
    return tasks


def test_parses_back_into_kfp_protobuf(compiled: list[dict[str, Any]]) -> None:
    message = json_format.ParseDict(compiled[0], pipeline_spec_pb2.PipelineSpec())
    assert message.pipeline_info.name == "ampbench"


def test_four_steps_with_two_training_tasks_of_one_component(
    compiled: list[dict[str, Any]],
) -> None:
    tasks = all_tasks(compiled[0])
    assert {"prepare", "train-fp32", "train-amp", "compare"} <= set(tasks)
    assert tasks["train-fp32"]["componentRef"]["name"].rstrip("-2") == tasks["train-amp"][
        "componentRef"
    ]["name"].rstrip("-2")
    fp32 = tasks["train-fp32"]["inputs"]["parameters"]["precision"]
    amp = tasks["train-amp"]["inputs"]["parameters"]["precision"]
    assert fp32 == {"componentInputParameter": "pipelinechannel--baseline_precision"}
    assert amp == {"componentInputParameter": "pipelinechannel--amp_precision"}


def test_training_tasks_request_one_gpu_and_the_others_none(
    compiled: list[dict[str, Any]],
) -> None:
    spec = compiled[0]
    defaults = spec["root"]["inputDefinitions"]["parameters"]
    assert defaults["gpu_resource"]["defaultValue"] == "nvidia.com/gpu"
    assert defaults["gpu_count"]["defaultValue"] == 1
    tasks = all_tasks(spec)
    for name in ("train-fp32", "train-amp"):
        accelerator = executor_of(spec, tasks[name])["resources"]["accelerator"]
        assert "pipelinechannel--gpu_resource" in accelerator["resourceType"]
        assert "pipelinechannel--gpu_count" in accelerator["resourceCount"]
    for name in ("prepare", "compare"):
        assert "accelerator" not in executor_of(spec, tasks[name]).get("resources", {})


def test_components_run_the_project_image_without_installing_kfp(
    compiled: list[dict[str, Any]], tmp_path: Path
) -> None:
    from ampbench import DEFAULT_IMAGE

    for executor in compiled[0]["deploymentSpec"]["executors"].values():
        container = executor["container"]
        assert container["image"] == DEFAULT_IMAGE
        assert "pip install" not in " ".join(container["command"])
    custom = compile_pipeline(tmp_path / "p.yaml", image="registry.example/ampbench:test")
    assert "registry.example/ampbench:test" in custom.read_text()
    assert DEFAULT_IMAGE not in custom.read_text()
