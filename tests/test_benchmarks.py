"""The GPU check as it runs on a bare GPU machine, here on the CPU: `make gpu-bundle`'s bundle
(built for this Python), installed by `gpu_check.sh --bundle --cpu-smoke` into a Python that
has only what such a machine has, checked from a copy of the checkout, end to end and small."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

MiB = 1024 * 1024
BUNDLE_SCRIPT = REPO / "scripts" / "gpu-bundle.py"


def bundle_script_constant(name: str) -> str:
    spec = importlib.util.spec_from_file_location("gpu_bundle", BUNDLE_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def bare_machine_python(root: Path) -> Path:
    """A Python with only what the GPU machine has of this environment: the bundle script's
    PRESENT packages, what they require, and pip, linked into one folder that a fresh venv
    sees; not full mlflow, kfp, boto3 or ampbench."""
    present = root / "present"
    present.mkdir(parents=True)
    pending, seen = [*bundle_script_constant("PRESENT").split(), "pip"], set()
    while pending:
        name = canonicalize_name(pending.pop())
        if name in seen:
            continue
        seen.add(name)
        distribution = importlib.metadata.distribution(name)
        for line in distribution.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name)
        for top in {file.parts[0] for file in distribution.files or []} - {".."}:
            if not (present / top).exists():
                (present / top).symlink_to(Path(str(distribution.locate_file(top))))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (venv / "lib" / version / "site-packages" / "present.pth").write_text(f"{present}\n")
    return venv / "bin" / "python"


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_gpu_check_from_a_bundle_on_the_cpu(cifar_archive: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    python_version = f"{sys.version_info.major}.{sys.version_info.minor}"
    built = subprocess.run(
        [sys.executable, str(BUNDLE_SCRIPT), "--python-version", python_version,
         "--out", str(bundle)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    manifest = json.loads((bundle / "bundle.json").read_text())
    wheels = sorted(path.name for path in bundle.glob("*.whl"))
    assert manifest["wheels"] == wheels and manifest["complete"]
    size = sum(path.stat().st_size for path in bundle.glob("*.whl"))
    assert size < 40 * MiB, f"{size / MiB:.1f} MiB"
    assert f"{size / MiB:.1f} MiB in {bundle}" in built.stdout
    names = {canonicalize_name(wheel.split("-")[0]) for wheel in wheels}
    assert {"ampbench", "kfp", "kfp-server-api", "mlflow-skinny", "sqlalchemy", "torchao"} <= names
    # Not what the machine has (torch, numpy, ...), nor full mlflow's UI, nor boto3 (S3 only).
    assert not names & {"torch", "torchvision", "numpy", "pandas", "mlflow", "boto3", "botocore"}

    python = bare_machine_python(tmp_path / "machine")
    lacks = subprocess.run([str(python), "-c", "import kfp"], capture_output=True, text=True)
    assert "No module named 'kfp'" in lacks.stderr  # the bundle must bring it
    checkout = tmp_path / "checkout"
    shutil.copytree(
        REPO, checkout, ignore=shutil.ignore_patterns(".venv*", ".git", "runs", "dist", "gpu-check")
    )
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--cpu-smoke", "--bundle", str(bundle),
         "--data", str(cifar_archive), "--out", str(out)],
        capture_output=True, text=True, timeout=900, cwd=checkout,
        env={**os.environ, "PYTHON": str(python)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-3000:]
    summary = (out / "summary.txt").read_text()
    assert "every stage passed" in summary
    for stage in ("install", "gpu-tests", "resnet", "vit", "pipeline"):
        assert f"gpu_check: {stage}: " in summary  # each with its elapsed time

    # The package under test is the bundle's, installed in a temporary folder: not the copy of
    # the checkout it ran from, whose ampbench/ lacks the steps.
    installed, where = (out / "install.txt").read_text().splitlines()
    assert installed.startswith(f"{len(wheels)} wheels, ")
    assert where.startswith("ampbench imported from /") and str(checkout) not in where
    assert where.endswith("/site/ampbench/__init__.py")
    assert "collected" in (out / "gpu-tests.txt").read_text()

    # ResNet stage: engine arms, bare-loop arms, the comparison and engine / bare.
    arms = jsonl(out / "arms.jsonl")
    assert [arm["precision"]["requested"] for arm in arms] == ["fp32", "bf16"]
    bare = jsonl(out / "bare.jsonl")
    assert [(loop["precision"], loop["model"], loop["batch_size"]) for loop in bare] == [
        ("fp32", "small-cnn", 16),
        ("bf16", "small-cnn", 16),
    ]
    assert all(loop["images_per_s"] > 0 and loop["steps"] > 0 for loop in bare)
    gpu = json.loads((out / "gpu.json").read_text())
    comparison = gpu["comparisons"]["16"]
    assert list(comparison["arms"]) == ["fp32", "bf16"]
    # One seed: the speedup is the arms' own throughputs' ratio, from this run's arms.
    throughput = [arm["timing"]["throughput_img_s"] for arm in arms]
    assert comparison["speedup"] == pytest.approx(throughput[1] / throughput[0], rel=1e-9)
    ratios = gpu["engine_over_bare"]["16"]
    assert list(ratios) == ["fp32", "bf16"]
    for precision, ratio in ratios.items():
        engine = next(a for a in arms if a["precision"]["requested"] == precision)
        assert ratio["engine_img_s"] == engine["timing"]["throughput_img_s"]
        assert ratio["engine_over_bare"] == ratio["engine_img_s"] / ratio["bare_img_s"]
    resnet = (out / "resnet.txt").read_text()
    assert "===== RESULTS =====" in resnet and "steady-state speedup" in resnet
    assert "engine / bare" in resnet
    # --profile: a Chrome trace and a table per arm, engine and bare loop alike.
    for arm in ("engine-fp32-b16-s0", "bare-fp32-b16-s0", "engine-bf16-b16-s0", "bare-bf16-b16-s0"):
        trace = json.loads((out / "profiles" / f"{arm}.trace.json").read_text())
        assert trace["traceEvents"], arm
        assert "Self CPU" in (out / "profiles" / f"{arm}.txt").read_text()

    # ViT stage: an fp8 arm (emulated on a CPU; a GPU of compute capability 8.9+ runs it).
    vit_arms = jsonl(out / "vit-arms.jsonl")
    assert [(arm["model"], arm["precision"]["requested"]) for arm in vit_arms] == [
        ("vit-s", "fp32"),
        ("vit-s", "fp8"),
    ]
    assert vit_arms[1]["precision"]["emulated"] and vit_arms[0]["hyperparameters"]["lr"] == 0.02
    vit = json.loads((out / "vit.json").read_text())
    assert list(vit["comparisons"]["8"]["arms"]) == ["fp32", "fp8"] and not vit["bare"]
    vit_throughput = [arm["timing"]["throughput_img_s"] for arm in vit_arms]
    assert vit["comparisons"]["8"]["speedup"] == pytest.approx(
        vit_throughput[1] / vit_throughput[0], rel=1e-9
    )

    # Pipeline stage: the whole pipeline through the KFP local runner, MLflow in sqlite.
    pipeline = (out / "pipeline.txt").read_text()
    assert "===== RESULTS =====" in pipeline and "Verdict: On " in pipeline
    assert (out / "pipeline" / "mlflow.db").stat().st_size > 0
    results = json.loads((out / "pipeline" / "run" / "results.json").read_text())
    assert list(results["arms"]) == ["fp32", "amp"]  # the compare step's JSON
    assert f"{results['speedup']:.2f}x" in pipeline


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


def test_gpu_check_without_a_gpu_fails_instead_of_skipping_every_test(tmp_path: Path) -> None:
    archive = tmp_path / "archive.tar.gz"
    archive.write_bytes(b"")  # not read: the check stops before
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--data", str(archive),
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "gpu_check: CUDA is not visible to torch here (run where a GPU is, or pass --cpu-smoke)"
    )
    assert not (tmp_path / "out" / "gpu-tests.txt").exists()


def test_gpu_check_refuses_a_folder_that_is_no_bundle(cifar_archive: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--bundle", str(tmp_path),
         "--data", str(cifar_archive)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"gpu_check: --bundle {tmp_path}: not a complete bundle (no bundle.json; make gpu-bundle)"
    )


def test_gpu_bundle_refuses_a_platform_it_cannot_expand(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BUNDLE_SCRIPT), "--platform", "win_amd64", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "gpu-bundle: error: --platform win_amd64: expected manylinux_2_N_ARCH, N >= 17"
    )


def test_gpu_benchmark_refuses_a_precision_it_does_not_know() -> None:
    """A misspelt arm is a usage error, not an arm 'skipped' as if the device lacked it."""
    script = REPO / "benchmarks" / "gpu_benchmark.py"
    done = subprocess.run(
        [sys.executable, str(script), "--precisions", "fp32,fp61"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--precisions: 'fp61' is not one of" in done.stderr
    assert "Traceback" not in done.stderr
