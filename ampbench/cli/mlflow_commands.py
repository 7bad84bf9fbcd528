"""The commands over the runs tracked in MLflow: `report` (a pipeline run's report, rebuilt from
MLflow alone) and `ui` (the MLflow UI over the local store)."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from ampbench.argtypes import positive_int
from ampbench.cli.options import add_experiment_options
from ampbench.errors import AmpbenchError
from ampbench.tracking import TRACKING_URI_ENV, UI_HOST, UI_PORT

UI_LOG = "mlflow-ui.log"  # in the current directory, beside the default store: the server's lines


# -- report -------------------------------------------------------------------------------------
def add_report(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Download the arm runs' results of a pipeline run from MLflow and write the "
        "comparison again (results.json, report.md, report.html, plots/)."
    )
    add_experiment_options(parser, names=("experiment",))
    parser.add_argument("--parent-run-id", help="the pipeline run's parent run (default: newest)")
    parser.add_argument(
        "--output-dir", type=Path, default=Path("report"), help="where to write the report"
    )
    add_experiment_options(parser, names=("allow_mismatch",))
    parser.set_defaults(handler=_report)


def _report(args: argparse.Namespace) -> int:
    from ampbench.compare.report import render_text
    from ampbench.compare.step import CompareOutputs, run_comparison
    from ampbench.parent_run import download_arm_results

    with tempfile.TemporaryDirectory() as downloads:
        parent, baseline, arms = download_arm_results(
            args.experiment, args.parent_run_id, Path(downloads)
        )
        outputs = CompareOutputs.in_directory(args.output_dir)
        comparison = run_comparison(
            arms, outputs, baseline=baseline, allow_mismatch=args.allow_mismatch
        )
    print(render_text(comparison))
    print(f"\nreport of MLflow run {parent} -> {outputs.report} ({outputs.html.name}, plots/)")
    return 0


# -- ui -----------------------------------------------------------------------------------------
def add_ui(parser: argparse.ArgumentParser) -> None:
    parser.description = f"Start the MLflow UI on {UI_HOST} over the tracking store that runs use."
    parser.add_argument("--port", type=positive_int, default=UI_PORT, help=f"port on {UI_HOST}")
    add_experiment_options(parser, names=("experiment",))
    parser.set_defaults(handler=_ui)


def _ui(args: argparse.Namespace) -> int:
    from ampbench.parent_run import find_experiment_id, newest_arm_runs
    from ampbench.tracking import (
        compare_runs_url,
        local_store,
        local_ui_base,
        runs_table_url,
        safe_tracking_uri,
        tracking_uri,
    )

    uri = tracking_uri()
    if not local_store():
        raise AmpbenchError(
            f"{TRACKING_URI_ENV} is {safe_tracking_uri()}: open that server's own UI instead"
        )
    base = local_ui_base(args.port)
    _check_port_free(args.port)
    # Read before the server starts: two processes creating a fresh store's tables would race.
    experiment_id = find_experiment_id(args.experiment)
    newest = newest_arm_runs(args.experiment) if experiment_id is not None else None
    server_log = Path(UI_LOG).absolute()
    print(f"MLflow UI on {base} ({uri}); its request log in {server_log}; Ctrl-C stops it")
    if experiment_id is None:
        print(f"experiment '{args.experiment}' has no runs in this store yet")
    else:
        print(f"runs of experiment '{args.experiment}': {runs_table_url(base, experiment_id)}")
    if newest is not None:
        print(f"its newest pipeline run's arms side by side: {compare_runs_url(base, *newest)}")
    # One worker: one person browsing. The server and its worker get a process group of their
    # own, so that stopping this command (Ctrl-C, SIGTERM, SIGHUP) stops all of them.
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri]
    command += ["--host", UI_HOST, "--port", str(args.port), "--workers", "1"]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with server_log.open("ab") as log_file:
        server = subprocess.Popen(
            command, env=env, start_new_session=True, stdout=log_file, stderr=log_file
        )

    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop)
    try:
        code = server.wait()
    finally:
        _stop_group(server)
    # Only a signal to this command stops a UI that works (it raises KeyboardInterrupt above).
    raise AmpbenchError(f"the MLflow UI server on {base} stopped by itself (exit code {code})")


def _check_port_free(port: int) -> None:
    """A one-line error for a taken --port: MLflow's server only logs it and exits 0."""
    import socket

    with socket.socket() as probe:
        try:
            probe.bind((UI_HOST, port))
        except OSError as error:
            raise AmpbenchError(
                f"--port {port}: cannot serve there ({error.strerror}); pass another --port"
            ) from None


def _stop_group(process: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM to a child's process group, SIGKILL to what is left after grace_s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # workers that outlived their parent
    process.wait()
