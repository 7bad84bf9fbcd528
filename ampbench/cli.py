"""The `ampbench` command: run the pipeline locally, compile it, or run one step by itself."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from ampbench import __version__, storage
from ampbench.argtypes import (
    DefaultsHelpFormatter,
    batch_size_list,
    model_list,
    model_name,
    non_negative_int,
    non_negative_number,
    positive_int,
    precision_list,
    seed_list,
)
from ampbench.errors import AmpbenchError
from ampbench.logs import log, setup_logging
from ampbench.process import skip_final_collection
from ampbench.tracking import DEFAULT_EXPERIMENT, UI_PORT
from ampbench.world import world_from_env

Handler = Callable[[argparse.Namespace], int]


def _add_training_options(parser: argparse.ArgumentParser) -> None:
    """What `run` and `train` share, with TrainConfig's defaults."""
    from ampbench.train.config import MODEL_FORMS, TrainConfig

    parser.add_argument(
        "--subset",
        type=non_negative_int,
        default=TrainConfig.subset,
        help="at most N images per split (0: all)",
    )
    parser.add_argument(
        "--epochs", type=positive_int, default=TrainConfig.epochs, help="training epochs"
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=TrainConfig.batch_size,
        help="images per training step",
    )
    parser.add_argument("--lr", type=float, default=TrainConfig.lr, help="peak learning rate")
    parser.add_argument(
        "--model",
        type=model_name,
        default=TrainConfig.model,
        help=f"the network to train, one of {MODEL_FORMS} (a callable taking num_classes and "
        "image_shape (channels, height, width), returning an nn.Module that maps (N, C, H, W) "
        "images to (N, num_classes) logits)",
    )
    parser.add_argument(
        "--image-size",
        type=non_negative_int,
        default=TrainConfig.image_size,
        metavar="SIZE",
        help="train and evaluate on SIZE x SIZE images, resized bilinearly on the device per "
        "batch (0: as prepared)",
    )
    parser.add_argument(
        "--target-accuracy",
        type=non_negative_number,
        default=TrainConfig.target_accuracy,
        metavar="A",
        help="stop each arm at the first epoch whose test accuracy reaches A and record its "
        "time to target (0: off; the epochs are the limit)",
    )
    parser.add_argument(
        "--allow-emulated",
        action="store_true",
        help="measure a precision this device has no native math for (labelled emulated)",
    )
    parser.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=TrainConfig.cuda_graphs,
        help="on a CUDA GPU, replay each training step as one CUDA graph (the kernel launches "
        "out of the way); --no-cuda-graphs trains eagerly. Not under torchrun",
    )
    parser.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment")
    parser.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")


def _add_comparison_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-accuracy-drop",
        type=non_negative_number,
        metavar="PP",
        help="fail when the AMP arm loses more than PP percentage points of accuracy",
    )
    parser.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="compare arms that differ in more than precision (GPU model, versions, settings) "
        "instead of refusing; the report then carries a warning",
    )


# -- run ----------------------------------------------------------------------------------------
def _add_run(commands: argparse._SubParsersAction) -> None:
    from ampbench.train import (
        AMP_PRECISION,
        BASELINE_PRECISION,
        DEFAULT_DATA,
        PRECISIONS,
    )

    parser = commands.add_parser(
        "run",
        help="run the whole pipeline here with the KFP local runner",
        description="Run prepare -> train(fp32) || train(amp) -> compare through the KFP local "
        "runner, track the runs in MLflow, and print the RESULTS block.",
    )
    parser.add_argument(
        "--data",
        default=DEFAULT_DATA,
        help="synthetic, cifar10, cifar100, a path (ImageFolder tree or archive, CIFAR tarball) "
        "or an s3:// URI",
    )
    _add_training_options(parser)
    # Unset: short_run_batch_size picks it from --subset.
    parser.set_defaults(batch_size=None)
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--seed", type=int, help="one seed (default 0)")
    seeds.add_argument("--seeds", type=seed_list, help="several seeds, e.g. 0,1,2")
    parser.add_argument(
        "--baseline-precision",
        choices=PRECISIONS,
        default=BASELINE_PRECISION,
        help="the baseline arm",
    )
    parser.add_argument(
        "--precision", choices=PRECISIONS, default=AMP_PRECISION, help="the mixed-precision arm"
    )
    matrix = parser.add_argument_group(
        "experiment matrix",
        "Several arms in one run: every model x batch size x precision x seed is a training "
        "task, and each (model, batch size) group gets its own baseline arm. Each list replaces "
        "its single-value option.",
    )
    matrix.add_argument(
        "--precisions",
        type=precision_list,
        metavar="LIST",
        help="precisions to compare with the baseline, e.g. tf32,fp16,bf16 (of "
        f"{', '.join(PRECISIONS)})",
    )
    matrix.add_argument("--batch-sizes", type=batch_size_list, metavar="LIST", help="e.g. 128,512")
    matrix.add_argument("--models", type=model_list, metavar="LIST", help="e.g. resnet18,vit-s")
    _add_comparison_options(parser)
    parser.add_argument("--register-model", metavar="NAME", help="register the models in MLflow")
    parser.add_argument(
        "--checkpoint-dir",
        help="where training tasks checkpoint (local or s3://); a retried task resumes there",
    )
    parser.add_argument("--output-dir", type=Path, help="default: runs/<timestamp>")
    parser.add_argument(
        "--export",
        metavar="URI",
        help="also copy report, plots, results and models to s3://bucket/prefix or a directory",
    )
    parser.set_defaults(handler=_run)


def _check_precisions_here(precisions: Sequence[str], allow_emulated: bool) -> None:
    """The local runner trains on this machine: a precision it cannot run natively stops
    the command now, not after the data is prepared."""
    from ampbench.train.device import pick_device
    from ampbench.train.precision import resolve

    device = pick_device("auto")
    for precision in precisions:
        resolve(precision, device, allow_emulated)


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


def _run(args: argparse.Namespace) -> int:
    from ampbench.matrix import check_matrix, matrix_runs
    from ampbench.pipelines.local import export, run_local, summary_lines
    from ampbench.train import AMP_PRECISION
    from ampbench.train.config import (
        MIN_STEPS_PER_EPOCH,
        TrainConfig,
        short_run_batch_size,
    )

    models = _one_or_list(args, "model", "models", TrainConfig.model)
    if args.batch_size is None and args.batch_sizes is None:
        args.batch_size = short_run_batch_size(args.subset)
        if args.batch_size != TrainConfig.batch_size:
            log.info(
                "--subset %d: batch %d, for at least %d steps an epoch (--batch-size sets it)",
                args.subset,
                args.batch_size,
                MIN_STEPS_PER_EPOCH,
            )
    batch_sizes = _one_or_list(args, "batch_size", "batch_sizes", None)
    precisions = _one_or_list(args, "precision", "precisions", AMP_PRECISION)
    seeds = args.seeds or [args.seed if args.seed is not None else TrainConfig.seed]
    runs = matrix_runs(models, batch_sizes, precisions, seeds, args.baseline_precision)
    check_matrix(
        runs,
        args.baseline_precision,
        epochs=args.epochs,
        lr=args.lr,
        subset=args.subset,
        image_size=args.image_size,
    )
    _check_precisions_here([args.baseline_precision, *precisions], args.allow_emulated)
    arguments = {
        "data": args.data,
        "subset": args.subset,
        "epochs": args.epochs,
        "lr": args.lr,
        "runs": runs,
        "baseline_precision": args.baseline_precision,
        "image_size": args.image_size,
        "target_accuracy": args.target_accuracy,
        "allow_emulated": args.allow_emulated,
        "cuda_graphs": args.cuda_graphs,
        "allow_mismatch": args.allow_mismatch,
        "experiment": args.experiment,
        "tracking": not args.no_tracking,
        "max_accuracy_drop": -1.0 if args.max_accuracy_drop is None else args.max_accuracy_drop,
        "registered_model_name": args.register_model or "",
        "checkpoint_dir": args.checkpoint_dir or "",
    }
    if args.export and storage.is_s3(args.export):
        storage.split_s3(args.export)  # a malformed URI fails now, not after the training
    run = run_local(arguments, args.output_dir)
    print("\n".join(summary_lines(run)))
    if args.export:
        written = export(run, args.export)
        print(f"exported {len(written)} files to {args.export}")
    return 0


# -- compile ------------------------------------------------------------------------------------
def _add_compile(commands: argparse._SubParsersAction) -> None:
    from ampbench.pipelines.compile import DEFAULT_OUTPUT, add_build_options

    parser = commands.add_parser(
        "compile", help="write the pipeline YAML for Kubeflow", description="Compile the pipeline."
    )
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


# -- prepare ------------------------------------------------------------------------------------
def _add_prepare(commands: argparse._SubParsersAction) -> None:
    from ampbench.data.limits import (
        DEFAULT_MAX_DECODED_BYTES,
        DEFAULT_MAX_EXTRACT_BYTES,
        DEFAULT_MAX_IMAGE_PIXELS,
        DEFAULT_MAX_MEMBERS,
    )

    parser = commands.add_parser(
        "prepare",
        help="run the prepare step by itself",
        description="Prepare a data source as Parquet shards plus metadata.json.",
    )
    parser.add_argument(
        "--data",
        required=True,
        help="synthetic, cifar10, cifar100, a path or file:// URI (ImageFolder directory, "
        ".tar, .tar.gz, .tgz, .zip, CIFAR python tarball), s3://bucket/key or s3://bucket/prefix/",
    )
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument(
        "--subset", type=non_negative_int, default=0, help="at most N images per split"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of subsets and splits")
    parser.add_argument("--val-fraction", type=float, default=0.0, help="carve val from train")
    parser.add_argument(
        "--test-fraction",
        type=float,
        default=0.2,
        help="test share of a single class-folder tree (no train/ and test/)",
    )
    parser.add_argument("--image-size", type=positive_int, help="resize images to SIZE x SIZE")
    parser.add_argument("--skip-bad-images", action="store_true", help="skip unreadable images")
    parser.add_argument(
        "--max-extract-bytes",
        type=positive_int,
        default=DEFAULT_MAX_EXTRACT_BYTES,
        help="most bytes an archive or tree may expand to",
    )
    parser.add_argument(
        "--max-members",
        type=positive_int,
        default=DEFAULT_MAX_MEMBERS,
        help="most files an archive or tree may hold",
    )
    parser.add_argument(
        "--max-image-pixels",
        type=positive_int,
        default=DEFAULT_MAX_IMAGE_PIXELS,
        help="most pixels one image's header may declare (checked before decoding)",
    )
    parser.add_argument(
        "--max-decoded-bytes",
        type=positive_int,
        default=DEFAULT_MAX_DECODED_BYTES,
        help="most bytes the decoded images may take (also bounded by the memory free)",
    )
    parser.add_argument("--cache-dir", type=Path, help="downloads and prepared datasets")
    parser.add_argument("--no-cache", action="store_true", help="prepare again even if cached")
    parser.set_defaults(handler=_prepare)


def _prepare(args: argparse.Namespace) -> int:
    from ampbench.data import SourceOptions, prepare_dataset
    from ampbench.data.limits import Limits
    from ampbench.data.sources import default_cache_dir

    metadata = prepare_dataset(
        args.data,
        args.output_dir,
        subset=args.subset,
        val_fraction=args.val_fraction,
        options=SourceOptions(
            cache_dir=args.cache_dir or default_cache_dir(),
            image_size=args.image_size,
            test_fraction=args.test_fraction,
            seed=args.seed,
            skip_bad_images=args.skip_bad_images,
            limits=Limits(
                args.max_extract_bytes,
                args.max_members,
                args.max_image_pixels,
                args.max_decoded_bytes,
            ),
        ),
        use_cache=not args.no_cache,
    )
    counts = ", ".join(f"{split} {n}" for split, n in metadata["counts"].items())
    print(f"prepared {args.output_dir}: {counts} images, {len(metadata['classes'])} classes")
    return 0


# -- train --------------------------------------------------------------------------------------
def _add_train(commands: argparse._SubParsersAction) -> None:
    from ampbench.train import GRAD_COMM, PRECISIONS
    from ampbench.train.config import TrainConfig

    parser = commands.add_parser(
        "train",
        help="run the train step by itself",
        description="Train one precision arm on a prepared dataset; write results.json and "
        "model.pt to the output directory. Runs unchanged under torchrun (one process per GPU, "
        "or gloo between CPU processes): --batch-size is then each process's batch, and rank 0 "
        "writes the outputs, checkpoints and MLflow run.",
    )
    parser.add_argument(
        "--dataset",
        required=True,
        help="a prepared dataset directory, or an s3:// prefix holding one (fetched first)",
    )
    parser.add_argument("--precision", required=True, choices=PRECISIONS)
    parser.add_argument(
        "--output-dir",
        required=True,
        help="a folder, or an s3:// prefix (written once the training ends: how the nodes of a "
        "TrainJob hand the arm back to its pipeline task)",
    )
    parser.add_argument(
        "--pipeline-run-id", default="", help="the KFP run this training belongs to (MLflow tag)"
    )
    parser.add_argument("--register-model", metavar="NAME", help="register the model in MLflow")
    _add_training_options(parser)
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
    parser.set_defaults(handler=_train)


def _train(args: argparse.Namespace) -> int:
    from ampbench.train.config import TrainConfig
    from ampbench.train.launch import MODEL_FILE, RESULTS_FILE
    from ampbench.train.step import TrackingOptions, run_training

    for location in (args.dataset, args.output_dir):
        if storage.is_s3(location):
            storage.split_s3(location)  # a malformed URI fails now, not after the training
    tracking = TrackingOptions(args.experiment, args.pipeline_run_id, args.register_model or "")
    with contextlib.ExitStack() as stack:

        def scratch(prefix: str) -> Path:
            return Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))

        # The nodes of a TrainJob read the data set from, and hand the outputs back to, S3.
        dataset = Path(args.dataset)
        if storage.is_s3(args.dataset):
            dataset = storage.fetch_tree(args.dataset, scratch("ampbench-dataset-"))[0]
        local = scratch("ampbench-train-") if storage.is_s3(args.output_dir) else None
        output_dir = local or Path(args.output_dir)
        config = TrainConfig.from_options(args, dataset)
        results = run_training(
            config,
            output_dir / RESULTS_FILE,
            output_dir / MODEL_FILE,
            None if args.no_tracking else tracking,
        )
        if not world_from_env().main:  # under torchrun, rank 0 speaks for the run
            return 0
        if local is not None:
            storage.copy_tree(local, args.output_dir, [RESULTS_FILE, MODEL_FILE])
    print(
        f"{results.precision.requested} ({results.precision.support}): accuracy "
        f"{results.accuracy:.4f}, {results.timing.throughput_img_s:,.1f} images/s, "
        f"{results.timing.train_time_s:.2f} s training, {results.memory.train_peak_mb:,.1f} MB "
        f"training peak -> {storage.join(args.output_dir, RESULTS_FILE)}"
    )
    return 0


# -- compare ------------------------------------------------------------------------------------
def _add_compare(commands: argparse._SubParsersAction) -> None:
    from ampbench.train import BASELINE_PRECISION

    parser = commands.add_parser(
        "compare",
        help="run the compare step by itself",
        description="Compare training results (`ampbench train`'s results.json, one file per "
        "arm and seed): each arm against the baseline precision of its (model, batch size) "
        "group.",
    )
    parser.add_argument("results", nargs="+", type=Path, metavar="RESULTS")
    parser.add_argument(
        "--baseline-precision", default=BASELINE_PRECISION, help="the baseline arms' precision"
    )
    parser.add_argument("--output-dir", type=Path, required=True)
    _add_comparison_options(parser)
    parser.set_defaults(handler=_compare)


def _compare(args: argparse.Namespace) -> int:
    from ampbench.compare.report import render_text
    from ampbench.compare.step import CompareOutputs, run_comparison

    comparison = run_comparison(
        args.results,
        CompareOutputs.in_directory(args.output_dir),
        baseline=args.baseline_precision,
        max_accuracy_drop_pp=args.max_accuracy_drop,
        allow_mismatch=args.allow_mismatch,
    )
    print(render_text(comparison))
    return 0


# -- report -------------------------------------------------------------------------------------
def _add_report(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "report",
        help="rebuild a pipeline run's report from MLflow alone",
        description="Download the arm runs' results of a pipeline run from MLflow and write the "
        "comparison again (results.json, report.md, report.html, plots/).",
    )
    parser.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment")
    parser.add_argument("--parent-run-id", help="the pipeline run's parent run (default: newest)")
    parser.add_argument(
        "--output-dir", type=Path, default=Path("report"), help="where to write the report"
    )
    parser.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="compare arms that differ in more than precision, with a warning",
    )
    parser.set_defaults(handler=_report)


def _report(args: argparse.Namespace) -> int:
    import tempfile

    from ampbench.compare.report import render_text
    from ampbench.compare.step import CompareOutputs, run_comparison
    from ampbench.tracking import download_arm_results

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
def _add_ui(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "ui",
        help="browse the runs in the MLflow UI",
        description="Start the MLflow UI on 127.0.0.1 over the tracking store that runs use.",
    )
    parser.add_argument("--port", type=positive_int, default=UI_PORT, help="port on 127.0.0.1")
    parser.add_argument(
        "--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment whose runs to show"
    )
    parser.set_defaults(handler=_ui)


def _ui(args: argparse.Namespace) -> int:
    from ampbench.tracking import (
        find_experiment_id,
        local_store,
        local_ui_base,
        runs_table_url,
        safe_tracking_uri,
        tracking_uri,
    )

    uri = tracking_uri()
    if not local_store():
        raise AmpbenchError(
            f"MLFLOW_TRACKING_URI is {safe_tracking_uri()}: open that server's own UI instead"
        )
    base = local_ui_base(args.port)
    _check_port_free(args.port)
    # Read before the server starts: two processes creating a fresh store's tables would race.
    experiment_id = find_experiment_id(args.experiment)
    print(f"MLflow UI on {base} ({uri}); Ctrl-C stops it")
    if experiment_id is None:
        print(f"experiment '{args.experiment}' has no runs in this store yet")
    else:
        print(f"runs of experiment '{args.experiment}': {runs_table_url(base, experiment_id)}")
    # One worker: one person browsing. The server and its worker get a process group of their
    # own, so that stopping this command (Ctrl-C, SIGTERM, SIGHUP) stops all of them.
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri]
    command += ["--host", "127.0.0.1", "--port", str(args.port), "--workers", "1"]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    server = subprocess.Popen(command, env=env, start_new_session=True)

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
            probe.bind(("127.0.0.1", port))
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


def _add_kfp(commands: argparse._SubParsersAction) -> None:
    from ampbench.pipelines.submit import add_commands

    add_commands(commands)


# Each command's parser, by the names it adds. submit's and upload's options are made from the
# pipeline's parameters: building them imports KFP and builds the DAG (seconds).
COMMAND_PARSERS: list[tuple[tuple[str, ...], Callable[[argparse._SubParsersAction], None]]] = [
    (("run",), _add_run),
    (("compile",), _add_compile),
    (("submit", "upload"), _add_kfp),
    (("prepare",), _add_prepare),
    (("train",), _add_train),
    (("compare",), _add_compare),
    (("report",), _add_report),
    (("ui",), _add_ui),
]


def command_in(argv: Sequence[str]) -> str | None:
    """The command an argument list names: its first word that is no option (the top-level
    options take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line; with `only` a command's name, that command's parser alone (any other
    word, or None, builds them all: for the list of commands, or argparse's error naming them)."""
    parser = argparse.ArgumentParser(
        prog="ampbench",
        description="What does mixed precision buy us? AMP against FP32 training: speed, "
        "memory, accuracy, as a Kubeflow pipeline tracked in MLflow.",
    )
    parser.add_argument("--version", action="version", version=f"ampbench {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")
    known = only in {name for names, _ in COMMAND_PARSERS for name in names}
    for names, add in COMMAND_PARSERS:
        if not known or only in names:
            add(commands)
    for command in commands.choices.values():
        command.formatter_class = DefaultsHelpFormatter
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    skip_final_collection()
    parser = build_parser(only=command_in(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        setup_logging(args.verbose)  # a malformed $RANK is one line too
        return handler(args)
    except AmpbenchError as error:
        print(f"ampbench: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("ampbench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
