"""Benchmark: full CIFAR-10 (60,000 JPEGs, the shared archive) to Parquet shards.

Each repeat runs `prepare_dataset` in a fresh process (no cache), which reports its own wall
time and peak RSS (the whole process: interpreter, libraries, data). Prints each repeat and
the medians. Goal: <= 10 s and < 1 GB on 2 cores.

    python benchmarks/prepare_cifar10.py [--data ARCHIVE] [--repeats 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import archive_argument, median, require_archive, table, write_json

CHILD = """
import json, resource, sys, time
from pathlib import Path
from ampbench.data import SourceOptions, prepare_dataset
started = time.perf_counter()
metadata = prepare_dataset(sys.argv[1], Path(sys.argv[2]), options=SourceOptions(
    cache_dir=Path(sys.argv[3])), use_cache=False)
elapsed = time.perf_counter() - started
print(json.dumps({"seconds": elapsed, "images": sum(metadata["counts"].values()),
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    archive_argument(parser)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    require_archive(args.data)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            out = Path(tmp) / f"out{repeat}"
            done = subprocess.run(
                [sys.executable, "-c", CHILD, str(args.data), str(out), str(Path(tmp) / "cache")],
                capture_output=True,
                text=True,
                check=True,
            )
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    rows = [
        [f"repeat {i + 1}", r["seconds"], r["images"] / r["seconds"], r["peak_rss_mb"]]
        for i, r in enumerate(runs)
    ]
    medians = {
        "seconds": median([r["seconds"] for r in runs]),
        "images_per_s": median([r["images"] / r["seconds"] for r in runs]),
        "peak_rss_mb": median([r["peak_rss_mb"] for r in runs]),
    }
    rows.append(["median", medians["seconds"], medians["images_per_s"], medians["peak_rss_mb"]])
    print(f"prepare: {args.data.name}, {runs[0]['images']:,} images, {args.repeats} repeats")
    print(table(["", "wall s", "images/s", "peak RSS MB"], rows))
    print(
        f"goal: <= 10 s ({'met' if medians['seconds'] <= 10 else 'MISSED'}), "
        f"< 1024 MB ({'met' if medians['peak_rss_mb'] < 1024 else 'MISSED'})"
    )
    write_json(args.json, {"runs": runs, "median": medians})


if __name__ == "__main__":
    main()
