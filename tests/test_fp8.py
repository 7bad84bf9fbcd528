"""The fp8 arms: float8 training of the Linear layers (torchao, emulated on this CPU), which
models it converts or refuses, and where the precisions resolve."""

from __future__ import annotations

import subprocess
import sys
from contextlib import nullcontext

import pytest
import torch
from torch import nn

from ampbench.errors import AmpbenchError
from ampbench.train import fp8 as fp8_module
from ampbench.train.flops import train_step_flops
from ampbench.train.fp8 import convert_for_fp8
from ampbench.train.models import build_model
from ampbench.train.precision import resolve

CPU = torch.device("cpu")
D = 2064  # a multiple of 16 above both recipes' size thresholds (rowwise: N > 2048, K > 2048)


def linear_model() -> nn.Sequential:
    """Three Linear layers of dims multiples of 16 and a head of 10 classes (not one).
    tensorwise's auto-filter takes a layer with N > 1024 (or K > 4096): 0, 2 and 4; rowwise's
    wants N > 2048, K > 1024 and N > 4096 or K > 2048: only 4."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, 1040),
        nn.ReLU(),
        nn.Linear(1040, D),
        nn.ReLU(),
        nn.Linear(D, D),
        nn.ReLU(),
        nn.Linear(D, 10),
    )


def float8_layers(model: nn.Module) -> list[str]:
    return [
        name for name, module in model.named_modules() if type(module).__name__ == "Float8Linear"
    ]


@pytest.mark.parametrize(
    ("recipe", "converted", "scales"),
    [("tensorwise", ["0", "2", "4"], "tensorwise"), ("rowwise", ["4"], "axiswise")],
)
def test_each_recipe_converts_the_layers_its_auto_filter_picks(
    recipe: str, converted: list[str], scales: str
) -> None:
    model = linear_model()
    parameters = dict(model.named_parameters())
    assert convert_for_fp8(model, recipe, emulate=True) == len(converted)
    assert float8_layers(model) == converted
    # The same parameter tensors under the same names: an optimizer, a checkpoint and the
    # warm-up's undo see the model they saw before.
    assert dict(model.named_parameters()).keys() == parameters.keys()
    assert all(p is parameters[name] for name, p in model.named_parameters())
    for name in converted:  # torchao's own recipe, emulated as asked
        config = model.get_submodule(name).config
        granularity = config.cast_config_input.scaling_granularity.value
        assert (granularity, config.emulate) == (scales, True)


def test_without_the_auto_filter_every_layer_of_dims_multiple_of_16_converts() -> None:
    model = linear_model()
    assert convert_for_fp8(model, "rowwise", emulate=False, auto_filter=False) == 3
    assert float8_layers(model) == ["0", "2", "4"]  # not the 2064 -> 10 head
    assert not model.get_submodule("0").config.emulate  # the FP8 kernels, as on a GPU


def sqnr_db(reference: torch.Tensor, value: torch.Tensor) -> float:
    """Signal to quantisation noise, in dB (torchao's measure of float8 numerics)."""
    reference, value = reference.detach().float(), value.detach().float()
    return float(20 * torch.log10(reference.norm() / (reference - value).norm()))


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_numerics_are_close_to_fp32_but_really_float8(recipe: str) -> None:
    torch.manual_seed(1)
    reference = nn.Sequential(nn.Linear(D, D), nn.ReLU(), nn.Linear(D, D))
    model = nn.Sequential(nn.Linear(D, D), nn.ReLU(), nn.Linear(D, D))
    model.load_state_dict(reference.state_dict())
    assert convert_for_fp8(model, recipe, emulate=True) == 2
    images = torch.randn(32, D)
    upstream = torch.randn(32, D)  # the gradient from the layers above
    inputs = [images.clone().requires_grad_(), images.clone().requires_grad_()]
    expected, got = reference(inputs[0]), model(inputs[1])
    expected.backward(upstream)
    got.backward(upstream)
    # float8 keeps 3 (e4m3) or 2 (e5m2) mantissa bits: a few per cent of error per element,
    # 25-26 dB for the output here. Gradients pass two float8 matmuls and lose more: 15-16 dB
    # for the input's and the first layer's, 23-26 dB for the second layer's weight (measured
    # over seeds); a wrong scale would be near 0 dB, fp32 left in place far above 60.
    assert 20 < sqnr_db(expected, got) < 60
    assert 12 < sqnr_db(inputs[0].grad, inputs[1].grad) < 60
    for (name, ref), (_, param) in zip(
        reference.named_parameters(), model.named_parameters(), strict=True
    ):
        if name != "2.bias":  # the bias's gradient is the upstream one summed: no matmul
            assert 12 < sqnr_db(ref.grad, param.grad) < 60, name


def test_the_step_counts_each_float8_matmul_once() -> None:
    """FlopCounterMode sees each float8 matmul once (the emulated one as an fp32 mm, a GPU's
    as _scaled_mm), so the arm counts the model's FLOPs, plus one matmul: torchao's Float8Linear
    computes its input's gradient even where nothing needs it (here the first layer's, whose
    input is the images), and FlopCounterMode counts what runs."""
    model = linear_model()
    batch = 16
    images, labels = torch.randn(batch, 64), torch.randint(0, 10, (batch,))
    loss = nn.CrossEntropyLoss()
    plain = train_step_flops(model, images, labels, loss, nullcontext())
    convert_for_fp8(model, "tensorwise", emulate=True)
    precision = resolve("fp8", CPU, allow_emulated=True)
    unneeded_input_grad = 2 * batch * 64 * 1040
    counted = train_step_flops(model, images, labels, loss, precision.autocast())
    assert counted == plain + unneeded_input_grad


def test_a_model_whose_only_linear_is_its_small_head_is_refused() -> None:
    model = build_model("resnet18", 10)
    with pytest.raises(AmpbenchError) as refused:
        convert_for_fp8(model, "tensorwise", emulate=True, model_name="resnet18")
    message = str(refused.value)
    assert message.startswith(
        "--precision fp8: model resnet18 has no Linear layer float8 training can convert"
    )
    assert "'fc' 512->10 (dims not multiples of 16)" in message and "\n" not in message
    assert isinstance(model.fc, nn.Linear) and not float8_layers(model)  # left as it was
    with pytest.raises(AmpbenchError, match=r"^--precision fp8-rowwise: model ResNet has no"):
        convert_for_fp8(model, "rowwise", emulate=True)


def test_a_model_without_linear_layers_is_refused() -> None:
    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    with pytest.raises(AmpbenchError, match=r"model convnet has no nn\.Linear layer, the only"):
        convert_for_fp8(model, "tensorwise", emulate=False, model_name="convnet")


def test_a_linear_too_small_to_pay_is_named_with_its_reason() -> None:
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 16))
    with pytest.raises(AmpbenchError, match=r"skips '0' 64->256 \(too small for float8 to pay\)"):
        convert_for_fp8(model, "tensorwise", emulate=True, model_name="mlp")


# -- resolution ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("requested", "recipe"), [("fp8", "tensorwise"), ("fp8-rowwise", "rowwise")]
)
def test_fp8_on_a_cpu_is_refused_unless_emulation_is_asked_for(requested: str, recipe: str) -> None:
    with pytest.raises(AmpbenchError) as refused:
        resolve(requested, CPU)
    message = str(refused.value)
    assert message.startswith(f"--precision {requested}: ") and "has no FP8 matmul" in message
    assert "--allow-emulated" in message and "\n" not in message
    emulated = resolve(requested, CPU, allow_emulated=True)
    assert (emulated.name, emulated.emulated, emulated.fp8_recipe) == (requested, True, recipe)
    assert emulated.label == f"{requested} (EMULATED)"
    assert emulated.autocast_dtype == torch.bfloat16 and not emulated.grad_scaler
    record = emulated.record()
    assert (record.resolved, record.autocast_dtype, record.tf32) == (requested, "bfloat16", False)
    assert record.emulated and record.support.startswith("EMULATED: ")
    assert f"torchao 0.18.0 float8 {recipe}" in record.support


def fake_gpu(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int]) -> torch.device:
    """resolve() sees a GPU of this compute capability (it asks nothing else of the device)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: f"GPU sm{capability}")
    return torch.device("cuda")


@pytest.mark.parametrize("requested", ["fp8", "fp8-rowwise"])
@pytest.mark.parametrize("capability", [(7, 5), (8, 0), (8, 6)])
def test_fp8_is_refused_below_compute_capability_8_9(
    requested: str, capability: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu = fake_gpu(monkeypatch, capability)
    major, minor = capability
    with pytest.raises(AmpbenchError) as refused:
        resolve(requested, gpu)
    assert str(refused.value).startswith(
        f"--precision {requested}: GPU sm{capability} (compute capability {major}.{minor}) "
        "has no FP8 tensor cores (needs 8.9 or newer)"
    )
    emulated = resolve(requested, gpu, allow_emulated=True)
    assert emulated.emulated and emulated.label == f"{requested} (EMULATED)"
    assert emulated.support.endswith("bf16 autocast, fp32 matmuls")  # convert with emulate


@pytest.mark.parametrize("requested", ["fp8", "fp8-rowwise"])
@pytest.mark.parametrize("capability", [(8, 9), (9, 0), (10, 0)])
def test_fp8_is_native_from_compute_capability_8_9(
    requested: str, capability: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    precision = resolve(requested, fake_gpu(monkeypatch, capability))
    major, minor = capability
    assert (precision.name, precision.emulated, precision.label) == (requested, False, requested)
    assert precision.autocast_dtype == torch.bfloat16 and not precision.grad_scaler
    assert precision.support.startswith(
        f"native: GPU sm{capability}, compute capability {major}.{minor} (torchao 0.18.0 float8"
    )


def test_without_torchao_fp8_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fp8_module, "torchao_version", lambda: None)
    for call in (
        lambda: resolve("fp8", CPU, allow_emulated=True),
        lambda: convert_for_fp8(linear_model(), "tensorwise", emulate=True),
    ):
        with pytest.raises(AmpbenchError, match=r"^--precision fp8: float8 training needs torchao"):
            call()


def test_other_precisions_have_no_float8_recipe() -> None:
    assert resolve("fp32", CPU).fp8_recipe is None


def test_torchao_is_imported_only_when_a_model_is_converted() -> None:
    code = (
        "import sys, torch\n"
        "from ampbench.train.precision import resolve\n"
        "import ampbench.train.fp8\n"
        "resolve('fp8', torch.device('cpu'), allow_emulated=True)\n"
        "assert 'torchao' not in sys.modules, 'torchao imported early'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
