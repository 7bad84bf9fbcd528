"""Benchmark: the pipeline's train step and the GPU benchmark measure the same speedup.

Both entry points train through the engine's one measurement protocol. This runs the same
arms (strict fp32 and amp, small-cnn on a CIFAR-10 subset, on this CPU) both ways, several
times, interleaved: `ampbench run` (the KFP local runner: prepare, the train step per arm,
compare) and `benchmarks/gpu_benchmark.py --device cpu`. It prints each one's steady-state
speedup per repeat, their medians and ranges, and whether the medians differ by less than
the run-to-run spread. Where this CPU has no native bf16 both arms run it emulated (labelled
so): agreement is about the protocol, not about bf16.

    python benchmarks/protocol_agreement.py [--data ARCHIVE] [--repeats 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from common import REPO, archive_argument, median, require_archive, table, write_json

from ampbench.results import RESULTS_FILE
from ampbench.train.precision import cpu_capability, cpu_name, resolve

SETUP = ["--subset", "2048", "--epochs", "2", "--model", "small-cnn"]
BATCH = "128"


def pipeline_speedup(archive: Path, out: Path) -> float:
    command = [sys.executable, "-m", "ampbench.cli", "run", "--data", str(archive), *SETUP]
    command += ["--batch-size", BATCH, "--allow-emulated", "--no-tracking"]
    done = subprocess.run(
        [*command, "--output-dir", str(out)], capture_output=True, text=True, cwd=out.parent
    )
    if done.returncode != 0:
        sys.exit(f"protocol_agreement: ampbench run failed:\n{done.stderr[-3000:]}")
    return json.loads((out / RESULTS_FILE).read_text())["speedup"]


def benchmark_speedup(archive: Path, out: Path) -> float:
    command = [sys.executable, str(REPO / "benchmarks" / "gpu_benchmark.py"), "--device", "cpu"]
    command += ["--data", str(archive), *SETUP, "--precisions", "fp32,amp"]
    command += ["--batch-sizes", BATCH, "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"protocol_agreement: gpu_benchmark.py failed:\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())["comparisons"][BATCH]["speedup"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    archive_argument(parser)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    require_archive(args.data)
    entry_points = {"pipeline train step": pipeline_speedup, "gpu_benchmark.py": benchmark_speedup}
    samples: dict[str, list[float]] = {name: [] for name in entry_points}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            names = list(entry_points)
            for name in names[repeat % 2 :] + names[: repeat % 2]:  # alternate who goes first
                out = Path(tmp) / f"{name.split()[0]}-{repeat}"
                speedup = entry_points[name](args.data, out)
                samples[name].append(speedup)
                print(f"repeat {repeat + 1}: {name:20} amp/fp32 speedup {speedup:.3f}", flush=True)
    medians = {name: median(values) for name, values in samples.items()}
    spreads = {name: max(values) - min(values) for name, values in samples.items()}
    rows = [
        [name, *(f"{v:.3f}" for v in (median(values), min(values), max(values), spreads[name]))]
        for name, values in samples.items()
    ]
    amp = resolve("amp", torch.device("cpu"), allow_emulated=True)
    print(
        f"\nsmall-cnn, CIFAR-10 subset 2048, 2 epochs, batch {BATCH}, {args.repeats} repeats; "
        f"{cpu_name()} ({cpu_capability()}), {torch.get_num_threads()} threads; amp is "
        f"{amp.name}, {amp.support}"
    )
    print(table(["entry point", "median speedup", "min", "max", "range"], rows))
    pipeline, benchmark = medians.values()
    difference = abs(pipeline - benchmark)
    noise = max(spreads.values())
    verdict = "agree" if difference <= noise else "DISAGREE"
    print(
        f"medians differ by {difference:.3f} ({difference / benchmark:.1%}); the larger "
        f"run-to-run range is {noise:.3f}: the entry points {verdict} within run-to-run noise"
    )
    write_json(
        args.json,
        {"samples": samples, "medians": medians, "difference": difference, "noise": noise},
    )


if __name__ == "__main__":
    main()
