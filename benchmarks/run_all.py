"""Run every CPU benchmark in turn (`make bench`); figures go to benchmarks/results/*.json.

The GPU benchmark is not among them: on a machine with a GPU, run
`python benchmarks/gpu_benchmark.py --data ARCHIVE --json benchmarks/results/gpu.json`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = [
    "prepare_cifar10",
    "train_cpu",
    "mlflow_overhead",
    "protocol_agreement",
    "matrix_overhead",
    "compile_cache",
    "profile_overhead",
]


def main() -> int:
    results = HERE / "results"
    failed = []
    for name in BENCHMARKS:
        print(f"\n===== {name} =====", flush=True)
        command = [
            sys.executable,
            str(HERE / f"{name}.py"),
            "--json",
            str(results / f"{name}.json"),
        ]
        if subprocess.run(command + sys.argv[1:]).returncode != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
