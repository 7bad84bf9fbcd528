"""Two steps of the pipeline, each run by itself: `prepare` and `compare` (`train` has a module
of its own)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ampbench.argtypes import positive_int
from ampbench.cli.options import add_comparison_options, add_experiment_options


# -- prepare ------------------------------------------------------------------------------------
def add_prepare(parser: argparse.ArgumentParser) -> None:
    from ampbench.data.dataset import DEFAULT_VAL_FRACTION
    from ampbench.data.sources import SourceOptions
    from ampbench.train import DATA_FORMS

    parser.description = "Prepare a data source as Parquet shards plus metadata.json."
    parser.add_argument(
        "--data",
        required=True,
        help=DATA_FORMS,
    )
    parser.add_argument("--output-dir", type=Path, required=True)
    add_experiment_options(parser, names=("subset",))
    parser.add_argument(
        "--seed", type=int, default=SourceOptions.seed, help="seed of subsets and splits"
    )
    parser.add_argument(
        "--val-fraction", type=float, default=DEFAULT_VAL_FRACTION, help="carve val from train"
    )
    parser.add_argument(
        "--test-fraction",
        type=float,
        default=SourceOptions.test_fraction,
        help="test share of a single class-folder tree (no train/ and test/)",
    )
    parser.add_argument("--image-size", type=positive_int, help="resize images to SIZE x SIZE")
    parser.add_argument("--skip-bad-images", action="store_true", help="skip unreadable images")
    _add_limits(parser)
    parser.add_argument("--cache-dir", type=Path, help="downloads and prepared datasets")
    parser.add_argument("--no-cache", action="store_true", help="prepare again even if cached")
    parser.set_defaults(handler=_prepare)


def _add_limits(parser: argparse.ArgumentParser) -> None:
    """The bounds on what a data source may expand to, with ampbench.data.limits' defaults."""
    from ampbench.data.limits import (
        DEFAULT_MAX_DECODED_BYTES,
        DEFAULT_MAX_EXTRACT_BYTES,
        DEFAULT_MAX_IMAGE_PIXELS,
        DEFAULT_MAX_MEMBERS,
    )

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


# -- compare ------------------------------------------------------------------------------------
def add_compare(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Compare training results (`ampbench train`'s results.json, one file per "
        "arm and seed): each arm against the baseline precision of its (model, batch size) "
        "group."
    )
    parser.add_argument("results", nargs="+", type=Path, metavar="RESULTS")
    parser.add_argument("--output-dir", type=Path, required=True)
    add_comparison_options(parser)
    parser.set_defaults(handler=_compare)


def _compare(args: argparse.Namespace) -> int:
    from ampbench.compare.report import render_text
    from ampbench.compare.step import CompareOutputs, run_comparison
    from ampbench.comparison import Prices

    comparison = run_comparison(
        args.results,
        CompareOutputs.in_directory(args.output_dir),
        baseline=args.baseline_precision,
        max_accuracy_drop_pp=args.max_accuracy_drop,
        allow_mismatch=args.allow_mismatch,
        prices=Prices.given(args.gpu_hour_price, args.energy_price),
    )
    print(render_text(comparison))
    return 0
