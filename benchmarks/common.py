"""What the benchmarks share: the CIFAR-10 archive's location, medians, and tables."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# The CIFAR-10 archive's one definition: the environment's, else ../shared beside the checkout.
# The tests read it from here, and the shell scripts run this file to print it.
ARCHIVE_ENV = "AMPBENCH_CIFAR10_ARCHIVE"
DEFAULT_ARCHIVE = Path(
    os.environ.get(ARCHIVE_ENV, REPO.parent / "shared" / "datasets" / "cifar10-jpeg.tar.gz")
)


def archive_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data",
        type=Path,
        default=DEFAULT_ARCHIVE,
        help=f"the CIFAR-10 archive (default {DEFAULT_ARCHIVE})",
    )


def require_archive(path: Path) -> None:
    """Stop, in one line naming the benchmark, where --data is no file."""
    if not path.is_file():
        sys.exit(f"{Path(sys.argv[0]).stem}: {path}: no such archive (pass --data)")


def shrink_evaluation(trainer: Any, images: int = 128) -> None:
    """Evaluate a Trainer on a few images per split: evaluation is timed apart and is not what
    the benchmarks measure, and on a CPU it would take longer than the training they time."""
    for split in trainer.eval_data.values():
        split.images, split.labels = split.images[:images], split.labels[:images]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain text table, numbers right-aligned."""
    cells = [[str(h) for h in header]] + [
        [f"{v:,.2f}" if isinstance(v, float) else str(v) for v in row] for row in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for n, row in enumerate(cells):
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_json(path: Path | None, data: Any) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    print(DEFAULT_ARCHIVE)
