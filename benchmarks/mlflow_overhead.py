"""Benchmark: what MLflow logging costs a training run, against the epoch it rides on.

The train step creates the MLflow run (with its params) before the clock starts, and sends
each epoch's metrics between epochs, outside the timed steps: the timed training loop waits
for MLflow not at all. What remains is wall time between epochs. This measures, median of 20
epochs, against a local sqlite store and a real `mlflow server` on loopback: the time to
queue and send one epoch's metrics, compared with one CIFAR-10 epoch of the same training
measured in the same run (ResNet-18, batch 128, on this machine: images/s from a short
engine run, times 50,000 images). Goal: <= 1 % of an epoch. The per-run costs
(creating the run, logging the model) print apart.

    python benchmarks/mlflow_overhead.py [--data ARCHIVE] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import torch
from common import (
    archive_argument,
    median,
    require_archive,
    shrink_evaluation,
    table,
    write_json,
)

from ampbench.data import SourceOptions, prepare_dataset
from ampbench.errors import AmpbenchError
from ampbench.results import RESULTS_FILE
from ampbench.tracking import (
    PRECISION_TAG,
    TRACKING_URI_ENV,
    ArmRun,
    DatasetInput,
    LoggedModelSpec,
)
from ampbench.train import BASELINE_PRECISION
from ampbench.train.config import TrainConfig
from ampbench.train.loop import Trainer
from ampbench.train.models import build_model
from ampbench.train.precision import cpu_capability, cpu_name
from ampbench.train.tracker import EPOCH_METRICS

EPOCHS = 20
CIFAR_TRAIN_IMAGES = 50_000


@contextlib.contextmanager
def mlflow_server(root: Path) -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--workers", "1", "--backend-store-uri", f"sqlite:///{root / 'server.db'}"]
    command += ["--artifacts-destination", str(root / "artifacts")]
    server = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{uri}/health", timeout=2) as response,
            ):
                if response.status == 200:
                    break
            time.sleep(0.5)
        yield uri
    finally:
        os.killpg(server.pid, 9)
        server.wait()


def logging_costs(uri: str, tmp: Path) -> dict[str, float]:
    os.environ[TRACKING_URI_ENV] = uri
    started = time.perf_counter()
    run = ArmRun(
        "overhead", "benchmark", {PRECISION_TAG: BASELINE_PRECISION}, {"lr": 0.1, "batch_size": 128}
    )
    create = time.perf_counter() - started
    sends = []
    for epoch in range(1, EPOCHS + 1):
        record = {name: 0.5 / epoch for name in EPOCH_METRICS.values()}
        started = time.perf_counter()
        run.log_metrics(record, step=epoch)  # what the train step does between epochs
        assert run.flush() and not run.pending
        sends.append(time.perf_counter() - started)
    results = tmp / RESULTS_FILE
    results.write_text("{}")
    started = time.perf_counter()
    model = LoggedModelSpec(
        module=build_model("resnet18", 10).eval(),
        input_shape=(3, 32, 32),
        classes=10,
        metrics={"accuracy": 0.5},
        dataset=DatasetInput("cifar10", "cifar10.tar.gz", "0" * 36, {"train": 128, "test": 128}),
        step=EPOCHS,
    )
    run.finish({RESULTS_FILE: results}, model)
    return {
        "create_s": create,
        "between_epochs_ms": 1000 * median(sends),
        "finish_s": time.perf_counter() - started,
    }


def epoch_seconds(archive: Path, tmp: Path) -> dict[str, float]:
    dataset = tmp / "prepared"
    prepare_dataset(
        str(archive), dataset, subset=25 * 128, options=SourceOptions(cache_dir=tmp / "c")
    )
    seconds = {}
    for precision in ("fp32", "bf16"):
        try:
            trainer = Trainer(
                TrainConfig(dataset_dir=dataset, precision=precision, epochs=1, device="cpu")
            )
        except AmpbenchError as error:  # no native bf16 here: fp32's epoch is the yardstick
            print(f"{precision}: {error}")
            continue
        shrink_evaluation(trainer)
        throughput = trainer.run().timing.throughput_img_s
        seconds[precision] = CIFAR_TRAIN_IMAGES / throughput
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    archive_argument(parser)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    require_archive(args.data)  # now, not after the logging it measures first
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        costs = {"sqlite": logging_costs(f"sqlite:///{tmp / 'local.db'}", tmp)}
        with mlflow_server(tmp) as uri:
            costs["server"] = logging_costs(uri, tmp)
        epochs = epoch_seconds(args.data, tmp)
    rows = []
    for store, cost in costs.items():
        for precision, seconds in epochs.items():
            share = cost["between_epochs_ms"] / 10 / seconds
            rows.append(
                [f"{store} / {precision}", cost["between_epochs_ms"], seconds, f"{share:.4f} %"]
            )
    threads = torch.get_num_threads()
    print(
        f"MLflow per-epoch logging ({len(EPOCH_METRICS)} metrics, one log_batch, sent between "
        f"epochs) against one CIFAR-10 epoch of ResNet-18 on this {threads}-thread CPU "
        f"({cpu_name()}; {cpu_capability()})"
    )
    header = ["store / arm", "between epochs ms", "epoch s", "share of an epoch"]
    print(table(header, rows))
    for store, cost in costs.items():
        print(
            f"{store}: creating the run and its params {cost['create_s']:.2f} s, before the "
            f"clock; finishing it (artifacts, log_model) {cost['finish_s']:.2f} s, once per run"
        )
    worst = max(cost["between_epochs_ms"] for cost in costs.values())
    print(
        "the timed steps wait for MLflow not at all; the wall time between epochs stays "
        f"under 1 % of any epoch longer than {worst / 10:.2f} s"
    )
    write_json(args.json, {"costs": costs, "epoch_s": epochs})


if __name__ == "__main__":
    main()
