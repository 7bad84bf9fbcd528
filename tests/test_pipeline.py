"""The compiled pipeline: its shape, and what it asks of a Kubeflow cluster."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from ampbench.experiment import TrainingSettings, section_defaults
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


def test_four_steps_and_a_training_task_per_run_of_the_matrix(
    compiled: list[dict[str, Any]],
) -> None:
    from ampbench.matrix import DEFAULT_RUNS

    spec = compiled[0]
    tasks = all_tasks(spec)
    assert set(tasks) == {"prepare", "for-loop-1", "train", "compare"}
    loop = spec["root"]["dag"]["tasks"]["for-loop-1"]
    assert loop["parameterIterator"]["items"] == {"inputParameter": "pipelinechannel--runs"}
    # Each training task takes its arm and seed from its item of the `runs` list.
    inputs = tasks["train"]["inputs"]["parameters"]
    for parameter, key in (("precision", "precision"), ("batch_size", "batch_size"),
                           ("seed", "seed"), ("model_name", "model")):  # fmt: skip
        assert inputs[parameter] == {
            "componentInputParameter": "pipelinechannel--runs-loop-item",
            "parameterExpressionSelector": f'parseJson(string_value)["{key}"]',
        }
    default = spec["root"]["inputDefinitions"]["parameters"]["runs"]["defaultValue"]
    assert default == DEFAULT_RUNS  # the published pair (KFP writes 128 as 128.0: equal)
    # compare gathers every training task's results.
    compare = tasks["compare"]["inputs"]["artifacts"]["results"]
    assert compare == {
        "taskOutputArtifact": {
            "outputArtifactKey": "pipelinechannel--train-results",
            "producerTask": "for-loop-1",
        }
    }


def test_training_tasks_request_one_gpu_and_the_others_none(
    compiled: list[dict[str, Any]],
) -> None:
    spec = compiled[0]
    defaults = spec["root"]["inputDefinitions"]["parameters"]
    assert defaults["gpu_resource"]["defaultValue"] == "nvidia.com/gpu"
    assert defaults["gpu_count"]["defaultValue"] == 1
    tasks = all_tasks(spec)
    for name in ("train",):
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


def platform_of(compiled: list[dict[str, Any]], task: dict[str, Any]) -> dict[str, Any]:
    component = compiled[0]["components"][task["componentRef"]["name"]]
    executors = compiled[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    return executors[component["executorLabel"]]


def test_every_parameter_a_task_uses_reaches_its_dag(compiled: list[dict[str, Any]]) -> None:
    """A DAG's tasks may only use parameters the DAG receives (kfp 2.17 forgets to thread some
    into a ParallelFor; such a pipeline compiles, then fails on the cluster)."""
    placeholder = re.compile(r"\{\{\$\.inputs\.parameters\['([^']+)'\]\}\}")
    spec = compiled[0]
    dags = {"root": spec["root"]} | {
        name: c for name, c in spec["components"].items() if "dag" in c
    }
    for dag_name, component in dags.items():
        available = set(component.get("inputDefinitions", {}).get("parameters", {}))
        for task_name, task in component["dag"]["tasks"].items():
            inputs = task.get("inputs", {}).get("parameters", {})
            for name, value in inputs.items():
                # A placeholder names one of the task's own inputs; each of those comes from
                # a parameter the DAG receives.
                missing = set(placeholder.findall(str(value))) - set(inputs)
                assert not missing, (dag_name, task_name, name, missing)
                source = value.get("componentInputParameter")
                assert source is None or source in available, (dag_name, task_name, source)


def test_training_tasks_are_scheduled_on_gpu_nodes(compiled: list[dict[str, Any]]) -> None:
    tasks = all_tasks(compiled[0])
    for name in ("train",):
        platform = platform_of(compiled, tasks[name])
        assert platform["tolerations"] == [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
        assert platform["nodeSelector"] == {
            "nodeSelectorJson": {"componentInputParameter": "pipelinechannel--gpu_node_selector"}
        }
        assert platform["emptyDirMounts"] == [
            {"medium": "Memory", "mountPath": "/dev/shm", "volumeName": "dshm"}
        ]
        assert int(platform["activeDeadlineSeconds"]) == 6 * 3600
        resources = executor_of(compiled[0], tasks[name])["resources"]
        assert "pipelinechannel--train_cpu" in resources["resourceCpuLimit"]
        assert "pipelinechannel--train_memory" in resources["resourceMemoryRequest"]
        assert tasks[name]["retryPolicy"]["maxRetryCount"] == 2


def test_credentials_come_from_secrets_and_config_maps_only(
    compiled: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks = all_tasks(compiled[0])
    for name in ("prepare", "train", "compare"):
        platform = platform_of(compiled, tasks[name])
        (secret,) = platform["secretAsEnv"]
        assert "secretNameParameter" in secret and "secretName" not in secret
        assert {e["envVar"] for e in secret["keyToEnv"]} == {
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
        }
        (config_map,) = platform["configMapAsEnv"]
        assert "MLFLOW_TRACKING_URI" in {e["envVar"] for e in config_map["keyToEnv"]}
    defaults = compiled[0]["root"]["inputDefinitions"]["parameters"]
    assert defaults["s3_secret"]["defaultValue"] == "ampbench-s3"
    # Whatever the compiling shell holds never lands in the YAML.
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "sekrit-value-4242")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://user:hunter2@mlflow.example:5000")
    text = compile_pipeline(tmp_path / "p.yaml").read_text()
    assert "sekrit-value-4242" not in text and "hunter2" not in text


def test_no_step_is_answered_from_the_cache(compiled: list[dict[str, Any]]) -> None:
    """Prepare checks the tracking set-up and the settings before any GPU time is spent: it
    must run each time; the training and compare steps are measurements."""
    tasks = all_tasks(compiled[0])
    for name in ("prepare", "train", "compare"):
        assert tasks[name]["cachingOptions"].get("enableCache", False) is False


def test_prepare_requests_cpu_and_memory_and_checks_the_settings(
    compiled: list[dict[str, Any]],
) -> None:
    spec = compiled[0]
    task = all_tasks(spec)["prepare"]
    resources = executor_of(spec, task)["resources"]
    assert "prepare_cpu" in resources["resourceCpuRequest"] == resources["resourceCpuLimit"]
    assert "prepare_memory" in resources["resourceMemoryRequest"]
    assert resources["resourceMemoryRequest"] == resources["resourceMemoryLimit"]
    defaults = spec["root"]["inputDefinitions"]["parameters"]
    assert defaults["prepare_memory"]["defaultValue"] == "8Gi"
    inputs = task["inputs"]["parameters"]
    given = {"tracking": "tracking", "runs": "runs", "baseline_precision": "baseline_precision",
             "train_image_size": "image_size", "gpu_count": "gpu_count",
             "num_nodes": "num_nodes"}  # fmt: skip
    # Every training setting is checked there, once, as each training task will take it.
    given |= {name: name for name in section_defaults(TrainingSettings)}
    for name, parameter in given.items():
        assert inputs[name] == {"componentInputParameter": parameter}, name


def test_every_training_tasks_model_is_an_output_of_the_pipeline(
    compiled: list[dict[str, Any]],
) -> None:
    """The pipeline's `models` output collects the train tasks' models from the matrix's
    loop, so `ampbench run` and a cluster's user read them from the run, not its folders."""
    root = compiled[0]["root"]
    declared = root["outputDefinitions"]["artifacts"]["models"]
    assert declared["isArtifactList"] is True
    assert declared["artifactType"]["schemaTitle"] == "system.Model"
    (selector,) = root["dag"]["outputs"]["artifacts"]["models"]["artifactSelectors"]
    assert selector["producerSubtask"].startswith("for-loop")
    assert selector["outputArtifactKey"].endswith("train-model")


def test_every_input_a_step_reads_by_name_is_a_setting_of_that_name() -> None:
    """The steps read their inputs into the library's config by name (from_inputs), which
    ignores other names: so each input is a setting of its name, or one the step renames or
    uses itself, and a misspelt input fails here rather than training at a default."""
    import inspect
    from dataclasses import fields

    from ampbench.components.prepare.component import prepare
    from ampbench.components.train.component import train
    from ampbench.experiment import parameters
    from ampbench.train.config import TrainConfig

    config_fields = {f.name for f in fields(TrainConfig)}
    leaves = {leaf.name for leaf in parameters()}
    own = {
        train: {"dataset", "model", "metrics", "results", "trace", "model_name", "experiment",
                "tracking", "registered_model_name", "num_nodes", "trainer_runtime", "timeout_s",
                "pipeline_run_id", "requested_gpu_type", "requested_gpu_count",
                "requested_cpu", "requested_memory", "trainjob_image", "node_selector",
                "config_map", "s3_secret"},
        prepare: {"dataset", "test_fraction", "seed", "skip_bad_images", "train_image_size",
                  "val_fraction", "image_size", "max_extract_bytes", "max_members",
                  "max_image_pixels", "max_decoded_bytes"},
    }  # fmt: skip
    for step, settings in ((train, config_fields), (prepare, leaves)):
        inputs = set(inspect.signature(step.python_func).parameters)
        assert inputs - own[step] <= settings, (step.name, inputs - own[step] - settings)


def test_the_pipeline_sets_every_input_of_the_train_step(compiled: list[dict[str, Any]]) -> None:
    """No input of the train component is left at its default but subset, which the prepare
    step applies to the data: each other is a pipeline parameter or the matrix run's, so
    whatever the component can train, the pipeline can ask for."""
    spec = compiled[0]
    task = all_tasks(spec)["train"]
    declared = spec["components"][task["componentRef"]["name"]]["inputDefinitions"]
    given = set(task["inputs"].get("parameters", {})) | set(task["inputs"].get("artifacts", {}))
    assert (set(declared["parameters"]) | set(declared["artifacts"])) - given == {"subset"}


def test_the_gradient_all_reduce_precision_reaches_every_training_task(
    compiled: list[dict[str, Any]],
) -> None:
    spec = compiled[0]
    train = all_tasks(spec)["train"]["inputs"]["parameters"]["grad_comm"]
    assert train == {"componentInputParameter": "pipelinechannel--grad_comm"}


def test_sequential_schedule_trains_one_run_after_the_other(tmp_path: Path) -> None:
    spec = yaml.safe_load_all(
        compile_pipeline(tmp_path / "s.yaml", schedule="sequential").read_text()
    )
    loop = next(spec)["root"]["dag"]["tasks"]["for-loop-1"]
    assert loop["iteratorPolicy"]["parallelismLimit"] == 1


def test_defaults_are_the_training_configs_written_once(compiled: list[dict[str, Any]]) -> None:
    """The pipeline and the train component take their defaults from TrainConfig, and the
    prepare and compare components from the experiment; a component's source, which KFP embeds
    in the YAML, holds no copy of them."""
    from ampbench.components.train.component import DEFAULTS
    from ampbench.train.config import TrainConfig

    spec = compiled[0]
    pipeline = spec["root"]["inputDefinitions"]["parameters"]
    for name, field in (("epochs", "epochs"), ("lr", "lr"), ("subset", "subset"),
                        ("image_size", "image_size"), ("grad_comm", "grad_comm")):  # fmt: skip
        assert pipeline[name]["defaultValue"] == getattr(TrainConfig, field), name
    from ampbench.components.compare.component import DEFAULTS as COMPARE_DEFAULTS
    from ampbench.components.prepare.component import DEFAULTS as PREPARE_DEFAULTS

    steps = (("prepare", PREPARE_DEFAULTS), ("train", DEFAULTS), ("compare", COMPARE_DEFAULTS))
    for step, defaults in steps:
        task = all_tasks(spec)[step]
        component = spec["components"][task["componentRef"]["name"]]
        inputs = component["inputDefinitions"]["parameters"]
        source = " ".join(executor_of(spec, task)["command"])
        for name, value in defaults.items():
            assert inputs[name]["defaultValue"] == value, (step, name)
            assert f"{name}: " in source and not re.search(rf"\b{name}: \w+ = ", source), name


def test_the_train_timeout_chosen_at_compile_time_reaches_the_task_and_its_trainjob(
    tmp_path: Path,
) -> None:
    """build_pipeline's train_timeout_s limits the train task and, through its timeout_s
    input, the deadline of a TrainJob the task creates (run_train_task, tests/test_task.py)."""
    from kfp import compiler

    from ampbench.pipelines.pipeline import build_pipeline

    path = tmp_path / "pipeline.yaml"
    compiler.Compiler().compile(build_pipeline(train_timeout_s=1234), str(path))
    compiled = list(yaml.safe_load_all(path.read_text()))
    task = all_tasks(compiled[0])["train"]
    assert int(platform_of(compiled, task)["activeDeadlineSeconds"]) == 1234
    assert task["inputs"]["parameters"]["timeout_s"] == {"runtimeValue": {"constant": 1234}}


def test_the_pipeline_parameters_are_the_experiments_leaves(
    compiled: list[dict[str, Any]],
) -> None:
    """One definition (ampbench/experiment.py): each leaf is a parameter of its name, default,
    type and description, in the tree's order, and `submit` reads the experiment back by name."""
    from ampbench.experiment import Experiment, parameters
    from ampbench.pipelines.pipeline import build_pipeline

    kinds = {str: "STRING", int: "NUMBER_INTEGER", float: "NUMBER_DOUBLE", bool: "BOOLEAN"}
    kinds |= {list: "LIST", dict: "STRUCT"}
    declared = compiled[0]["root"]["inputDefinitions"]["parameters"]
    assert set(declared) == {leaf.name for leaf in parameters()}
    for leaf in parameters():
        spec = declared[leaf.name]
        assert spec["parameterType"] == kinds[leaf.type], leaf.name
        assert spec["defaultValue"] == leaf.default, leaf.name
        assert spec["description"] == leaf.description, leaf.name
    inputs = build_pipeline().component_spec.inputs or {}
    assert list(inputs) == [leaf.name for leaf in parameters()]
    defaults = {name: spec.default for name, spec in inputs.items()}
    assert Experiment.from_parameters(defaults) == Experiment()
