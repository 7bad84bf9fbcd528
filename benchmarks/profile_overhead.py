"""Benchmark: the profile leaves the timed figures alone (`--profile-steps`).

Each repeat runs `ampbench train` twice in fresh processes, the same arm on the same data, once
with `--profile-steps 0` and once with the default profile: the training images/s of the two
must agree within the noise of repeats, since the profile runs after the timed epochs and is
undone. Prints each run, the medians, their ratio, and what the profile itself cost
(its wall time per step, outside every reported figure).

    python benchmarks/profile_overhead.py [--data ARCHIVE] [--subset 2048] [--repeats 3]
        [--model resnet18] [--batch-size 128] [--precision fp32] [--profile-steps 20] [--json FILE]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import archive_argument, median, require_archive, table, write_json

from ampbench.argtypes import positive_int
from ampbench.results import RESULTS_FILE, ArmResults, read_arm_results
from ampbench.train import PRECISIONS
from ampbench.train.precision import cpu_capability, cpu_name

AMPBENCH = [sys.executable, "-m", "ampbench.cli"]


def train(args: argparse.Namespace, dataset: Path, out: Path, profile_steps: int) -> ArmResults:
    done = subprocess.run(
        [
            *AMPBENCH,
            "train",
            "--dataset",
            str(dataset),
            "--precision",
            args.precision,
            "--model",
            args.model,
            "--batch-size",
            str(args.batch_size),
            "--epochs",
            str(args.epochs),
            "--eval-batch-size",
            "512",
            "--profile-steps",
            str(profile_steps),
            "--allow-emulated",
            "--no-tracking",
            "--output-dir",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(f"profile_overhead: ampbench train failed:\n{done.stderr[-3000:]}")
    return read_arm_results(out / RESULTS_FILE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    archive_argument(parser)
    parser.add_argument("--subset", type=positive_int, default=2048)
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--epochs", type=positive_int, default=1)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch-size", type=positive_int, default=128)
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32")
    parser.add_argument("--profile-steps", type=positive_int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    require_archive(args.data)
    print(f"CPU: {cpu_name()} ({cpu_capability()})")
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="ampbench-profile-bench-") as tmp:
        work = Path(tmp)
        dataset = work / "dataset"
        prepared = subprocess.run(
            [*AMPBENCH, "prepare", "--data", str(args.data), "--output-dir", str(dataset),
             "--subset", str(args.subset)],
            capture_output=True, text=True,
        )  # fmt: skip
        if prepared.returncode != 0:
            sys.exit(f"profile_overhead: prepare failed:\n{prepared.stderr[-3000:]}")
        for repeat in range(args.repeats):
            # Alternated, so that a drift of the machine's speed falls on both alike.
            order = (0, args.profile_steps) if repeat % 2 == 0 else (args.profile_steps, 0)
            for steps in order:
                results = train(args, dataset, work / f"r{repeat}-p{steps}", steps)
                profile = results.profile
                rows.append(
                    {
                        "repeat": repeat,
                        "profile_steps": steps,
                        "throughput_img_s": results.timing.throughput_img_s,
                        "train_time_s": results.timing.train_time_s,
                        "accuracy": results.accuracy,
                        "profile_ms_per_step": profile.wall_ms_per_step if profile else None,
                    }
                )
                print(
                    f"repeat {repeat + 1}/{args.repeats}, --profile-steps {steps}: "
                    f"{results.timing.throughput_img_s:,.1f} images/s",
                    flush=True,
                )
    off = [r["throughput_img_s"] for r in rows if r["profile_steps"] == 0]
    on = [r["throughput_img_s"] for r in rows if r["profile_steps"] != 0]
    accuracies = {(r["repeat"], r["profile_steps"]): r["accuracy"] for r in rows}
    same_accuracy = all(
        accuracies[(repeat, 0)] == accuracies[(repeat, args.profile_steps)]
        for repeat in range(args.repeats)
    )
    print()
    print(
        table(
            ["--profile-steps", "images/s (median)", "min", "max"],
            [
                [0, median(off), min(off), max(off)],  # type: ignore[type-var]
                [args.profile_steps, median(on), min(on), max(on)],  # type: ignore[type-var]
            ],
        )
    )
    ratio = median(on) / median(off)  # type: ignore[arg-type, operator]
    print(f"\nimages/s with the profile / without: {ratio:.3f} (median of {args.repeats} each)")
    print(f"same accuracy with and without, every repeat: {same_accuracy}")
    profiled = [r["profile_ms_per_step"] for r in rows if r["profile_ms_per_step"] is not None]
    print(f"the profile's own wall time: {median(profiled):.1f} ms a step (off the clock)")  # type: ignore[arg-type]
    write_json(
        args.json,
        {
            "cpu": cpu_name(),
            "capability": cpu_capability(),
            "settings": vars(args) | {"data": str(args.data), "json": None},
            "runs": rows,
            "ratio": ratio,
            "same_accuracy": same_accuracy,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
