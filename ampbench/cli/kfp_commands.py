"""`ampbench submit` and `ampbench upload`: their options and what they do.

`submit` compiles the pipeline, creates a run from it (in a KFP experiment) and can wait for the
run to finish; `upload` stores the pipeline, or a new version of it, on the server.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from ampbench import PIPELINE_NAME
from ampbench.argtypes import positive_number, seed_list
from ampbench.cli.options import add_matrix_options
from ampbench.cli.parameter_options import add_pipeline_options, dest
from ampbench.errors import AmpbenchError
from ampbench.pipelines.client import (
    KF_PIPELINES_ENDPOINT_ENV,
    KF_PIPELINES_SA_TOKEN_ENV,
    KF_PIPELINES_SA_TOKEN_PATH,
    make_client,
)
from ampbench.pipelines.compile import add_build_options
from ampbench.pipelines.submit import (
    DEFAULT_KFP_EXPERIMENT,
    DEFAULT_POLL_INTERVAL_S,
    KF_PIPELINES_DEFAULT_EXPERIMENT_NAME,
    submit_run,
    timestamp,
    upload_pipeline,
)


def _add_connection_options(parser: argparse.ArgumentParser) -> None:
    connection = parser.add_argument_group("Kubeflow Pipelines")
    connection.add_argument(
        "--host",
        help=f"the KFP API endpoint, e.g. http://localhost:8888 (default: "
        f"${KF_PIPELINES_ENDPOINT_ENV})",
    )
    connection.add_argument("--namespace", help="profile namespace (multi-user deployments)")
    connection.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="a file holding the bearer token (default: the pod's service-account token, "
        f"${KF_PIPELINES_SA_TOKEN_ENV} or {KF_PIPELINES_SA_TOKEN_PATH}, if there is one)",
    )


class RenamedOption(argparse.Action):
    """An option's old spelling: refused in one line naming the new one."""

    def __init__(self, *args: Any, new: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any, **_kwargs: Any) -> None:
        parser.error(f"{self.option_strings[0]} is now {self.new}")


def add_submit(submit: argparse.ArgumentParser) -> None:
    from ampbench.experiment import parameters

    submit.description = (
        "Compile the pipeline and start a run of it on a Kubeflow Pipelines "
        "server, in a KFP experiment; with --wait, follow it until it ends."
    )
    _add_connection_options(submit)
    run = submit.add_argument_group("the run")
    run.add_argument(
        "--kfp-experiment",
        metavar="NAME",
        help="Kubeflow Pipelines experiment, created if missing (default: "
        f"${KF_PIPELINES_DEFAULT_EXPERIMENT_NAME} or {DEFAULT_KFP_EXPERIMENT}); --experiment is "
        "MLflow's, as in every command",
    )
    run.add_argument(
        "--mlflow-experiment",
        action=RenamedOption,
        help=argparse.SUPPRESS,
        new="--experiment (the MLflow experiment, as in every command; Kubeflow's is "
        "--kfp-experiment)",
    )
    run.add_argument("--run-name", help="default: ampbench and the date and time")
    run.add_argument(
        "--wait", action="store_true", help="wait for the run; fail unless it succeeds"
    )
    run.add_argument(
        "--timeout", type=positive_number, metavar="S", help="with --wait: give up after S s"
    )
    run.add_argument(
        "--poll-interval",
        type=positive_number,
        default=DEFAULT_POLL_INTERVAL_S,
        metavar="S",
        help="with --wait: seconds between polls",
    )
    add_build_options(submit)
    matrix = add_matrix_options(
        submit,
        "Make the `runs` parameter: every model x batch size x precision x seed, each (model, "
        "batch size) group with its own baseline arm; a list not given keeps the default "
        "experiment's single value.",
    )
    matrix.add_argument("--seeds", type=seed_list, metavar="LIST", help="e.g. 0,1,2")
    add_pipeline_options(submit, parameters())
    submit.set_defaults(handler=_submit)


def add_upload(upload: argparse.ArgumentParser) -> None:
    upload.description = (
        "Compile the pipeline and upload it to a Kubeflow Pipelines server: a new "
        "pipeline, or a new version of the pipeline of that name."
    )
    _add_connection_options(upload)

    upload.add_argument("--name", default=PIPELINE_NAME, help="pipeline name")
    upload.add_argument(
        "--version",
        dest="version_name",
        metavar="VERSION",
        help="name of the new version of an existing pipeline (default: the pipeline name, "
        "ampbench version, date and time)",
    )
    upload.add_argument("--description", help="default: the pipeline's own description")
    add_build_options(upload)
    upload.set_defaults(handler=_upload)


def _run_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The pipeline parameters given as options, and `runs` made from the matrix lists."""
    from ampbench.experiment import parameters
    from ampbench.matrix import runs_of_lists
    from ampbench.train import BASELINE_PRECISION

    arguments = {
        parameter.name: getattr(args, dest(parameter))
        for parameter in parameters()
        if hasattr(args, dest(parameter))
    }
    lists = (args.models, args.batch_sizes, args.precisions, args.seeds)
    if any(values is not None for values in lists):
        if "runs" in arguments:
            raise AmpbenchError("--runs and --models/--batch-sizes/--precisions/--seeds: give one")
        baseline = arguments.get("baseline_precision", BASELINE_PRECISION)
        arguments["runs"] = runs_of_lists(*lists, baseline)
    return arguments


def _preflight(arguments: dict[str, Any]) -> None:
    """The checks `run` makes too, on the experiment the run will have (the parameters not
    sent keep the pipeline's defaults, which are the experiment's)."""
    from ampbench.experiment import Experiment
    from ampbench.preflight import preflight

    given = {name: value for name, value in arguments.items() if value is not None}
    preflight(Experiment.from_parameters(given), "submit")


def _submit(args: argparse.Namespace) -> int:
    from ampbench.pipelines.compile import compile_pipeline

    if args.timeout is not None and not args.wait:
        raise AmpbenchError("--timeout applies to --wait only")
    arguments = _run_arguments(args)
    _preflight(arguments)
    client = make_client(args.host, args.namespace, args.token_file)
    run_name = args.run_name or f"{PIPELINE_NAME} {timestamp()}"
    with tempfile.TemporaryDirectory(prefix="ampbench-submit-") as tmp:
        package = compile_pipeline(Path(tmp) / "ampbench.yaml", args.image, args.schedule)
        run = submit_run(
            client,
            pipeline_file=package,
            experiment=args.kfp_experiment,
            run_name=run_name,
            arguments=arguments,
            namespace=args.namespace,
            wait=args.wait,
            timeout=args.timeout,
            poll_interval=args.poll_interval,
        )
    if run.state is None:
        print(f"submitted run '{run.run_name}' ({run.run_id}): {run.url}")
    else:
        print(f"run '{run.run_name}' ({run.run_id}) {run.state}: {run.url}")
    return 0


def _upload(args: argparse.Namespace) -> int:
    from ampbench.pipelines.compile import compile_pipeline
    from ampbench.pipelines.pipeline import build_pipeline

    client = make_client(args.host, args.namespace, args.token_file)
    with tempfile.TemporaryDirectory(prefix="ampbench-upload-") as tmp:
        package = compile_pipeline(Path(tmp) / "ampbench.yaml", args.image, args.schedule)
        uploaded = upload_pipeline(
            client,
            pipeline_file=package,
            name=args.name,
            version=args.version_name,
            description=args.description or build_pipeline().description,
            namespace=args.namespace,
        )
    if uploaded.version_id is None:
        print(
            f"uploaded pipeline '{uploaded.pipeline_name}' ({uploaded.pipeline_id}): {uploaded.url}"
        )
    else:
        print(
            f"uploaded version '{uploaded.version_name}' ({uploaded.version_id}) of pipeline "
            f"'{uploaded.pipeline_name}' ({uploaded.pipeline_id}): {uploaded.url}"
        )
    return 0
