"""The train step: precisions resolve as documented, training learns, results mean what they say."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import small_cnn_of_width

from ampbench.dataset_format import read_metadata
from ampbench.errors import AmpbenchError
from ampbench.results import read_arm_results
from ampbench.train.config import (
    MIN_STEPS_PER_EPOCH,
    TrainConfig,
    automatic_batch_size,
    with_batch_for_data,
)
from ampbench.train.data import (
    CROP_PADDING,
    crop_flip,
    draw_crop_flip,
    step_generator,
)
from ampbench.train.graphs import StepInputs
from ampbench.train.loop import Trainer, train
from ampbench.train.optim import OneCycle
from ampbench.train.precision import cpu_capability
from ampbench.train.step import run_training

CPU = torch.device("cpu")
CHANCE = 0.1  # ten classes


@pytest.mark.usefixtures("tiny_model")
@pytest.mark.parametrize(
    ("requested", "expected"), [("fp32", torch.float32), ("amp", torch.bfloat16)]
)
def test_autocast_dtype_is_observed_inside_the_forward_pass(
    requested: str, expected: torch.dtype, synthetic_dataset: Path
) -> None:
    trainer = Trainer(
        TrainConfig(
            dataset_dir=synthetic_dataset,
            precision=requested,
            model="small-cnn",
            device="cpu",
            allow_emulated=True,  # bf16 on any CPU: what is observed is the dtype, not speed
        )
    )
    seen: list[torch.dtype] = []
    first_conv = next(m for m in trainer.model.modules() if isinstance(m, torch.nn.Conv2d))
    first_conv.register_forward_hook(lambda _m, _i, output: seen.append(output.dtype))
    order = torch.arange(trainer.config.batch_size)
    trainer.take_step(trainer.step_inputs(order, epoch=0, step=0), global_step=0)
    assert seen == [expected]


# The synthetic classes are stripes (five periods, horizontal or vertical) on a random colour
# per image: only the structure tells them apart. After these 60 steps a correct trainer, with
# small-cnn 48 channels wide, got at least 397 of the 400 test images right (fp32 and bf16,
# seeds 0-5); training on transposed crops, on labels shifted by one image, or on images
# normalised twice, got chance or less. What this cannot see: a schedule without warm-up or
# decay, or constant, still passes on data this easy (the schedule's own test below catches
# those), and so does an unnormalised input (BatchNorm absorbs it; the normalisation test below
# catches that). No warm-up steps (untimed, and undone anyway). 48 wide, not the built-in 64:
# a bf16 arm on a CPU without native bf16 takes 40 s instead of 70 (and 32 wide reached only
# 0.92 at seed 2).
LEARNING_RUN: dict[str, Any] = {
    "model": "small-cnn", "epochs": 3, "batch_size": 20, "subset": 400, "lr": 0.05,
    "device": "cpu", "allow_emulated": True, "deterministic": True, "warmup_steps": 0,
    "eval_batch_size": 200,
}  # fmt: skip
HIGH_BAR = 0.95


def test_training_learns_the_structure_and_the_arms_agree(
    synthetic_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # bf16 labelled emulated on CPUs without native bf16: learning is checked here, not speed.
    small_cnn_of_width(monkeypatch, 48)
    arms = {}
    for precision in ("fp32", "bf16"):
        results, _ = train(
            TrainConfig(dataset_dir=synthetic_dataset, precision=precision, **LEARNING_RUN)
        )
        assert results.accuracy >= HIGH_BAR, (precision, results.epochs)
        losses = [epoch.train_loss for epoch in results.epochs]
        assert all(a > b for a, b in itertools.pairwise(losses)), (precision, losses)
        arms[precision] = results
    fp32, bf16 = arms["fp32"], arms["bf16"]
    # The same seed, data order, crops and initial weights: the arms differ only by bf16's
    # rounding (8 significant bits), which SGD amplifies as it goes, so two arms part about as
    # far as two seeds do. Their epochs' mean losses were up to 0.16 apart (64 wide, four runs)
    # and 0.08 (48 wide, seeds 0-5), first epochs of 1.1-1.7, falling towards 0: 0.3 allows for
    # that and still fails an arm that learns nothing (2.3) or diverges; 5 points bound the
    # accuracy (apart by at most 0.005 at 48 wide).
    for pair in zip(fp32.epochs, bf16.epochs, strict=True):
        assert abs(pair[0].train_loss - pair[1].train_loss) <= 0.3, pair
    assert abs(fp32.accuracy - bf16.accuracy) <= 0.05


def test_default_model_is_the_cifar_resnet18_and_learns(synthetic_dataset: Path) -> None:
    trainer = Trainer(
        TrainConfig(
            dataset_dir=synthetic_dataset, precision="fp32", batch_size=16, subset=96,
            lr=0.02, device="cpu", deterministic=True, warmup_steps=0, eval_batch_size=96,
        )
    )  # fmt: skip
    assert trainer.config.model == "resnet18"
    stem = trainer.model.conv1  # type: ignore[union-attr]
    assert (stem.kernel_size, stem.stride) == ((3, 3), (1, 1))
    results = trainer.run()
    # 12 steps are what a CPU test affords ResNet-18 (the high bar is small-cnn's, above): it
    # reached 0.38-0.62 at seeds 0-2 and 0.08 with shifted labels. Colour says nothing about
    # the class, so 2.5 times chance is the stripes learned.
    assert results.accuracy > 2.5 * CHANCE
    assert results.epochs[-1].train_loss < results.epochs[0].train_loss


def test_batches_are_normalised_by_the_train_split_statistics(synthetic_dataset: Path) -> None:
    """A trainer with BatchNorm learns about as well on unnormalised inputs, so accuracy cannot
    show a missing normalisation: each path's batches are compared with the formula instead,
    and the training split's, with the statistics prepare measured on it, have mean 0, std 1."""
    trainer = Trainer(
        TrainConfig(
            dataset_dir=synthetic_dataset, precision="fp32", model="small-cnn", device="cpu"
        )
    )
    mean = torch.tensor(trainer.metadata["mean"]).view(1, -1, 1, 1)
    std = torch.tensor(trainer.metadata["std"]).view(1, -1, 1, 1)

    def expected(images: torch.Tensor) -> torch.Tensor:
        return (images.float() / 255 - mean) / std

    train_split = trainer.train_data
    rows = torch.arange(len(train_split))
    # Offsets of CROP_PADDING crop each image back out of its padding: the image itself.
    offsets = torch.full((2, len(rows)), CROP_PADDING)
    images, labels = train_split.train_batch(
        rows, offsets, torch.zeros(len(rows), dtype=torch.bool)
    )
    assert torch.equal(labels, train_split.labels)
    torch.testing.assert_close(images, expected(train_split.images))
    assert images.mean(dim=(0, 2, 3)).tolist() == pytest.approx([0.0] * 3, abs=1e-4)
    assert images.std(dim=(0, 2, 3), correction=0).tolist() == pytest.approx([1.0] * 3, rel=1e-4)
    test_split = trainer.eval_data["test"]
    (images, labels), *_ = test_split.eval_batches(len(test_split))
    assert torch.equal(labels, test_split.labels)
    torch.testing.assert_close(images, expected(test_split.images))


@pytest.mark.usefixtures("tiny_model")
def test_results_record_what_ran(synthetic_dataset: Path, tmp_path: Path) -> None:
    results = run_training(
        TrainConfig(
            dataset_dir=synthetic_dataset,
            precision="amp",
            model="small-cnn",
            epochs=2,
            batch_size=50,
            subset=200,
            device="cpu",
            allow_emulated=True,
        ),
        tmp_path / "results.json",
        tmp_path / "model.pt",
    )
    assert read_arm_results(tmp_path / "results.json") == results
    assert results.precision.requested == "amp"
    assert results.precision.resolved == "bf16"
    assert results.precision.autocast_dtype == "bfloat16"
    assert results.precision.grad_scaler is False
    assert results.device.type == "cpu" and results.device.name
    # The capability names this CPU's bf16 features, and says yes to one exactly where amp
    # resolved to native bf16.
    assert results.device.capability == cpu_capability()
    native_bf16 = "BF16 yes" in results.device.capability  # AVX512_BF16, AMX-BF16 or Arm's
    assert results.precision.emulated == (not native_bf16)
    assert results.dataset.train_images == 200 and results.dataset.image_shape == [32, 32, 3]
    assert len(results.epochs) == 2
    timing = results.timing
    assert timing.train_time_s == pytest.approx(sum(e.time_s for e in results.epochs))
    assert timing.throughput_img_s == pytest.approx(400 / timing.train_time_s)
    assert timing.end_to_end_s == pytest.approx(
        timing.warmup_s + timing.train_time_s + timing.eval_s + timing.checkpoint_s
    )
    assert timing.warmup_steps == 3 and timing.warmup_s > 0
    memory = results.memory
    assert memory.kind == "cpu_rss" and memory.train_peak_reserved_mb is None
    # In a process that held more before (this one), the resident set need not grow: the
    # figures are checked against known allocations in test_train_engine.py.
    assert memory.total_peak_mb >= memory.train_peak_mb >= 0
    assert results.versions.torch == torch.__version__
    assert results.requested_resources is None  # not in a Kubernetes pod
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    assert any(key.endswith("weight") for key in state)


def test_augmentation_keeps_shapes_and_is_seed_reproducible() -> None:
    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)

    def augmented(step: int) -> torch.Tensor:
        return crop_flip(images, *draw_crop_flip(len(images), step_generator(CPU, 1, 0, step)))

    first, again, other = augmented(5), augmented(5), augmented(6)
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
        Trainer(TrainConfig(dataset_dir=copy, precision="fp32", device="cpu"))


def test_invalid_settings_are_named(synthetic_dataset: Path) -> None:
    with pytest.raises(AmpbenchError, match="--epochs"):
        TrainConfig(dataset_dir=synthetic_dataset, epochs=0).validate()
    with pytest.raises(AmpbenchError, match="--compile with --warmup-steps 0"):
        TrainConfig(dataset_dir=synthetic_dataset, compile=True, warmup_steps=0).validate()
    for setting, value in [
        ("momentum", 0.0), ("momentum", float("nan")), ("weight_decay", -1e-4),
        ("initial_loss_scale", 0.0),
    ]:  # fmt: skip
        option = "--" + setting.replace("_", "-")
        with pytest.raises(AmpbenchError, match=f"^{option}: must be"):
            TrainConfig(dataset_dir=synthetic_dataset, **{setting: value}).validate()
    fp32 = {"precision": "fp32", "device": "cpu"}
    with pytest.raises(AmpbenchError, match="--batch-size 5000"):
        Trainer(TrainConfig(dataset_dir=synthetic_dataset, batch_size=5000, **fp32))
    with pytest.raises(AmpbenchError, match="not a prepared dataset"):
        Trainer(TrainConfig(dataset_dir=synthetic_dataset.parent, **fp32))


@pytest.mark.parametrize(
    ("settings", "pattern"),
    [
        ({"batch_size": 41}, "--batch-size 41: larger than the 40 training images"),
        ({"batch_size": 11, "subset": 10}, "--batch-size 11: larger than the 10 training"),
        (
            {"batch_size": 14, "processes": 3},
            r"--batch-size 14 x 3 processes \(a global batch of 42\): larger than the 40 ",
        ),
        ({"model": "small-cnn"}, "--model small-cnn: cannot take 3x6x6 images"),
        ({"model": "vgg"}, "--model: 'vgg' is not one of"),
    ],
)
def test_settings_the_prepared_data_rules_out(settings: dict, pattern: str) -> None:
    from ampbench.train.config import check_against_dataset

    metadata = {
        "counts": {"train": 40, "test": 8},
        "image_shape": [6, 6, 3],
        "classes": list("abc"),
    }
    with pytest.raises(AmpbenchError, match=pattern):
        check_against_dataset(metadata, **settings)
    check_against_dataset(metadata, batch_size=40, model="resnet18")  # what fits passes
    check_against_dataset(metadata, batch_size=10, processes=4)


@pytest.mark.parametrize(
    ("images", "batch"), [(50_000, 128), (2048, 128), (1000, 32), (512, 32), (90, 8), (5, 5)]
)
def test_an_automatic_batch_gives_the_data_its_steps(images: int, batch: int) -> None:
    """`ampbench run --subset 512` without --batch-size: 16 steps of 32, not 4 of 128 (a first
    try that learned nothing); the full experiment keeps 128."""
    assert automatic_batch_size(images) == batch
    assert batch <= 8 or images // batch >= MIN_STEPS_PER_EPOCH
    assert batch <= images  # never a batch the data cannot fill, named as if it were asked for


def test_a_batch_is_fitted_to_the_data_only_where_none_was_given(
    synthetic_dataset: Path,
) -> None:
    """The training split decides an automatic batch (whatever --subset or the processes leave
    of it); a batch that was given stays, even one too large (preflight names it)."""
    counts = read_metadata(synthetic_dataset)["counts"]
    automatic = TrainConfig(synthetic_dataset, batch_size=0)
    assert with_batch_for_data(automatic, 1).batch_size == automatic_batch_size(counts["train"])
    subset = dataclasses.replace(automatic, subset=100)
    assert with_batch_for_data(subset, 1).batch_size == automatic_batch_size(100)
    assert with_batch_for_data(automatic, 4).batch_size == automatic_batch_size(
        counts["train"] // 4
    )
    given = TrainConfig(synthetic_dataset, batch_size=4096)
    assert with_batch_for_data(given, 1) is given


def test_the_learning_rate_warms_up_then_decays_to_zero(synthetic_dataset: Path) -> None:
    schedule = OneCycle(total_steps=100, warmup_fraction=0.25)
    factors = [schedule(step) for step in range(100)]
    assert factors[0] == pytest.approx(1 / 25) and factors[24] == factors[25] == max(factors) == 1
    assert all(a < b for a, b in itertools.pairwise(factors[:25]))  # rising
    assert all(a > b for a, b in itertools.pairwise(factors[25:]))  # falling
    assert factors[-1] == pytest.approx(1 / 75) and schedule(100) == 0
    # Each step trains at that schedule's rate, as the optimizer reads it when it steps.
    trainer = Trainer(
        TrainConfig(
            dataset_dir=synthetic_dataset, precision="fp32", model="small-cnn", epochs=2,
            batch_size=20, subset=100, lr=0.05, device="cpu", warmup_steps=0,
            profile_steps=0,  # the profile's steps (undone) would be seen here too
        )
    )  # fmt: skip
    seen: list[float] = []
    step = trainer.train_step

    def recording_step(model: torch.nn.Module, inputs: StepInputs) -> None:
        seen.append(float(trainer.optimizer.param_groups[0]["lr"]))
        step(model, inputs)

    trainer.train_step = recording_step  # type: ignore[method-assign]
    results = trainer.run()
    expected = [0.05 * trainer.schedule(s) for s in range(2 * trainer.steps_per_epoch)]
    assert seen == pytest.approx(expected, rel=1e-6)  # float32 on the device
    assert [epoch.lr for epoch in results.epochs] == pytest.approx(
        [expected[trainer.steps_per_epoch - 1], expected[-1]], rel=1e-6
    )
