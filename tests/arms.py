"""Training results made for tests: one arm and seed with the headline figures asked for
(arm_result), changed field by field (with_), written as a results file (write_results)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ampbench.results import (
    RESULTS_SCHEMA_VERSION,
    ArmResults,
    DatasetRecord,
    DeviceRecord,
    EpochRecord,
    Memory,
    PrecisionRecord,
    Startup,
    Timing,
    Versions,
    write_json,
)

IMAGES = 50_000
# Results files written by earlier versions (small-cnn, 100 synthetic images, one epoch, fp32
# and bf16 on a CPU): schema 1 by commit 1f5d895, schema 2 by commit 6e1a056.
SCHEMA_1 = SCHEMA_2 = Path(__file__).parent / "data"
T_975_DF2 = 4.302653  # Student's t, 97.5th percentile, 2 degrees of freedom


def arm_result(
    precision: str,
    seed: int,
    accuracy: float,
    memory: float,
    time_s: float,
    *,
    emulated: bool = False,
    resumed: bool = False,
    **hyperparameters: Any,
) -> ArmResults:
    """A training run's results with the given headline figures (CUDA, full CIFAR-10)."""
    resolved = "fp16" if precision == "amp" else precision
    return ArmResults(
        schema_version=RESULTS_SCHEMA_VERSION,
        precision=PrecisionRecord(
            requested=precision,
            resolved=resolved,
            autocast_dtype={"fp16": "float16", "bf16": "bfloat16"}.get(resolved),
            grad_scaler=resolved == "fp16",
            tf32=resolved == "tf32",
            emulated=emulated,
            support="EMULATED: no tensor cores" if emulated else "native",
        ),
        device=DeviceRecord("cuda", "NVIDIA H200", "compute capability 9.0"),
        model="resnet18",
        parameters=11_173_962,
        hyperparameters={
            "seed": seed,
            "epochs": 2,
            "batch_size": 128,
            "lr": 0.1,
            "compile": False,
            "precision": precision,
            **hyperparameters,
        },
        dataset=DatasetRecord("/d", "cifar10", "ab" * 32, 10, [32, 32, 3], IMAGES, 10_000),
        accuracy=accuracy,
        test_loss=1.0,
        timing=Timing(
            train_time_s=time_s,
            throughput_img_s=2 * IMAGES / time_s,
            trained_images=2 * IMAGES,
            end_to_end_s=time_s + 10.0,
            warmup_s=5.0,
            warmup_steps=3,
            compile_s=0.0,
            compile_cache=None,
            eval_s=5.0,
            checkpoint_s=0.0,
            startup=Startup(total_s=6.0 + seed, imports_s=4.0, state_s=2.0 + seed),
        ),
        memory=Memory("cuda_allocated", memory, memory + 300.0, 250.0, memory + 50.0, None),
        skipped_steps=0,
        loss_scale=None,
        resumed_from="/ckpt/ckpt-000000007.pt" if resumed else None,
        versions=Versions("0.1.0", "2.14.1", "0.29.1", "13.0", 91000, "3.12.3"),
        epochs=[
            EpochRecord(
                epoch,
                1.0 + seed,
                0.5,
                1.2,
                accuracy,
                None,
                None,
                time_s / 2,
                IMAGES / (time_s / 2),
                memory,
                0.1,
                1.0,
                0,
            )
            for epoch in (1, 2)
        ],
    )


def with_(run: ArmResults, **changes: Any) -> ArmResults:
    """The run with nested fields replaced: with_(run, device__name="A100")."""
    for path, value in changes.items():
        outer, _, inner = path.partition("__")
        if inner:
            value = dataclasses.replace(getattr(run, outer), **{inner: value})
        run = dataclasses.replace(run, **{outer: value})
    return run


def write_results(path: Path, run: ArmResults) -> Path:
    write_json(path, run)
    return path
