"""Run the whole pipeline on this machine with the KFP local runner.

Steps run as subprocesses of this Python (SubprocessRunner(use_venv=False)), one after
another, so that the arms never share the CPU or GPU while they are timed.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ampbench import storage
from ampbench.compare.report import render_text
from ampbench.compare.step import CompareOutputs
from ampbench.comparison import Comparison, read_comparison
from ampbench.data.sources import SourceOptions, local_path
from ampbench.errors import ERROR_FILE_ENV, AmpbenchError, read_step_errors
from ampbench.logs import log
from ampbench.pipelines.pipeline import build_pipeline
from ampbench.tracking import (
    TRACKING_URI_ENV,
    compare_runs_url,
    local_store,
    runs_table_url,
    safe_tracking_uri,
    tracking_uri,
    ui_base,
)
from ampbench.train import DEFAULT_DATA

MODELS_DIR = "models"
RUN_LOG = "run.log"
PIPELINE_ROOT = "pipeline-root"  # under the output directory: the steps' outputs
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")  # the runner colours its lines on a terminal
# On the terminal: the steps' own log lines, and the runner's task starts and failures written
# as ampbench writes its lines; the rest (executor_input JSON, artifact reprs, the executor's
# chatter, each success) goes to run.log only.
_SHOWN = re.compile(r"^\s*(\d\d:\d\d:\d\d (INFO|WARNING|ERROR) |ERROR: )")
_RUNNER_LINE = re.compile(
    r"^(\d\d:\d\d:\d\d)\.\d+ - (\w+) - "
    r"(Executing task .*|(Task|Pipeline) .* finished with status (?!SUCCESS).*)$"
)


class _RunnerOutput(io.TextIOBase):
    """Stands in for sys.stdout while the local runner runs: every line into the run's log
    file, the lines a person needs onto the terminal."""

    def __init__(self, log_file: TextIO, terminal: TextIO) -> None:
        self.log_file = log_file
        self.terminal = terminal
        self.pending = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.log_file.write(text)
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            plain = ANSI_ESCAPE.sub("", line).strip()
            runner = _RUNNER_LINE.match(plain)
            if runner:
                self.terminal.write(f"{runner[1]} {runner[2]} {runner[3]}\n")
            elif _SHOWN.match(plain):
                self.terminal.write(plain + "\n")
        self.terminal.flush()
        return len(text)

    def flush(self) -> None:
        self.log_file.flush()
        self.terminal.flush()


@dataclass(frozen=True)
class LocalRun:
    output_dir: Path
    comparison: Comparison
    outputs: CompareOutputs
    pipeline_root: Path
    run_log: Path


def default_output_dir() -> Path:
    return Path("runs") / time.strftime("%Y%m%d-%H%M%S")


def check_source(data: str) -> None:
    """Fail fast, in this process, on a source that cannot work (missing path, offline
    download); a download made here lands in the cache where the prepare step finds it."""
    if data != "synthetic":
        local_path(data, SourceOptions())


def run_local(arguments: dict[str, Any], output_dir: Path | None = None) -> LocalRun:
    """Run the pipeline with `arguments` (pipeline parameters); collect its outputs."""
    from kfp import local

    check_source(arguments.get("data", DEFAULT_DATA))
    output_dir = (output_dir or default_output_dir()).absolute()
    if output_dir.exists() and any(output_dir.iterdir()):
        raise AmpbenchError(f"--output-dir {output_dir}: exists and is not empty")
    pipeline_root = output_dir / PIPELINE_ROOT
    pipeline_root.mkdir(parents=True, exist_ok=True)
    error_file = output_dir / "step-errors.txt"
    # The steps inherit this environment: one tracking store for all, and a place to leave
    # a one-line error that this command repeats at the end.
    os.environ[TRACKING_URI_ENV] = tracking_uri()
    os.environ[ERROR_FILE_ENV] = str(error_file)
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(pipeline_root),
        raise_on_error=True,
    )
    pipeline = build_pipeline(schedule="sequential")
    run_log = output_dir / RUN_LOG
    log.info("run: pipeline outputs under %s; the steps' full logs in %s", pipeline_root, run_log)
    with (
        run_log.open("w", encoding="utf-8") as log_file,
        contextlib.redirect_stdout(_RunnerOutput(log_file, sys.stdout)),
        warnings.catch_warnings(),
    ):
        # The local runner warns that it ignores GPU requests and runs our image's code in
        # this Python rather than in the image: both are what a local run means.
        warnings.filterwarnings("ignore", message=".*custom or non-Python base image")
        warnings.filterwarnings("ignore", message=".*have no effect in the current local runner")
        try:
            task = pipeline(**arguments)
        except RuntimeError as error:
            messages = read_step_errors(error_file)
            if messages:
                raise AmpbenchError(messages[-1]) from None
            raise AmpbenchError(
                f"the pipeline failed ({error}); the step's full log is in {run_log}"
            ) from None
    outputs = CompareOutputs.in_directory(output_dir)
    shutil.copyfile(task.outputs["comparison"].path, outputs.comparison)
    shutil.copyfile(task.outputs["report"].path, outputs.report)
    shutil.copyfile(task.outputs["report_html"].path, outputs.html)
    shutil.copytree(task.outputs["plots"].path, outputs.plots)
    comparison = read_comparison(outputs.comparison)
    collect_models(task.outputs["models"], output_dir / MODELS_DIR)
    return LocalRun(output_dir, comparison, outputs, pipeline_root, run_log)


def collect_models(models: list[Any], directory: Path) -> list[Path]:
    """Copy each training task's state dict (the pipeline's `models` output) into
    `directory`, named by its run (matrix.run_name)."""
    directory.mkdir(parents=True, exist_ok=True)
    copied = []
    for model in models:
        target = directory / f"{model.metadata['run']}.pt"
        shutil.copyfile(model.path, target)
        copied.append(target)
    return copied


def export(run: LocalRun, destination: str) -> list[str]:
    """Copy the report, plots, results and models to an s3:// prefix or a local directory."""
    names = [
        run.outputs.comparison.name,
        run.outputs.report.name,
        run.outputs.html.name,
        run.outputs.plots.name,
        MODELS_DIR,
    ]
    return storage.copy_tree(run.output_dir, destination, names)


def summary_lines(run: LocalRun) -> list[str]:
    """The RESULTS block and where everything went, as `ampbench run` prints them."""
    lines = [render_text(run.comparison), ""]
    lines.append(f"results : {run.outputs.comparison}")
    lines.append(f"report  : {run.outputs.report} (and {run.outputs.html.name}, plots/)")
    lines.append(f"models  : {run.output_dir / MODELS_DIR}")
    lines.append(f"pipeline outputs: {run.pipeline_root}")
    lines.append(
        "traces  : each train task's `trace` output there (and `profile/` in each arm's MLflow "
        "run): gzipped Chrome trace JSON, which Perfetto opens"
    )
    lines.append(f"full logs: {run.run_log}")
    mlflow_info = run.comparison.mlflow
    if mlflow_info:
        lines.append(
            f"MLflow  : {safe_tracking_uri()} (experiment '{mlflow_info['experiment']}', "
            f"parent run {mlflow_info['parent_run_id']})"
        )
        base = ui_base()
        if base is not None:
            address = runs_table_url(base, mlflow_info["experiment_id"])
            served = " (served by `ampbench ui`)" if local_store() else ""
            lines.append(f"runs    : {address}{served}")
            arms = [run_id for run_id in mlflow_info.get("arm_run_ids", "").split(",") if run_id]
            if arms:
                compare = compare_runs_url(base, mlflow_info["experiment_id"], arms)
                lines.append(f"compare : {compare} (the arm runs side by side)")
    return lines
