"""The command lines the KFP launcher runs for the pipeline's three steps, for `make
image-check`: each executor's command and arguments from the compiled pipeline, with `{{$}}`
replaced by an executor input as the KFP driver writes it (the component's defaults, these
parameter values, artifacts as minio:// URIs, which the executor maps to /minio/...).

    python scripts/kfp_step_commands.py IMAGE DATA OUT
writes OUT/1-prepare.argv, 2-train-fp32.argv, ...: each command's arguments, NUL-separated.

Runs here, where the pipeline compiles; the commands run inside the image.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from ampbench.matrix import runs_of_lists
from ampbench.pipelines.compile import compile_pipeline
from ampbench.train.config import TrainConfig

ROOT = "minio://mlpipeline/v2/artifacts/image-check"
RUNS = runs_of_lists(["small-cnn"], [64])  # the default pair, fp32 and amp


def artifact(name: str, schema: str, uri: str) -> dict[str, Any]:
    return {"name": name, "type": {"schemaTitle": schema}, "uri": uri, "metadata": {}}


def executor_input(
    component: dict[str, Any],
    task: str,
    parameters: dict[str, Any],
    inputs: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    definitions = component["inputDefinitions"].get("parameters", {})
    # The driver sends protobuf Values as JSON, where a whole number has no ".0" (the
    # compiled YAML writes integer defaults as floats).
    values = {
        name: int(spec["defaultValue"])
        if spec["parameterType"] == "NUMBER_INTEGER"
        else spec["defaultValue"]
        for name, spec in definitions.items()
        if "defaultValue" in spec
    }
    values.update(parameters)
    outputs = component.get("outputDefinitions", {}).get("artifacts", {})
    return {
        "inputs": {
            "parameterValues": values,
            "artifacts": {name: {"artifacts": found} for name, found in inputs.items()},
        },
        "outputs": {
            "artifacts": {
                name: {
                    "artifacts": [
                        artifact(name, spec["artifactType"]["schemaTitle"], f"{ROOT}/{task}/{name}")
                    ]
                }
                for name, spec in outputs.items()
            },
            "outputFile": f"/tmp/outputs/{task}/executor_output.json",
        },
    }


def main() -> None:
    image, data, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    with tempfile.TemporaryDirectory() as tmp:
        path = compile_pipeline(Path(tmp) / "pipeline.yaml", image, "sequential")
        spec = next(yaml.safe_load_all(path.read_text()))
    components, executors = spec["components"], spec["deploymentSpec"]["executors"]

    def call(step: str, task: str, parameters: dict[str, Any], inputs: dict[str, Any]) -> dict:
        container = executors[f"exec-{step}"]["container"]
        given = json.dumps(executor_input(components[f"comp-{step}"], task, parameters, inputs))
        argv = [*container["command"], *(given if a == "{{$}}" else a for a in container["args"])]
        return {"step": task, "argv": argv}

    dataset = artifact("dataset", "system.Dataset", f"{ROOT}/prepare/dataset")
    prepared = {"data": data, "subset": 512, "runs": RUNS, "epochs": 1, "lr": TrainConfig.lr}
    calls = [call("prepare", "prepare", prepared, {})]
    results = []
    for run in RUNS:
        task = f"train-{run['precision']}"
        parameters = {
            "precision": run["precision"],
            "model_name": run["model"],
            "batch_size": run["batch_size"],
            "epochs": 1,
            "allow_emulated": True,
            "tracking": False,
        }
        calls.append(call("train", task, parameters, {"dataset": [dataset]}))
        results.append(artifact("results", "system.Artifact", f"{ROOT}/{task}/results"))
    calls.append(call("compare", "compare", {"tracking": False}, {"results": results}))
    out.mkdir(parents=True, exist_ok=True)
    for number, found in enumerate(calls, 1):
        (out / f"{number}-{found['step']}.argv").write_text("\0".join(found["argv"]) + "\0")


if __name__ == "__main__":
    main()
