"""The commands over the whole pipeline here: `run` (with the KFP local runner) and `compile`
(`submit` and `upload`, to Kubeflow Pipelines, have a module of their own)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from ampbench import storage
from ampbench.argtypes import seed_list
from ampbench.cli.options import (
    add_comparison_options,
    add_experiment_options,
    add_matrix_options,
    add_setting_options,
)
from ampbench.errors import AmpbenchError

if TYPE_CHECKING:
    from ampbench.experiment import Experiment


# -- run ----------------------------------------------------------------------------------------
def add_run(parser: argparse.ArgumentParser) -> None:
    from ampbench.settings import described
    from ampbench.train import AMP_PRECISION, PRECISIONS
    from ampbench.train.config import TrainConfig

    parser.description = (
        "Run prepare -> train(fp32) || train(amp) -> compare through the KFP local "
        "runner, track the runs in MLflow, and print the RESULTS block."
    )
    add_experiment_options(parser, sections=("dataset", "training", "tracking"))
    # One run's model and batch size, as `ampbench train` takes them (each a list below).
    add_setting_options(
        parser, [each for each in described(TrainConfig) if each.name in ("model", "batch_size")]
    )
    # Unset: automatic (train.config.automatic_batch_size, from the training split).
    parser.set_defaults(batch_size=None)
    seeds = parser.add_mutually_exclusive_group()
    seed = next(each for each in described(TrainConfig) if each.name == "seed")
    seeds.add_argument("--seed", type=int, help=f"{seed.description} (default {seed.default})")
    seeds.add_argument("--seeds", type=seed_list, help="several seeds, e.g. 0,1,2")
    parser.add_argument(
        "--precision", choices=PRECISIONS, default=AMP_PRECISION, help="the mixed-precision arm"
    )
    add_matrix_options(
        parser,
        "Several arms in one run: every model x batch size x precision x seed is a training "
        "task, and each (model, batch size) group gets its own baseline arm. Each list replaces "
        "its single-value option.",
    )
    add_comparison_options(parser)
    parser.add_argument("--output-dir", type=Path, help="default: runs/<timestamp>")
    parser.add_argument(
        "--export",
        metavar="URI",
        help="also copy report, plots, results and models to s3://bucket/prefix or a directory",
    )
    parser.set_defaults(handler=_run)


def _one_or_list(args: argparse.Namespace, single: str, plural: str, default: object) -> list:
    """The list option if given, else the single one; both given is a mistake (unless the
    single one is at its default, which argparse cannot tell from an explicit one)."""
    values = getattr(args, plural)
    if values is None:
        return [getattr(args, single)]
    if getattr(args, single) != default:
        raise AmpbenchError(
            f"--{single.replace('_', '-')} and --{plural.replace('_', '-')}: give one of them"
        )
    return values


def _matrix_runs(args: argparse.Namespace) -> list[dict[str, str | int]]:
    """The training tasks the options state: each single-value option or its list."""
    from ampbench.matrix import runs_of_lists
    from ampbench.train import AMP_PRECISION
    from ampbench.train.config import AUTOMATIC_BATCH, TrainConfig

    models = _one_or_list(args, "model", "models", TrainConfig.model)
    if args.batch_size is None and args.batch_sizes is None:
        batch_sizes = [AUTOMATIC_BATCH]  # each train task fits it to the data it reads
    else:
        batch_sizes = _one_or_list(args, "batch_size", "batch_sizes", None)
    precisions = _one_or_list(args, "precision", "precisions", AMP_PRECISION)
    seeds = args.seeds or ([args.seed] if args.seed is not None else None)
    return runs_of_lists(models, batch_sizes, precisions, seeds, args.baseline_precision)


def _experiment(args: argparse.Namespace, runs: list[dict[str, str | int]]) -> Experiment:
    """The experiment the options state: each option given a value under a leaf's name, and
    the matrix's runs; the rest at the tree's defaults."""
    from ampbench.experiment import Experiment

    given = {name: value for name, value in vars(args).items() if value is not None}
    return Experiment.from_inputs(given, runs=runs)


def _run(args: argparse.Namespace) -> int:
    from ampbench.pipelines.local import export, run_local, summary_lines
    from ampbench.preflight import preflight

    experiment = _experiment(args, _matrix_runs(args))
    preflight(experiment, "run")
    if args.export and storage.is_s3(args.export):
        storage.split_s3(args.export)  # a malformed URI fails now, not after the training
    run = run_local(experiment.parameters(), args.output_dir)
    print("\n".join(summary_lines(run)))
    if args.export:
        written = export(run, args.export)
        print(f"exported {len(written)} files to {args.export}")
    return 0


# -- compile ------------------------------------------------------------------------------------
def add_compile(parser: argparse.ArgumentParser) -> None:
    from ampbench.pipelines.compile import DEFAULT_OUTPUT, add_build_options

    parser.description = "Compile the pipeline."
    parser.add_argument(
        "-o", "--output", type=Path, default=DEFAULT_OUTPUT, help="where to write the YAML"
    )
    add_build_options(parser)
    parser.set_defaults(handler=_compile)


def _compile(args: argparse.Namespace) -> int:
    from ampbench.pipelines.compile import compile_pipeline

    path = compile_pipeline(args.output, args.image, args.schedule)
    print(f"wrote {path} (image {args.image}, {args.schedule} schedule)")
    return 0
