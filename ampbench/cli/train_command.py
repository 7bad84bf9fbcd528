"""`ampbench train`: one precision arm, by itself or as one of torchrun's processes or a
TrainJob's nodes (those get the arm as a hand-off file, `--config`)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ampbench import storage
from ampbench.argtypes import non_negative_int, positive_int
from ampbench.cli.options import add_training_options
from ampbench.errors import AmpbenchError
from ampbench.world import world_from_env

if TYPE_CHECKING:
    from ampbench.train.launch import HandOff


def add_train(commands: argparse._SubParsersAction) -> None:
    from ampbench.train import PRECISIONS

    parser = commands.add_parser(
        "train",
        help="run the train step by itself",
        description="Train one precision arm on a prepared dataset; write results.json and "
        "model.pt to the output directory. Runs unchanged under torchrun (one process per GPU, "
        "or gloo between CPU processes): --batch-size is then each process's batch, and rank 0 "
        "writes the outputs, checkpoints and MLflow run.",
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
    parser.add_argument("--register-model", metavar="NAME", help="register the model in MLflow")
    add_training_options(parser)
    _add_recipe_options(parser)
    _add_execution_options(parser)
    parser.set_defaults(handler=_train)


def _add_recipe_options(parser: argparse.ArgumentParser) -> None:
    """Seed, loss, schedule, optimiser and evaluation settings, with TrainConfig's defaults."""
    from ampbench.train.config import TrainConfig

    parser.add_argument(
        "--seed", type=int, default=TrainConfig.seed, help="seed of weights, order and subset"
    )
    parser.add_argument(
        "--label-smoothing",
        type=float,
        default=TrainConfig.label_smoothing,
        help="label smoothing of the loss",
    )
    parser.add_argument(
        "--warmup-fraction",
        type=float,
        default=TrainConfig.warmup_fraction,
        help="share of the steps the learning rate warms up over",
    )
    parser.add_argument(
        "--momentum", type=float, default=TrainConfig.momentum, help="SGD's Nesterov momentum"
    )
    parser.add_argument(
        "--weight-decay", type=float, default=TrainConfig.weight_decay, help="SGD's weight decay"
    )
    parser.add_argument(
        "--initial-loss-scale",
        type=float,
        default=TrainConfig.initial_loss_scale,
        help="fp16: the GradScaler's first loss scale",
    )
    parser.add_argument(
        "--eval-batch-size",
        type=non_negative_int,
        default=TrainConfig.eval_batch_size,
        help="images per evaluation batch (0: the training batch)",
    )
    parser.add_argument(
        "--warmup-steps",
        type=non_negative_int,
        default=TrainConfig.warmup_steps,
        help="untimed training steps before the clock starts, then undone",
    )


def _add_execution_options(parser: argparse.ArgumentParser) -> None:
    """How this process runs the training: compiled, on which device, its checkpoints, and
    under torchrun."""
    from ampbench.train import GRAD_COMM
    from ampbench.train.config import TrainConfig

    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--deterministic", action="store_true", help="deterministic algorithms")
    parser.add_argument("--device", default=TrainConfig.device, help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--checkpoint-dir", help="local directory or s3:// prefix")
    parser.add_argument(
        "--checkpoint-every",
        type=non_negative_int,
        default=TrainConfig.checkpoint_every,
        help="steps",
    )
    parser.add_argument(
        "--keep-checkpoints",
        type=positive_int,
        default=TrainConfig.keep_checkpoints,
        help="how many of the newest checkpoints to keep",
    )
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    parser.add_argument(
        "--max-skipped-steps",
        type=positive_int,
        default=TrainConfig.max_skipped_steps,
        help="fp16: stop after this many loss-scale skips in a row",
    )
    parser.add_argument(
        "--grad-comm",
        choices=GRAD_COMM,
        default=TrainConfig.grad_comm,
        help="under torchrun: the precision gradients are all-reduced in (DDP's compression hooks)",
    )


def _hand_off(args: argparse.Namespace, defaults: argparse.Namespace) -> HandOff:
    """The arm `ampbench train`'s options state: from --config's file, or from the options."""
    from ampbench.train.config import TrainConfig
    from ampbench.train.launch import HandOff
    from ampbench.train.tracker import TrackingOptions

    given = sorted(
        "--" + name.replace("_", "-")
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
    tracking = TrackingOptions(args.experiment, args.pipeline_run_id, args.register_model or "")
    return HandOff(
        TrainConfig.from_options(args, Path(args.dataset)),
        args.dataset,
        args.output_dir,
        tracking if args.tracking else None,
    )


def _train(args: argparse.Namespace) -> int:
    # Imported here: the package imports this module to list the commands.
    from ampbench.cli import build_parser
    from ampbench.results import RESULTS_FILE
    from ampbench.train.launch import MODEL_FILE
    from ampbench.train.step import run_training

    arm = _hand_off(args, build_parser("train").parse_args(["train"]))
    for location in (arm.dataset, arm.output_dir):
        if storage.is_s3(location):
            storage.split_s3(location)  # a malformed URI fails now, not after the training
    with contextlib.ExitStack() as stack:

        def scratch(prefix: str) -> Path:
            return Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))

        # The nodes of a TrainJob read the data set from, and hand the outputs back to, S3.
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
        )
        if not world_from_env().main:  # under torchrun, rank 0 speaks for the run
            return 0
        if local is not None:
            storage.copy_tree(local, arm.output_dir, [RESULTS_FILE, MODEL_FILE])
    print(
        f"{results.precision.requested} ({results.precision.support}): accuracy "
        f"{results.accuracy:.4f}, {results.timing.throughput_img_s:,.1f} images/s, "
        f"{results.timing.train_time_s:.2f} s training, {results.memory.train_peak_mb:,.1f} MB "
        f"training peak -> {storage.join(arm.output_dir, RESULTS_FILE)}"
    )
    return 0
