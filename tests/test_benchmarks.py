"""The GPU check's CPU smoke mode: the script that runs on a bare GPU machine runs here end to
end, small, and its benchmark writes the comparison table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO


def test_gpu_check_smoke_runs_on_the_cpu(cifar_archive: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--cpu-smoke",
         "--data", str(cifar_archive), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHON": sys.executable},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    collected = (tmp_path / "out" / "gpu-tests.txt").read_text()
    assert "tests/test_gpu.py::test_tf32_is_really_off_in_the_fp32_arm" in collected
    arms = (tmp_path / "out" / "arms.jsonl").read_text().splitlines()
    assert [json.loads(line)["precision"]["requested"] for line in arms] == ["fp32", "bf16"]
    table = json.loads((tmp_path / "out" / "gpu.json").read_text())
    comparison = table["comparisons"]["64"]
    assert list(comparison["arms"]) == ["fp32", "bf16"]
    assert comparison["speedup"] > 0 and comparison["verdict"].startswith("On ")
    assert "===== RESULTS =====" in done.stdout and "Verdict: On " in done.stdout
    assert "steady-state speedup" in done.stdout  # the table against fp32
    # The ViT with an fp8 arm (emulated on a CPU; a GPU of compute capability 8.9+ runs it).
    vit_arms = [
        json.loads(line) for line in (tmp_path / "out" / "vit-arms.jsonl").read_text().splitlines()
    ]
    assert [(arm["model"], arm["precision"]["requested"]) for arm in vit_arms] == [
        ("vit-s", "fp32"),
        ("vit-s", "fp8"),
    ]
    assert vit_arms[1]["precision"]["emulated"] and vit_arms[0]["hyperparameters"]["lr"] == 0.02
    vit = json.loads((tmp_path / "out" / "vit.json").read_text())["comparisons"]["16"]
    assert list(vit["arms"]) == ["fp32", "fp8"] and vit["speedup"] > 0


def test_gpu_check_refuses_a_missing_archive(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--data", str(tmp_path / "none")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == f"gpu_check: --data {tmp_path / 'none'}: no such file (the CIFAR-10 archive)"
    )
