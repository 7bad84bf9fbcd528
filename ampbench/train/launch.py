"""Training in several processes, on the engines that exist for it: torchrun in one pod (one
process per GPU), Kubeflow Trainer across nodes (trainjob.py, trainjob_run.py). Both run
worker.py with the arm's HandOff, and both leave the arm's outputs where the train step reads
them back."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import shutil
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ampbench import storage
from ampbench.cluster import CHECKPOINT_URI_ENV
from ampbench.errors import ERROR_FILE_ENV, AmpbenchError, read_step_errors, step_error_message
from ampbench.logs import log
from ampbench.process import environment
from ampbench.results import (
    RESULTS_FILE,
    ArmResults,
    RequestedResources,
    read_arm_results,
    write_json,
)
from ampbench.train import worker
from ampbench.train.config import TrainConfig
from ampbench.train.profile import TRACE_FILE
from ampbench.train.tracker import TrackingOptions
from ampbench.train.trainjob import TrainJobSpec
from ampbench.world import world_from_env

MODEL_FILE = "model.pt"
HAND_OFF_FILE = "train.json"


@dataclass(frozen=True)
class HandOff:
    """What worker.py (and `ampbench train --config`) reads: an arm handed to other processes
    (torchrun's) or nodes (a TrainJob's) as one file. dataset: where they read the data set
    (an s3:// prefix for other nodes), which config.dataset_dir, a local path, cannot say."""

    config: TrainConfig
    dataset: str
    output_dir: str
    tracking: TrackingOptions | None

    def to_json(self) -> str:
        settings = dataclasses.asdict(self.config)
        del settings["dataset_dir"]
        tracking = None if self.tracking is None else dataclasses.asdict(self.tracking)
        body = {"dataset": self.dataset, "output_dir": self.output_dir}
        return json.dumps({**body, "config": settings, "tracking": tracking}, indent=1)

    @classmethod
    def read(cls, location: str) -> HandOff:
        """The hand-off at a local path or s3:// URI, or a one-line error naming it."""
        try:
            body = json.loads(storage.read_bytes(location))
            tracking = body["tracking"]
            return cls(
                TrainConfig(Path(body["dataset"]), **body["config"]),
                body["dataset"],
                body["output_dir"],
                None if tracking is None else TrackingOptions(**tracking),
            )
        except OSError as error:
            raise AmpbenchError(f"--config {location}: cannot be read ({error})") from None
        except KeyError as error:
            raise AmpbenchError(
                f"--config {location}: not an arm's hand-off from this ampbench (no {error})"
            ) from None
        except (ValueError, TypeError) as error:
            raise AmpbenchError(
                f"--config {location}: not an arm's hand-off from this ampbench ({error})"
            ) from None

    def write(self, location: str) -> str:
        """The hand-off to a folder, or an s3:// prefix; its location."""
        target = storage.join(location, HAND_OFF_FILE)
        with tempfile.TemporaryDirectory(prefix="ampbench-hand-off-") as tmp:
            local = Path(tmp) / HAND_OFF_FILE
            local.write_text(self.to_json(), encoding="utf-8")
            storage.copy_file(local, target)
        return target


def train_hand_off(arm: HandOff) -> ArmResults | None:
    """Train the arm `ampbench train` was given (options or a hand-off file): the data set
    fetched first where it is on S3, the outputs copied to S3 where they go there (as a
    TrainJob's nodes hand the arm back). Its results; None on every rank but rank 0."""
    from ampbench.train.step import run_training

    for location in (arm.dataset, arm.output_dir):
        if storage.is_s3(location):
            storage.split_s3(location)  # a malformed URI fails now, not after the training
    with contextlib.ExitStack() as stack:

        def scratch(prefix: str) -> Path:
            return Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))

        dataset = Path(arm.dataset)
        if storage.is_s3(arm.dataset):
            dataset = storage.fetch_tree(arm.dataset, scratch("ampbench-dataset-"))[0]
        local = scratch("ampbench-train-") if storage.is_s3(arm.output_dir) else None
        output_dir = local or Path(arm.output_dir)
        results = run_training(
            dataclasses.replace(arm.config, dataset_dir=dataset),
            output_dir / RESULTS_FILE,
            output_dir / MODEL_FILE,
            arm.tracking,
            trace_path=output_dir / TRACE_FILE,
        )
        if not world_from_env().main:
            return None
        if local is not None:
            written = [RESULTS_FILE, MODEL_FILE] + ([TRACE_FILE] if results.profile else [])
            storage.copy_tree(local, arm.output_dir, written)
    return results


def results_line(results: ArmResults, output_dir: str) -> str:
    """An arm's results in one line, as its training process ends."""
    return (
        f"{results.precision.requested} ({results.precision.support}): accuracy "
        f"{results.accuracy:.4f}, {results.timing.throughput_img_s:,.1f} images/s, "
        f"{results.timing.train_time_s:.2f} s training, {results.memory.train_peak_mb:,.1f} MB "
        f"training peak -> {storage.join(output_dir, RESULTS_FILE)}"
    )


# The signals torchrun's agent handles while it runs, leaving its handlers installed after.
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def torchrun(processes: int, hand_off: str) -> None:
    """The worker on this hand-off in `processes` local processes, through torchrun's Python
    entry point (standalone rendezvous: one pod). A failed process ends them all, and this
    call in one line with the processes' first error; a signal ends them too, and this call as
    KeyboardInterrupt (SIGINT) or exit status 128+N (the others)."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    handled = ",".join(signum.name for signum in HANDLED_SIGNALS)
    launcher = ["--standalone", f"--nproc-per-node={processes}", f"--signals-to-handle={handled}"]
    launch = get_args_parser().parse_args(
        [*launcher, "--module", worker.__name__, "--config", hand_off]
    )
    log.info("torchrun: %d training processes", processes)
    handlers = {signum: signal.getsignal(signum) for signum in HANDLED_SIGNALS}
    with tempfile.TemporaryDirectory(prefix="ampbench-torchrun-") as tmp:
        errors = Path(tmp) / "errors"
        try:
            # The processes record their errors here, not where the step records its own: the
            # step's error, made of theirs, is the one to report.
            with environment({ERROR_FILE_ENV: str(errors)}):
                run(launch)
        except ChildFailedError as error:
            rank, failure = error.get_first_failure()
            reasons = [step_error_message(line) for line in read_step_errors(errors)]
            raise AmpbenchError(
                f"torchrun: training process {rank} of {processes} failed (exit code "
                f"{failure.exitcode})"
                + (f": {reasons[0]}" if reasons else "; its error is in the log above")
            ) from None
        except SignalException as error:
            # The processes are stopped; Ctrl-C ends this one as it ends any ampbench command.
            if error.sigval == signal.SIGINT:
                raise KeyboardInterrupt from None
            raise SystemExit(128 + error.sigval) from None
        finally:
            for signum, handler in handlers.items():
                # None: not set from Python. Off the main thread the agent could not change
                # them, nor could this.
                if handler is not None and signal.getsignal(signum) is not handler:
                    signal.signal(signum, handler)


def collect_outputs(
    location: str,
    results_path: Path,
    model_path: Path,
    requested_resources: RequestedResources | None,
    trace_path: Path | None = None,
) -> ArmResults:
    """The arm's results, model and trace (where it profiled) from where the training
    processes wrote them (a local folder or an s3:// prefix) to the train step's outputs, with
    the resources it requested."""
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
        if trace_path is not None and results.profile is not None and results.profile.trace:
            trace_path.parent.mkdir(parents=True, exist_ok=True)
            trace_path.write_bytes(storage.read_bytes(storage.join(location, TRACE_FILE)))
    return results


def train_in_processes(
    config: TrainConfig,
    processes: int,
    results_path: Path,
    model_path: Path,
    tracking: TrackingOptions | None,
    requested_resources: RequestedResources | None = None,
    trace_path: Path | None = None,
) -> ArmResults:
    """Train one arm in `processes` processes of this machine (torchrun, one per GPU, or gloo
    between CPU processes where there is no GPU)."""
    with tempfile.TemporaryDirectory(prefix="ampbench-torchrun-") as out:
        hand_off = HandOff(config, str(config.dataset_dir), out, tracking).write(out)
        torchrun(processes, hand_off)
        return collect_outputs(out, results_path, model_path, requested_resources, trace_path)


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
    trace_path: Path | None = None,
) -> ArmResults:
    """Train one arm on job.num_nodes nodes through a Kubeflow Trainer TrainJob (trainjob.py).

    shared: a location every node and this task can reach (an s3:// prefix in a cluster; a
    local folder only where the "nodes" share this machine's disk, as in the tests): the
    prepared data set goes there for the nodes, and node 0's rank 0 writes the arm's outputs
    there for this task to collect. The TrainJob ends itself after job.active_deadline_s, and
    this task stops waiting for it then.
    """
    from ampbench.train.trainjob import manifest
    from ampbench.train.trainjob_run import TrainJobRun, in_cluster_client

    if not shared:
        raise AmpbenchError(
            f"num_nodes {job.num_nodes}: needs checkpoint_dir (or the ConfigMap's "
            f"{CHECKPOINT_URI_ENV}), an s3:// prefix every node can reach, to hand the data "
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
    hand_off = HandOff(config, dataset, outputs, tracking).write(shared)
    job = dataclasses.replace(job, arguments=["--config", hand_off])
    TrainJobRun(api_client).run(manifest(job), job.active_deadline_s)
    return collect_outputs(outputs, results_path, model_path, requested_resources, trace_path)
