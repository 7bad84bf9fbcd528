"""Benchmark: what the shared compile cache saves a compiled arm (`--compile-cache`).

Each repeat runs `ampbench train --compile` twice in fresh processes against an empty shared
location: the first compiles its step (a miss) and leaves its Inductor cache there as an
archive, the second fetches it (a hit). Both are the same command; the figures are each run's
`compile_s` (the first warm-up step, the fetch included) and `warmup_s` from its results. Prints
each run, then the medians and the miss / hit ratio.

    python benchmarks/compile_cache.py [--data ARCHIVE] [--subset 512] [--repeats 3]
        [--model small-cnn] [--batch-size 32] [--precision fp32] [--json FILE]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

# Its own folder only (for common.py): gpu_check.sh runs it with PYTHONSAFEPATH=1.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import archive_argument, median, require_archive, table, write_json

from ampbench.argtypes import positive_int
from ampbench.results import RESULTS_FILE, read_arm_results
from ampbench.train import PRECISIONS
from ampbench.train.precision import cpu_capability, cpu_name

AMPBENCH = [sys.executable, "-m", "ampbench.cli"]


def ampbench(*arguments: str) -> None:
    done = subprocess.run([*AMPBENCH, *arguments], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"compile_cache: ampbench {arguments[0]} failed:\n{done.stderr[-3000:]}")


def one_repeat(args: argparse.Namespace, dataset: Path, work: Path) -> list[dict[str, object]]:
    """A miss then a hit on a location of this repeat's own."""
    location = work / "compile-cache"
    rows = []
    for run in ("first", "second"):
        out = work / run
        ampbench(
            "train", "--dataset", str(dataset), "--precision", args.precision,
            "--model", args.model, "--batch-size", str(args.batch_size), "--epochs", "1",
            "--compile", "--compile-cache", str(location), "--allow-emulated",
            "--no-tracking", "--output-dir", str(out),
        )  # fmt: skip
        timing = read_arm_results(out / RESULTS_FILE).timing
        archives = list(location.glob("*.tar.gz")) if location.is_dir() else []
        if not archives:
            sys.exit(f"compile_cache: the {run} run left no archive in {location}")
        archive_mb = sum(p.stat().st_size for p in archives) / 2**20
        rows.append(
            {
                "run": run,
                "compile_cache": timing.compile_cache,
                "compile_s": timing.compile_s,
                "warmup_s": timing.warmup_s,
                "archive_mb": archive_mb,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    archive_argument(parser)
    parser.add_argument("--subset", type=positive_int, default=512)
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--model", default="small-cnn")
    parser.add_argument("--batch-size", type=positive_int, default=32)
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    require_archive(args.data)
    print(f"CPU: {cpu_name()} ({cpu_capability()})")
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="ampbench-compile-cache-") as scratch:
        dataset = Path(scratch) / "dataset"
        ampbench("prepare", "--data", str(args.data), "--subset", str(args.subset),
                 "--output-dir", str(dataset))  # fmt: skip
        for repeat in range(args.repeats):
            work = Path(scratch) / f"repeat-{repeat}"
            rows += [{"repeat": repeat, **row} for row in one_repeat(args, dataset, work)]
    header = ["repeat", "run", "compile cache", "compile (s)", "warm-up (s)", "archive (MB)"]
    columns = ("repeat", "run", "compile_cache", "compile_s", "warmup_s", "archive_mb")
    print(table(header, [[row[column] for column in columns] for row in rows]))
    outcomes = [(row["run"], row["compile_cache"]) for row in rows]
    if set(outcomes) != {("first", "miss"), ("second", "hit")}:
        sys.exit(f"compile_cache: expected each first run to miss and each second to hit: {rows}")
    medians = {
        outcome: median([float(r["compile_s"]) for r in rows if r["compile_cache"] == outcome])
        for outcome in ("miss", "hit")
    }
    print(
        f"\n{args.model} b{args.batch_size} {args.precision}, median of {args.repeats}: "
        f"compiled {medians['miss']:.2f} s, fetched from the compile cache {medians['hit']:.2f} s "
        f"({medians['miss'] / medians['hit']:.1f}x less)"
    )
    write_json(
        args.json,
        {
            "cpu": cpu_name(),
            "cpu_capability": cpu_capability(),
            "model": args.model,
            "batch_size": args.batch_size,
            "precision": args.precision,
            "runs": rows,
            "median_compile_s": medians,
        },
    )


if __name__ == "__main__":
    main()
