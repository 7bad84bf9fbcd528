"""Training in several processes, on the engines that exist for it: torchrun in one pod (one
process per GPU), Kubeflow Trainer across nodes (trainjob.py). Both run the same `ampbench
train` command line, built here from a TrainConfig, and both leave the arm's outputs where
the train step reads them back.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ampbench import storage
from ampbench.errors import AmpbenchError
from ampbench.logs import log
from ampbench.results import (
    RESULTS_FILE,
    ArmResults,
    RequestedResources,
    read_arm_results,
    write_json,
)
from ampbench.train.config import TrainConfig
from ampbench.train.step import TrackingOptions
from ampbench.train.trainjob import DEFAULT_TIMEOUT_S, TrainJobSpec

MODEL_FILE = "model.pt"


def train_arguments(
    config: TrainConfig,
    output_dir: str,
    tracking: TrackingOptions | None,
    dataset: str | None = None,
) -> list[str]:
    """`ampbench train`'s arguments for `config` (after the command name): the settings that
    differ from TrainConfig's defaults, as the command's options spell them. dataset: where
    the processes read the data set (an s3:// prefix for other nodes), if not dataset_dir."""
    arguments = ["--dataset", dataset or str(config.dataset_dir), "--output-dir", output_dir]
    defaults = TrainConfig(Path())
    for field in dataclasses.fields(TrainConfig):
        value = getattr(config, field.name)
        # precision: required by the command, whatever its default.
        unstated = field.name != "precision" and value == getattr(defaults, field.name)
        if field.name == "dataset_dir" or unstated:
            continue
        option = "--" + field.name.replace("_", "-")
        if isinstance(value, bool):  # a default True is turned off by its --no- form
            arguments.append(option if value else "--no-" + option.removeprefix("--"))
        elif value is not None:
            arguments += [option, str(value)]
    if tracking is None:
        return [*arguments, "--no-tracking"]
    arguments += ["--experiment", tracking.experiment]
    if tracking.pipeline_run_id:
        arguments += ["--pipeline-run-id", tracking.pipeline_run_id]
    if tracking.registered_model_name:
        arguments += ["--register-model", tracking.registered_model_name]
    return arguments


def torchrun(processes: int, arguments: list[str]) -> None:
    """`ampbench train` with these arguments in `processes` local processes, through torchrun's
    Python entry point (standalone rendezvous: one pod). A failed process ends them all; its
    own error line is in the log above this one."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    launcher = ["--standalone", f"--nproc-per-node={processes}", "--module", "ampbench.cli"]
    launch = get_args_parser().parse_args([*launcher, "train", *arguments])
    log.info("torchrun: %d training processes", processes)
    try:
        run(launch)
    except ChildFailedError as error:
        rank, failure = error.get_first_failure()
        raise AmpbenchError(
            f"torchrun: training process {rank} of {processes} failed (exit code "
            f"{failure.exitcode}); its error is in the log above"
        ) from None


def collect_outputs(
    location: str,
    results_path: Path,
    model_path: Path,
    requested_resources: RequestedResources | None,
) -> ArmResults:
    """The arm's results and model from where the training processes wrote them (a local
    folder or an s3:// prefix) to the train step's outputs, with the resources it requested."""
    with tempfile.TemporaryDirectory(prefix="ampbench-outputs-") as tmp:
        local = Path(tmp)
        for name in (RESULTS_FILE, MODEL_FILE):
            source = storage.join(location, name)
            try:
                data = storage.read_bytes(source)
            except (AmpbenchError, OSError) as error:
                raise AmpbenchError(f"{source}: the training left no {name} ({error})") from None
            (local / name).write_bytes(data)
        results = read_arm_results(local / RESULTS_FILE)
        if requested_resources is not None:
            results = dataclasses.replace(results, requested_resources=requested_resources)
        write_json(results_path, results)
        model_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local / MODEL_FILE, model_path)
    return results


def train_in_processes(
    config: TrainConfig,
    processes: int,
    results_path: Path,
    model_path: Path,
    tracking: TrackingOptions | None,
    requested_resources: RequestedResources | None = None,
) -> ArmResults:
    """Train one arm in `processes` processes of this machine (torchrun, one per GPU, or gloo
    between CPU processes where there is no GPU)."""
    with tempfile.TemporaryDirectory(prefix="ampbench-torchrun-") as out:
        torchrun(processes, train_arguments(config, out, tracking))
        return collect_outputs(out, results_path, model_path, requested_resources)


def trainjob_name(pipeline_run_id: str, run: str) -> str:
    """A TrainJob name (a DNS label, as JobSet's pods and Services need) for one run of one
    pipeline run: a retried task finds its predecessor's TrainJob under it and replaces it."""
    digest = hashlib.sha256(f"{pipeline_run_id}\0{run}".encode()).hexdigest()[:16]
    return f"ampbench-{digest}"


def train_on_nodes(
    config: TrainConfig,
    job: TrainJobSpec,
    shared: str,
    results_path: Path,
    model_path: Path,
    tracking: TrackingOptions | None,
    requested_resources: RequestedResources | None = None,
    api_client: Any = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> ArmResults:
    """Train one arm on job.num_nodes nodes through a Kubeflow Trainer TrainJob (trainjob.py).

    shared: a location every node and this task can reach (an s3:// prefix in a cluster; a
    local folder only where the "nodes" share this machine's disk, as in the tests): the
    prepared data set goes there for the nodes, and node 0's rank 0 writes the arm's outputs
    there for this task to collect. The TrainJob ends itself after timeout_s.
    """
    from ampbench.train.trainjob import TrainJobRun, in_cluster_client, manifest

    if not shared:
        raise AmpbenchError(
            f"num_nodes {job.num_nodes}: needs checkpoint_dir (or the ConfigMap's "
            "AMPBENCH_CHECKPOINT_URI), an s3:// prefix every node can reach, to hand the data "
            "set to the nodes and the arm's outputs back"
        )
    dataset = storage.join(shared, "dataset")
    if storage.is_s3(shared):
        storage.copy_tree(Path(config.dataset_dir), dataset)
    else:
        shutil.copytree(config.dataset_dir, dataset, dirs_exist_ok=True)
    outputs = storage.join(shared, "outputs")
    if api_client is None:
        api_client, namespace = in_cluster_client()
        job = dataclasses.replace(job, namespace=job.namespace or namespace)
    arguments = train_arguments(config, outputs, tracking, dataset)
    job = dataclasses.replace(job, arguments=arguments, active_deadline_s=int(timeout_s))
    TrainJobRun(api_client).run(manifest(job), timeout_s)
    return collect_outputs(outputs, results_path, model_path, requested_resources)
