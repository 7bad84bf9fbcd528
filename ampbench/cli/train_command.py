"""`ampbench train`: one precision arm, by itself or under torchrun, from options or from an
arm's hand-off file (`--config`, as the library's worker reads it)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from ampbench.cli.options import add_experiment_options, add_setting_options
from ampbench.errors import AmpbenchError
from ampbench.settings import described

if TYPE_CHECKING:
    from ampbench.train.launch import HandOff


def add_train(parser: argparse.ArgumentParser) -> None:
    from ampbench.train import PRECISIONS
    from ampbench.train.config import TrainConfig

    parser.description = (
        "Train one precision arm on a prepared dataset; write results.json and "
        "model.pt to the output directory. Runs unchanged under torchrun (one process per GPU, "
        "or gloo between CPU processes): --batch-size is then each process's batch, and rank 0 "
        "writes the outputs, checkpoints and MLflow run."
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="every setting from this file (a local path or s3:// URI), as ampbench hands an arm "
        "to torchrun's processes and a TrainJob's nodes; no other option with it",
    )
    parser.add_argument(
        "--dataset",
        help="a prepared dataset directory, or an s3:// prefix holding one (fetched first); "
        "required without --config",
    )
    parser.add_argument(
        "--precision", choices=PRECISIONS, help="the arm; required without --config"
    )
    parser.add_argument(
        "--output-dir",
        help="a folder, or an s3:// prefix (written once the training ends: how the nodes of a "
        "TrainJob hand the arm back to its pipeline task); required without --config",
    )
    parser.add_argument(
        "--pipeline-run-id", default="", help="the KFP run this training belongs to (MLflow tag)"
    )
    # The recipe and how this process runs it, with TrainConfig's defaults.
    add_setting_options(parser, described(TrainConfig))
    add_experiment_options(parser, sections=("tracking",))
    parser.set_defaults(handler=_train)


def _hand_off(args: argparse.Namespace, defaults: argparse.Namespace) -> HandOff:
    """The arm `ampbench train`'s options state: from --config's file, or from the options."""
    from ampbench.experiment import parameters
    from ampbench.train.config import TrainConfig
    from ampbench.train.launch import HandOff
    from ampbench.train.tracker import TrackingOptions

    flags = {leaf.name: leaf.flag for leaf in parameters()}  # where not the name's
    given = sorted(
        "--" + flags.get(name, name.replace("_", "-"))
        for name, value in vars(args).items()
        if name not in ("config", "handler", "verbose") and value != getattr(defaults, name)
    )
    if args.config is not None:
        if given:
            raise AmpbenchError(f"--config and {', '.join(given)}: give one or the other")
        return HandOff.read(args.config)
    missing = [f"--{name}" for name in ("dataset", "precision", "output-dir")
               if getattr(args, name.replace("-", "_")) is None]  # fmt: skip
    if missing:
        raise AmpbenchError(f"{', '.join(missing)}: required (or --config)")
    tracking = TrackingOptions(args.experiment, args.pipeline_run_id, args.registered_model_name)
    return HandOff(
        TrainConfig.from_inputs(vars(args), Path(args.dataset)),
        args.dataset,
        args.output_dir,
        tracking if args.tracking else None,
    )


def _train(args: argparse.Namespace) -> int:
    from ampbench.cli import build_parser  # which imports this module
    from ampbench.train.launch import results_line, train_hand_off

    arm = _hand_off(args, build_parser(["train"]).parse_args(["train"]))
    results = train_hand_off(arm)
    if results is None:  # under torchrun, rank 0 speaks for the run
        return 0
    print(results_line(results, arm.output_dir))
    return 0
