"""The GPU benchmark's CPU smoke test: the script runs end to end and writes its table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO


def test_gpu_benchmark_runs_on_the_cpu(cifar_archive: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_benchmark.py"), "--device", "cpu",
         "--data", str(cifar_archive), "--subset", "128", "--json", str(tmp_path / "gpu.json")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    table = json.loads((tmp_path / "gpu.json").read_text())
    assert [(r["precision"], r["batch_size"]) for r in table["runs"]] == [
        ("fp32", 64),
        ("bf16", 64),
    ]
    bf16 = table["runs"][1]
    assert bf16["speedup_vs_fp32"] > 0 and bf16["accuracy"] is not None
    assert "fp32 b64" in done.stdout and "bf16 b64" in done.stdout
