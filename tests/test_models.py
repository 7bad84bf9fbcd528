"""The networks a run can train - vit-s, torchvision's by name, the user's own as
package.module:factory - and the check that refuses, in one line and before any training, a
model that cannot run on the data."""

from __future__ import annotations

import importlib
import math
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from ampbench.cli import main
from ampbench.dataset_format import SplitTensors
from ampbench.errors import AmpbenchError
from ampbench.results import read_arm_results
from ampbench.train import MODELS, data
from ampbench.train.config import (
    TrainConfig,
    check_against_dataset,
    check_pipeline_settings,
)
from ampbench.train.data import (
    IGNORE_LABEL,
    DeviceSplit,
    draw_crop_flip,
    step_generator,
)
from ampbench.train.loop import train
from ampbench.train.models import (
    BUILT_IN,
    SmallViT,
    build_model,
    check_model,
    parameter_count,
)

CPU = torch.device("cpu")


def train_argv(dataset: Path, output: Path, *options: str) -> list[str]:
    """`ampbench train` at its smallest: 20 images (2 per class), batches of 10, one epoch."""
    argv = ["train", "--dataset", str(dataset), "--precision", "fp32", "--device", "cpu"]
    argv += ["--epochs", "1", "--batch-size", "10", "--subset", "20", "--warmup-steps", "0"]
    return [*argv, "--no-tracking", "--output-dir", str(output), *options]


def error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one error line a refused command prints (log lines aside), with exit status 1."""
    assert main(argv) == 1
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if "error:" in line]
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


@pytest.fixture()
def user_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[str, str], None]]:
    """write(name, source): a module the user wrote, importable through sys.path as a user's
    PYTHONPATH would make it; forgotten again after the test."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []

    def write(name: str, source: str) -> None:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        importlib.invalidate_caches()
        written.append(name)

    yield write
    for name in written:
        sys.modules.pop(name, None)


# -- vit-s ----------------------------------------------------------------------------------------
def test_vit_s_is_linear_layers_sized_for_float8(monkeypatch: pytest.MonkeyPatch) -> None:
    model = build_model("vit-s", 10, (3, 32, 32))
    linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert len(linears) == 1 + 6 * 4 + 1  # patch embedding, 4 per block, head
    for name, layer in linears.items():
        if name == "head":  # its outputs are the classes
            assert (layer.in_features, layer.out_features) == (384, 10)
            continue
        assert layer.in_features % 16 == 0 and layer.out_features % 16 == 0, name
    assert not any(isinstance(m, nn.Conv2d) for m in model.modules())
    # The position embedding is sized from the image shape: one per 4x4 patch.
    assert model.position.shape == (1, 64, 384)
    assert build_model("vit-s", 10, (3, 64, 48)).position.shape == (1, 16 * 12, 384)
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counted(*args: torch.Tensor) -> torch.Tensor:
        calls.append(args[0].shape)
        return sdpa(*args)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert calls == [(2, 6, 64, 64)] * 6  # per block: batch, heads, tokens, head size


def test_vit_s_trains_a_few_steps_on_the_cpu(synthetic_dataset: Path) -> None:
    # At --image-size 16 (16 tokens, a quarter of the work at 32x32): its position embedding
    # is sized from the resized images.
    config = TrainConfig(
        dataset_dir=synthetic_dataset, precision="fp32", model="vit-s", epochs=1,
        batch_size=10, subset=20, device="cpu", warmup_steps=0, lr=0.02, image_size=16,
    )  # fmt: skip
    results, model = train(config)
    assert results.model == "vit-s" and results.parameters == parameter_count(model)
    assert results.timing.trained_images == 20 and results.hyperparameters["image_size"] == 16
    assert math.isfinite(results.epochs[0].train_loss) and math.isfinite(results.test_loss)
    assert isinstance(model, SmallViT) and model.position.shape == (1, 16, 384)


# -- --image-size ---------------------------------------------------------------------------------
def test_batches_are_resized_after_crop_and_flip_before_normalisation() -> None:
    images = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    split = SplitTensors(images, torch.arange(4), torch.arange(4))
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
    plain = DeviceSplit(split, CPU, mean, std)
    resized = DeviceSplit(split, CPU, mean, std, image_size=20)
    assert (plain.image_shape, resized.image_shape) == ((3, 8, 8), (3, 20, 20))
    rows = torch.tensor([2, 0, 3])
    offsets, flip = draw_crop_flip(len(rows), step_generator(CPU, 1, 0, 0))
    batch, labels = resized.train_batch(rows, offsets, flip)
    unresized, _ = plain.train_batch(rows, offsets, flip)  # the same crops
    assert batch.shape == (3, 3, 20, 20) and labels.tolist() == [2, 0, 3]
    assert batch.is_contiguous(memory_format=torch.channels_last)
    # Bilinear weights sum to 1, so resizing commutes with the per-channel normalisation: the
    # batch is the cropped, flipped one enlarged (it would not be if cropped after resizing).
    expected = torch.nn.functional.interpolate(
        unresized, size=(20, 20), mode="bilinear", align_corners=False, antialias=False
    )
    torch.testing.assert_close(batch, expected)
    ((evaluated, labels),) = resized.eval_batches(8)  # padded to the batch: 4 blank images
    assert evaluated.shape == (8, 3, 20, 20)
    assert labels.tolist() == [0, 1, 2, 3, *[IGNORE_LABEL] * 4]


def test_a_torchvision_model_by_name_trains_at_image_size(
    synthetic_dataset: Path, tmp_path: Path
) -> None:
    options = ("--model", "squeezenet1_1", "--image-size", "48", "--lr", "0.01")
    assert main(train_argv(synthetic_dataset, tmp_path / "o", *options)) == 0
    results = read_arm_results(tmp_path / "o" / "results.json")
    assert results.model == "squeezenet1_1"
    assert results.hyperparameters["image_size"] == 48
    assert results.parameters == parameter_count(build_model("squeezenet1_1", 10))
    assert math.isfinite(results.test_loss)


# -- package.module:factory -----------------------------------------------------------------------
USER_MODEL = """
    import torch
    from torch import nn

    built = []

    class Net(nn.Module):
        def __init__(self, num_classes, image_shape):
            super().__init__()
            self.image_shape = image_shape
            channels, height, width = image_shape
            self.linear = nn.Linear(channels * height * width, num_classes)

        def forward(self, images):
            if tuple(images.shape[1:]) != self.image_shape:
                raise ValueError(f"got {tuple(images.shape)}")
            return self.linear(images.flatten(1))

    def build(num_classes, image_shape):
        built.append((num_classes, image_shape))
        return Net(num_classes, image_shape)
"""


def test_a_user_model_trains_through_ampbench_train(
    synthetic_dataset: Path, tmp_path: Path, user_module: Callable[[str, str], None]
) -> None:
    user_module("my_models", USER_MODEL)
    options = ("--model", "my_models:build", "--image-size", "16")
    assert main(train_argv(synthetic_dataset, tmp_path / "o", *options)) == 0
    results = read_arm_results(tmp_path / "o" / "results.json")
    assert results.model == "my_models:build"
    assert results.parameters == 3 * 16 * 16 * 10 + 10
    built = sys.modules["my_models"].built
    assert built and set(built) == {(10, (3, 16, 16))}  # num_classes, (channels, height, width)


@pytest.mark.parametrize(
    ("source", "model", "message"),
    [
        ("def build(:\n", "broken_syntax:build", "importing broken_syntax: SyntaxError: "),
        (
            "import no_such_thing_here\n",
            "broken_import:build",
            "importing broken_import: ModuleNotFoundError: No module named 'no_such_thing_here'",
        ),
        ("x = 1\n", "broken_name:build", "module broken_name has no attribute 'build'"),
        ("build = 3\n", "broken_call:build", "broken_call.build is a int, not callable"),
        (
            "def build(n, shape):\n    raise ValueError('no such size\\nsecond line')\n",
            "broken_raises:build",
            "the factory failed for 3x32x32 images (channels x height x width): ValueError: "
            "no such size",
        ),
        (
            "def build(n, shape):\n    return 'a model'\n",
            "broken_type:build",
            "the factory returned str, not a torch.nn.Module",
        ),
        ("", "nowhere_to_be_found:build", "no module named 'nowhere_to_be_found' (install it"),
    ],
)
def test_a_broken_factory_is_one_line(
    source: str,
    model: str,
    message: str,
    synthetic_dataset: Path,
    tmp_path: Path,
    user_module: Callable[[str, str], None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    if source:
        user_module(model.partition(":")[0], source)
    line = error_line(capsys, train_argv(synthetic_dataset, tmp_path / "o", "--model", model))
    assert line.startswith("ampbench: error: ") and f"--model {model}: " in line
    assert message in line and "second line" not in line
    assert not (tmp_path / "o").exists()


# -- models that cannot run on the data -----------------------------------------------------------
def test_a_model_that_cannot_run_on_the_data_is_refused_before_any_data_is_read(
    synthetic_dataset: Path,
    tmp_path: Path,
    user_module: Callable[[str, str], None],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_reading(*args: object) -> None:
        raise AssertionError("the data was read before the model was checked")

    monkeypatch.setattr(data, "read_split", no_reading)
    user_module(
        "five_classes",
        """
        from torch import nn

        def build(num_classes, image_shape):
            return nn.Sequential(nn.Flatten(), nn.LazyLinear(5))
        """,
    )
    for options, message in (
        (
            ("--model", "five_classes:build"),
            "--model five_classes:build: maps a batch of 2 3x32x32 images (channels x height x "
            "width) to torch.float32 of shape (2, 5), not logits of shape (2, 10) for 10 classes",
        ),
        (
            ("--model", "small-cnn", "--image-size", "6"),
            "--model small-cnn: cannot take 3x6x6 images (channels x height x width): ",
        ),
        (
            ("--model", "vit-s", "--image-size", "30"),
            "--model vit-s: building it failed for 3x30x30 images (channels x height x width): "
            "ValueError: height and width must be multiples of the patch size 4, not 30x30",
        ),
    ):
        line = error_line(capsys, train_argv(synthetic_dataset, tmp_path / "o", *options))
        assert f"ampbench: error: {synthetic_dataset}: {message}" in line, line
        assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", MODELS)
def test_every_built_in_name_the_command_line_knows_builds_its_own_model(name: str) -> None:
    """train.MODELS (torch-free, for the command line) and the builders name the same models,
    and each builds for CIFAR's images with the classes asked for."""
    assert tuple(BUILT_IN) == MODELS
    with torch.device("meta"):
        logits = build_model(name, 7, (3, 32, 32))(torch.empty(2, 3, 32, 32))
    assert logits.shape == (2, 7)


def test_the_check_uses_the_resized_shape_classes_and_channels() -> None:
    metadata = {"counts": {"train": 40, "test": 8}, "image_shape": [6, 6, 3]}
    metadata["classes"] = [f"c{i}" for i in range(7)]
    with pytest.raises(AmpbenchError, match=r"--model small-cnn: cannot take 3x6x6 images"):
        check_against_dataset(metadata, model="small-cnn")
    check_against_dataset(metadata, model="small-cnn", image_size=8)  # small-cnn halves 3 times
    with pytest.raises(AmpbenchError, match=r"--model small-cnn: cannot take 3x4x4 images"):
        check_against_dataset(
            {**metadata, "image_shape": [32, 32, 3]}, model="small-cnn", image_size=4
        )
    with pytest.raises(AmpbenchError, match=r"cannot take 1x32x32 images .*to have 3 channels"):
        check_model("resnet18", 7, (1, 32, 32))
    with pytest.raises(AmpbenchError, match=r"vit_b_32: building it failed for 3x40x40 images"):
        check_model("vit_b_32", 7, (3, 40, 40))  # patches of 32 do not tile 40x40
    check_model("vit_b_32", 7, (3, 64, 64))  # sized for the images: no need for 224x224


def test_the_check_leaves_the_random_streams_alone_and_falls_back_to_the_cpu(
    user_module: Callable[[str, str], None],
) -> None:
    # A RegNet computes its widths with tensors (.tolist()) as it is built, which the meta
    # device cannot; this model's forward reads a value (.item()). Both are checked on the CPU.
    user_module(
        "reads_values",
        """
        from torch import nn

        class Net(nn.Module):
            def __init__(self, num_classes):
                super().__init__()
                self.linear = nn.Linear(3 * 8 * 8, num_classes)

            def forward(self, images):
                scale = 1.0 if images.abs().sum().item() >= 0 else 2.0
                return self.linear(images.flatten(1)) * scale

        def build(num_classes, image_shape):
            return Net(num_classes)
        """,
    )
    before = torch.get_rng_state()
    check_model("regnet_x_400mf", 10, (3, 32, 32))
    check_model("reads_values:build", 10, (3, 8, 8))
    assert torch.equal(torch.get_rng_state(), before)


# -- names ----------------------------------------------------------------------------------------
def test_unknown_names_are_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(
            [
                "train",
                "--dataset",
                ".",
                "--precision",
                "fp32",
                "--output-dir",
                "o",
                "--model",
                "resnet-18",
            ]
        )
    assert exited.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert errors == [
        "ampbench train: error: --model: 'resnet-18' is not one of the "
        "built-in models (resnet18, resnet18-imagenet, small-cnn, vit-s), torchvision's "
        "classification models by name (e.g. mobilenet_v3_small, vit_b_16) or the form "
        "package.module:factory; did you mean resnet18?; see ampbench train --help"
    ]
    settings = {"epochs": 1, "batch_size": 8, "lr": 0.1}
    with pytest.raises(AmpbenchError, match=r"^--model: 'vgg' is not one of .*did you mean vgg"):
        check_pipeline_settings(**settings, model="vgg")
    for malformed in ("pkg.mod:", ":build", "pkg-x:build", "a:b:c"):
        with pytest.raises(AmpbenchError, match=r"is not of the form package\.module:factory"):
            check_pipeline_settings(**settings, model=malformed)
    with pytest.raises(AmpbenchError, match=r"^--image-size: must be 0 \(as prepared\) or"):
        check_pipeline_settings(**settings, model="vit-s", image_size=-1)


def test_built_in_and_factory_names_are_checked_without_torch() -> None:
    """`ampbench submit` checks the settings on a machine that may never import the user's
    module (it lives in the training image) and need not wait for torch."""
    code = (
        "import sys\n"
        "from ampbench.train.config import check_pipeline_settings\n"
        "for model in ('vit-s', 'small-cnn', 'company.models.vision:build_net'):\n"
        "    check_pipeline_settings(epochs=1, batch_size=8, lr=0.1, model=model, image_size=64)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
