"""Benchmark: what an experiment matrix costs per arm beyond the arm's own training.

Runs `ampbench run` (the KFP local runner, MLflow in a sqlite file, as `make run` does) on a
CIFAR-10 subset with a matrix of arms, and reads from its run.log how long each training task
took from start to end. A task's orchestration overhead is that wall time minus the arm's
own end-to-end time (warm-up + timed training + evaluation + checkpoints, from its results):
process start, imports, reading the prepared data, building the model, the MLflow run, the
model logged to MLflow, the outputs written. The prepare and compare steps are shared by all
arms and are reported per arm too. Prints each task, then the medians over tasks and repeats,
as a fraction of an arm's training time (goal: under 10 % on a 1,024-image subset).

    python benchmarks/matrix_overhead.py [--data ARCHIVE] [--subset 1024] [--repeats 2]
        [--models small-cnn] [--batch-sizes 64,128] [--lr LR] [--json FILE]

Also measured in the same run: a bare process that imports torch and exits (median of 3),
the least any task that trains with PyTorch in its own process pays, so that the overhead
beyond it is printed too.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import archive_argument, median, require_archive, table, write_json

from ampbench.pipelines.local import ANSI_ESCAPE, PIPELINE_ROOT, RUN_LOG
from ampbench.results import read_arm_results
from ampbench.tracking import TRACKING_URI_ENV
from ampbench.train.config import TrainConfig
from ampbench.train.precision import cpu_capability, cpu_name

# Two arms per model and batch size; emulated bf16 where this CPU has none (labelled so):
# the overhead, not the precision, is measured, and it is taken per task either way.
PRECISIONS = ["--precisions", "amp"]
TASK_LINE = re.compile(
    r"^(\d\d:\d\d:\d\d\.\d+) - INFO - (?:Executing task '([\w-]+)'|Task '([\w-]+)' finished)"
)


def task_durations(run_log: Path) -> list[tuple[str, float]]:
    """(task name, seconds) in the order the tasks ran (the local runner runs them one at a
    time)."""
    durations, started = [], None
    for line in run_log.read_text(encoding="utf-8").splitlines():
        match = TASK_LINE.match(ANSI_ESCAPE.sub("", line))
        if not match:
            continue
        stamp = datetime.datetime.strptime(match[1], "%H:%M:%S.%f")
        if match[2]:
            started = (match[2], stamp)
        elif started is not None:
            seconds = (stamp - started[1]).total_seconds() % 86_400  # past midnight
            durations.append((started[0], seconds))
            started = None
    return durations


def torch_process_s() -> float:
    """Wall time of a process that starts Python, imports torch and exits (median of 3)."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        times.append(time.perf_counter() - start)
    return median(times)


def one_run(
    archive: Path, subset: int, epochs: int, matrix: list[str], work: Path
) -> list[dict[str, object]]:
    out = work / "out"
    env = {**os.environ, TRACKING_URI_ENV: f"sqlite:///{work / 'mlflow.db'}"}
    # Absolute: the run's working directory is `work`.
    command = [sys.executable, "-m", "ampbench.cli", "run", "--data", str(archive.resolve())]
    command += ["--subset", str(subset), "--epochs", str(epochs), *matrix, "--allow-emulated"]
    done = subprocess.run(
        [*command, "--output-dir", str(out)], capture_output=True, text=True, cwd=work, env=env
    )
    if done.returncode != 0:
        sys.exit(f"matrix_overhead: ampbench run failed:\n{done.stderr[-3000:]}")
    tasks = task_durations(out / RUN_LOG)
    # Sequential schedule: the training tasks finished in the order their results were written.
    results = sorted((out / PIPELINE_ROOT).rglob("results"), key=lambda p: p.stat().st_mtime)
    trains = [seconds for name, seconds in tasks if name.startswith("train")]
    shared = sum(seconds for name, seconds in tasks if not name.startswith("train"))
    if len(trains) != len(results):
        sys.exit(f"matrix_overhead: {len(trains)} training tasks but {len(results)} results")
    rows = []
    for seconds, path in zip(trains, results, strict=True):
        arm = read_arm_results(path)
        batch = arm.hyperparameters["batch_size"]
        emulated = " (emulated)" if arm.precision.emulated else ""
        rows.append(
            {
                "arm": f"{arm.model} b{batch} {arm.precision.resolved}{emulated}",
                "task_s": seconds,
                "end_to_end_s": arm.timing.end_to_end_s,
                "train_time_s": arm.timing.train_time_s,
                "overhead_s": seconds - arm.timing.end_to_end_s,
                # After the epochs, off every figure: in the task's time, not the arm's.
                "profile_s": arm.profile.steps * arm.profile.wall_ms_per_step / 1e3
                if arm.profile
                else 0.0,
                "shared_per_arm_s": shared / len(trains),
            }
        )
    return rows


def report(args: argparse.Namespace, rows: list[dict[str, object]], floor: float) -> None:
    """Each task's figures, the medians against an fp32 arm's training time and a bare torch
    process (`floor`), and the JSON (--json)."""
    header = ["arm", "repeat", "task (s)", "arm end-to-end (s)", "training (s)", "overhead (s)"]
    columns = ("arm", "repeat", "task_s", "end_to_end_s", "train_time_s", "overhead_s")
    print(table(header, [[r[column] for column in columns] for r in rows]))
    overhead = median([float(r["overhead_s"]) for r in rows])
    shared = median([float(r["shared_per_arm_s"]) for r in rows])
    fp32_training = median([float(r["train_time_s"]) for r in rows if " fp32" in str(r["arm"])])
    print(
        f"\nmedian per-task overhead: {overhead:.2f} s = {overhead / fp32_training:.1%} of an fp32 "
        f"arm's training time ({fp32_training:.2f} s, median) on {args.subset} images, "
        f"{args.epochs} epochs (goal: under 10 %)"
    )
    print(
        f"of which a bare Python process importing torch: {floor:.2f} s (median of 3); beyond "
        f"it: {overhead - floor:.2f} s = {(overhead - floor) / fp32_training:.1%}"
    )
    profile = median([float(r["profile_s"]) for r in rows])
    print(
        f"of which the profile's own steps (--profile-steps {args.profile_steps}, after the "
        f"epochs): {profile:.2f} s; beyond the bare process and those: "
        f"{overhead - floor - profile:.2f} s"
    )
    print(
        f"prepare + compare, shared by the {len(rows) // args.repeats} arms: {shared:.2f} s "
        f"per arm = {shared / fp32_training:.1%} of that training time"
    )
    write_json(
        args.json,
        {
            "cpu": cpu_name(),
            "cpu_capability": cpu_capability(),
            "subset": args.subset,
            "models": args.models,
            "batch_sizes": args.batch_sizes,
            "lr": args.lr,
            "torch_process_s": floor,
            "epochs": args.epochs,
            "tasks": rows,
            "median_overhead_s": overhead,
            "median_fp32_train_time_s": fp32_training,
            "overhead_fraction": overhead / fp32_training,
            "shared_per_arm_s": shared,
            "profile_steps": args.profile_steps,
            "median_profile_s": profile,
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    archive_argument(parser)
    parser.add_argument("--subset", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--models", default="small-cnn", help="the matrix's models")
    parser.add_argument("--batch-sizes", default="64,128", help="the matrix's batch sizes")
    parser.add_argument(
        "--lr", type=float, default=TrainConfig.lr, help="peak learning rate (vit-s: 0.02)"
    )
    parser.add_argument(
        "--profile-steps", type=int, default=TrainConfig.profile_steps, help="as ampbench run's"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    matrix = ["--models", args.models, "--batch-sizes", args.batch_sizes, *PRECISIONS]
    matrix += ["--profile-steps", str(args.profile_steps)]
    matrix += ["--lr", str(args.lr)]
    require_archive(args.data)
    print(f"CPU: {cpu_name()} ({cpu_capability()})")
    floor = torch_process_s()
    rows = []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="ampbench-matrix-") as work:
            rows += [
                {"repeat": repeat, **row}
                for row in one_run(args.data, args.subset, args.epochs, matrix, Path(work))
            ]
    report(args, rows, floor)


if __name__ == "__main__":
    main()
