"""Shared fixtures: the real CIFAR-10 archive, isolated caches and tracking stores, and small
prepared datasets reused across tests."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Fuzzing (test_prepare_fuzz.py): "ci", the default, runs a fixed set of cases, so that a CI
# failure reproduces; `make fuzz` (--hypothesis-profile=fuzz) runs many more, new each time.
settings.register_profile(
    "ci",
    max_examples=int(os.environ.get("AMPBENCH_FUZZ_EXAMPLES", "350")),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile(
    "fuzz",
    max_examples=5000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.load_profile("ci")

# Real services (Ceph RGW, MLflow servers): fixtures rgw, mlflow_server, mlflow_server_direct.
pytest_plugins = ["services"]

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("benchmarks_common", REPO / "benchmarks/common.py")
assert _spec is not None and _spec.loader is not None
benchmarks_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(benchmarks_common)  # the archive's location, defined there
IN_CI = os.environ.get("CI") == "true"

# In each pytest-xdist worker, its share of the cores for torch's threads (and those of the
# processes it starts): two workers' OpenMP teams spinning on the same two cores ran 2-3 times
# slower. Only where the user has not set it.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    _share = (_cores or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _share)))


def require(condition: bool, reason: str) -> None:
    """Skip when a test's prerequisite is missing, except under CI, where that is a failure."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


def small_cnn_of_width(monkeypatch: pytest.MonkeyPatch, width: int) -> None:
    """Every model the trainer builds in this process: a small-cnn `width` channels wide (the
    built-in is 64). Convolutions cost about width squared, and a CPU without native bf16 (or
    fp16) runs an autocast arm's on scalar fallback kernels, ten times fp32's time or more."""
    from ampbench.train import arm
    from ampbench.train.models import small_cnn

    monkeypatch.setattr(
        arm, "build_model", lambda name, classes, image_shape: small_cnn(classes, width=width)
    )


@pytest.fixture()
def tiny_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """A small-cnn 8 channels wide, for tests of what a run records rather than what it learns."""
    small_cnn_of_width(monkeypatch, 8)


@pytest.fixture(scope="session")
def cifar_archive() -> Path:
    path = benchmarks_common.DEFAULT_ARCHIVE
    env = benchmarks_common.ARCHIVE_ENV
    require(path.is_file(), f"the CIFAR-10 archive is not at {path} (set {env})")
    return path


@pytest.fixture(scope="session", autouse=True)
def isolated_environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Caches and the default MLflow store in a temporary directory, never the user's."""
    root = tmp_path_factory.mktemp("env")
    saved = {key: os.environ.get(key) for key in ("XDG_CACHE_HOME", "MLFLOW_TRACKING_URI")}
    os.environ["XDG_CACHE_HOME"] = str(root / "cache")
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{root / 'mlflow.db'}"
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def synthetic_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Prepared `synthetic` data: 1,000 images per split."""
    from ampbench.data import prepare_dataset

    out = tmp_path_factory.mktemp("datasets") / "synthetic"
    prepare_dataset("synthetic", out, subset=1000)
    return out


@pytest.fixture(scope="session")
def cifar_subset(tmp_path_factory: pytest.TempPathFactory, cifar_archive: Path) -> Path:
    """Prepared real CIFAR-10: 500 training and 500 test images."""
    from ampbench.data import prepare_dataset

    out = tmp_path_factory.mktemp("datasets") / "cifar"
    prepare_dataset(str(cifar_archive), out, subset=500)
    return out
