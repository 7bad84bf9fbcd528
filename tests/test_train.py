"""The train step: precisions resolve as documented, training learns, results mean what they say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ampbench.components.train.config import TrainConfig
from ampbench.components.train.data import random_crop_flip, step_generator
from ampbench.components.train.engine import Trainer, train
from ampbench.components.train.precision import math_mode, resolve
from ampbench.components.train.step import run_training
from ampbench.errors import AmpbenchError

CPU = torch.device("cpu")
CHANCE = 0.1  # ten classes


def test_fp32_is_strict_and_has_no_autocast() -> None:
    precision = resolve("fp32", CPU)
    assert precision.autocast_dtype is None
    assert not precision.grad_scaler
    assert not precision.tf32
    assert precision.describe()["tf32_matmul"] is False
    assert precision.describe()["tf32_cudnn"] is False


@pytest.mark.parametrize("requested", ["bf16", "amp"])
def test_bf16_and_amp_on_cpu_autocast_to_bfloat16_without_scaler(requested: str) -> None:
    precision = resolve(requested, CPU)
    assert precision.name == "bf16"
    assert precision.autocast_dtype == torch.bfloat16
    assert not precision.grad_scaler


@pytest.mark.parametrize("requested", ["fp16", "tf32"])
def test_cuda_only_precisions_fail_on_cpu_before_any_data_is_read(
    requested: str, tmp_path: Path
) -> None:
    config = TrainConfig(dataset_dir=tmp_path / "missing", precision=requested, device="cpu")
    with pytest.raises(AmpbenchError, match=f"{requested} needs a CUDA GPU"):
        Trainer(config)


def fake_gpu(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int]) -> torch.device:
    """resolve() sees a GPU of this compute capability (it asks nothing else of the device)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: f"GPU sm{capability}")
    return torch.device("cuda")


def test_cuda_precisions_resolve_by_compute_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    hopper = fake_gpu(monkeypatch, (9, 0))
    amp = resolve("amp", hopper)
    assert (amp.name, amp.autocast_dtype, amp.grad_scaler) == ("fp16", torch.float16, True)
    bf16 = resolve("bf16", hopper)
    assert (bf16.autocast_dtype, bf16.grad_scaler) == (torch.bfloat16, False)
    tf32 = resolve("tf32", hopper)
    assert tf32.autocast_dtype is None and tf32.describe()["tf32_cudnn"] is True
    assert resolve("fp32", hopper).describe()["tf32_cudnn"] is False


@pytest.mark.parametrize(
    ("requested", "capability", "message"),
    [
        ("bf16", (7, 0), r"GPU sm\(7, 0\) does not support bfloat16; use fp16"),
        ("bf16", (7, 5), "does not support bfloat16"),
        ("tf32", (7, 5), r"has no TF32 \(needs compute capability 8.0"),
    ],
)
def test_precisions_a_gpu_cannot_run_are_errors(
    requested: str, capability: tuple[int, int], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(AmpbenchError, match=message):
        resolve(requested, fake_gpu(monkeypatch, capability))


def test_math_mode_sets_tf32_only_for_the_tf32_arm_and_puts_it_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpu = fake_gpu(monkeypatch, (9, 0))
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    for name, expected in (("fp32", False), ("tf32", True), ("bf16", False)):
        with math_mode(resolve(name, gpu)):
            assert torch.backends.cuda.matmul.allow_tf32 is expected, name
            assert torch.backends.cudnn.allow_tf32 is expected, name
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


def test_unknown_precision_is_an_error() -> None:
    with pytest.raises(AmpbenchError, match="'fp8' is not one of"):
        resolve("fp8", CPU)


@pytest.mark.parametrize(
    ("requested", "expected"), [("fp32", torch.float32), ("amp", torch.bfloat16)]
)
def test_autocast_dtype_is_observed_inside_the_forward_pass(
    requested: str, expected: torch.dtype, synthetic_dataset: Path
) -> None:
    trainer = Trainer(
        TrainConfig(
            dataset_dir=synthetic_dataset, precision=requested, model="small-cnn", device="cpu"
        )
    )
    seen: list[torch.dtype] = []
    first_conv = next(m for m in trainer.model.modules() if isinstance(m, torch.nn.Conv2d))
    first_conv.register_forward_hook(lambda _m, _i, output: seen.append(output.dtype))
    rows = torch.arange(trainer.config.batch_size)
    trainer.train_step(trainer.model, rows, epoch=0, step=0)
    assert seen == [expected]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_training_learns_far_above_chance(precision: str, synthetic_dataset: Path) -> None:
    results, _ = train(
        TrainConfig(
            dataset_dir=synthetic_dataset,
            precision=precision,
            model="small-cnn",
            epochs=3,
            batch_size=64,
            device="cpu",
        )
    )
    assert results["accuracy"] > 6 * CHANCE
    losses = [epoch["train_loss"] for epoch in results["epochs"]]
    assert losses[-1] < losses[0]


def test_default_model_learns(synthetic_dataset: Path) -> None:
    results, _ = train(
        TrainConfig(dataset_dir=synthetic_dataset, precision="amp", batch_size=64, device="cpu")
    )
    assert results["model"] == "resnet18"
    assert results["accuracy"] > 3 * CHANCE


def test_results_record_what_ran(synthetic_dataset: Path, tmp_path: Path) -> None:
    results = run_training(
        TrainConfig(
            dataset_dir=synthetic_dataset,
            precision="amp",
            model="small-cnn",
            epochs=2,
            batch_size=100,
            subset=300,
            device="cpu",
        ),
        tmp_path / "results.json",
        tmp_path / "model.pt",
    )
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk == results
    assert results["precision"] == "amp"
    assert results["resolved_precision"] == "bf16"
    assert results["autocast_dtype"] == "bfloat16"
    assert results["device"] == "cpu"
    assert results["grad_scaler"] is False
    assert results["dataset"]["train_images"] == 300
    assert len(results["epochs"]) == 2
    assert results["train_time_s"] == pytest.approx(sum(e["time_s"] for e in results["epochs"]))
    assert results["throughput_img_s"] > 0
    assert results["peak_memory_mb"] > 0
    assert results["versions"]["torch"] == torch.__version__
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    assert any(key.endswith("weight") for key in state)


def test_augmentation_keeps_shapes_and_is_seed_reproducible() -> None:
    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    first = random_crop_flip(images, step_generator(CPU, 1, 0, 5))
    again = random_crop_flip(images, step_generator(CPU, 1, 0, 5))
    other = random_crop_flip(images, step_generator(CPU, 1, 0, 6))
    assert first.shape == images.shape and first.dtype == torch.uint8
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    # Each output is one of the 2 x 9 x 9 crops (padding 4, either flip) of its own input.
    padded = torch.nn.functional.pad(images, (4, 4, 4, 4))
    for index in range(len(images)):
        crops = [
            view[:, dy : dy + 32, dx : dx + 32]
            for view in (padded[index], padded[index].flip(2))
            for dy in range(9)
            for dx in range(9)
        ]
        assert any(torch.equal(first[index], crop) for crop in crops), index


def test_a_dataset_without_test_split_is_refused(synthetic_dataset: Path, tmp_path: Path) -> None:
    import json
    import shutil

    copy = tmp_path / "no-test"
    shutil.copytree(synthetic_dataset, copy)
    metadata = json.loads((copy / "metadata.json").read_text())
    del metadata["counts"]["test"]
    (copy / "metadata.json").write_text(json.dumps(metadata))
    with pytest.raises(AmpbenchError, match="has no test split"):
        Trainer(TrainConfig(dataset_dir=copy, device="cpu"))


def test_invalid_settings_are_named(synthetic_dataset: Path) -> None:
    with pytest.raises(AmpbenchError, match="--epochs"):
        TrainConfig(dataset_dir=synthetic_dataset, epochs=0).validate()
    with pytest.raises(AmpbenchError, match="--batch-size 5000"):
        Trainer(TrainConfig(dataset_dir=synthetic_dataset, batch_size=5000, device="cpu"))
    with pytest.raises(AmpbenchError, match="not a prepared dataset"):
        Trainer(TrainConfig(dataset_dir=synthetic_dataset.parent, device="cpu"))
