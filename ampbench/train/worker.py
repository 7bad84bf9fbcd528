"""One training process of an arm handed off as a file (launch.HandOff): what torchrun's
processes and a TrainJob's nodes run, `python -m ampbench.train.worker --config FILE`, so that
the library starts no command of the layers above it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ampbench.errors import reported_as_step
from ampbench.logs import log, setup_logging


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}",  # type: ignore[union-attr]
        description="Train the arm a hand-off file describes (one of torchrun's processes, or "
        "a TrainJob's node); rank 0 writes its outputs.",
    )
    parser.add_argument(
        "--config", required=True, metavar="FILE", help="the hand-off: a local path or s3:// URI"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    args = parser.parse_args(argv)
    with reported_as_step("train"):
        setup_logging(args.verbose)
        from ampbench.train import train_step_name
        from ampbench.train.launch import HandOff, results_line, train_hand_off

        arm = HandOff.read(args.config)
    with reported_as_step(train_step_name(arm.config.precision)):
        results = train_hand_off(arm)
        # Debug: under a train task the outputs are collected from a folder it then removes.
        if results is not None:
            log.debug("%s", results_line(results, arm.output_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
