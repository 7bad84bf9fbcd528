"""FLOPs of a training step counted as hand-worked formulas say, and the peaks MFU divides by."""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext

import pytest
import torch
from torch import nn

from ampbench.train.flops import (
    GPU_PEAKS,
    Peaks,
    achieved_tflops,
    gpu_model,
    mfu,
    peak_tflops,
    train_step_flops,
)
from ampbench.train.precisions import ARMS

B = 8  # batch


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits, labels)


def step_flops(model: nn.Module, images: torch.Tensor, classes: int) -> int:
    labels = torch.randint(0, classes, (images.shape[0],))
    return train_step_flops(model, images, labels, cross_entropy, nullcontext())


def test_a_linear_layer_whose_input_needs_no_grad() -> None:
    # Forward: one (B x in) @ (in x out) matmul, B*in*out multiply-adds = 2*B*in*out FLOPs.
    # Backward: only the weight's gradient, grad_out^T @ input: as many again. The input
    # (the images) needs no gradient, so autograd computes no grad_out @ W for it.
    fan_in, fan_out = 32, 16
    flops = step_flops(nn.Linear(fan_in, fan_out, bias=False), torch.randn(B, fan_in), fan_out)
    assert flops == 2 * B * fan_in * fan_out + 2 * B * fan_in * fan_out


def test_a_two_layer_mlp_counts_the_input_gradient_of_the_second_layer_only() -> None:
    fan_in, hidden, classes = 24, 40, 10
    model = nn.Sequential(nn.Linear(fan_in, hidden), nn.ReLU(), nn.Linear(hidden, classes))
    first = 2 * B * fan_in * hidden  # one matmul's FLOPs (the bias add is not counted)
    second = 2 * B * hidden * classes
    # First layer: forward + weight gradient. Second: forward + weight gradient + the gradient
    # of its input (the hidden activations need one for the first layer's weights).
    expected = 2 * first + 3 * second
    assert step_flops(model, torch.randn(B, fan_in), classes) == expected


def test_a_convolution_by_the_hand_formula() -> None:
    c_in, c_out, k, size, stride = 3, 8, 3, 16, 2
    conv = nn.Conv2d(c_in, c_out, k, stride=stride, padding=1, bias=False)
    out = (size + 2 * 1 - k) // stride + 1  # 8
    # Each output element is c_in*k*k multiply-adds.
    forward = 2 * B * c_out * out * out * c_in * k * k
    model = nn.Sequential(conv, nn.Flatten())
    images = torch.randn(B, c_in, size, size)
    labels = torch.randint(0, c_out * out * out, (B,))
    flops = train_step_flops(model, images, labels, cross_entropy, nullcontext())
    assert forward == 221_184  # 2 * 8 * 8 * 8 * 8 * 3 * 3 * 3
    assert flops == 2 * forward  # forward + weight gradient (the images need no gradient)


def test_counting_leaves_weights_grads_and_buffers_as_they_were() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))
    model[0].weight.grad = torch.full_like(model[0].weight, 7.0)  # an earlier step's gradient
    before = {name: value.clone() for name, value in model.state_dict().items()}
    earlier_grad = model[0].weight.grad
    assert step_flops(model, torch.randn(B, 12), 4) > 0
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name  # weights and BatchNorm's statistics
    assert model[0].weight.grad is earlier_grad and bool((earlier_grad == 7).all())
    assert all(p.grad is None for name, p in model.named_parameters() if name != "0.weight")


def test_autocast_changes_no_count() -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10))
    images, labels = torch.randn(B, 16), torch.randint(0, 10, (B,))
    plain = train_step_flops(model, images, labels, cross_entropy, nullcontext())
    bf16 = train_step_flops(
        model, images, labels, cross_entropy, torch.autocast("cpu", dtype=torch.bfloat16)
    )
    assert plain == bf16 == 2 * (2 * B * 16 * 32) + 3 * (2 * B * 32 * 10)


class Attention(nn.Module):
    """Queries, keys and values given (they need gradients: the input of a later layer)."""

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        q, k, v = qkv.unbind(1)
        return nn.functional.scaled_dot_product_attention(q, k, v).flatten(1)


def test_attention_on_a_cpu_counts_as_its_matmuls() -> None:
    """scaled_dot_product_attention runs a CPU kernel of its own, which torch's counter does not
    know: counted by torch's formulas all the same. By hand: forward, scores Q K^T and
    output P V, 2 B H L^2 D FLOPs each; backward, as flash attention does it, the scores
    again, then the gradients of P, V, Q and K, five such products."""
    heads, length, dim = 2, 16, 8
    qkv = torch.randn(B, 3, heads, length, dim, requires_grad=True)
    model = nn.Sequential(Attention(), nn.Linear(heads * length * dim, 10, bias=False))
    linear = 3 * (2 * B * heads * length * dim * 10)  # forward, input and weight gradients
    product = 2 * B * heads * length * length * dim
    assert step_flops(model, qkv, 10) == 2 * product + 5 * product + linear


@pytest.mark.parametrize(
    ("device_name", "precision", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.5),  # 1,979 with sparsity, halved
        ("NVIDIA H100 80GB HBM3", "fp32", 67),
        ("NVIDIA H100 80GB HBM3", "tf32", 494.5),
        ("NVIDIA H100 80GB HBM3", "fp8", 1979),
        ("NVIDIA H100 80GB HBM3", "fp8-rowwise", 1979),
        ("NVIDIA H100 PCIe", "fp16", 756.5),
        ("NVIDIA H200", "fp8", 1979),
        ("NVIDIA H200", "bf16", 989.5),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156),
        ("NVIDIA A100-SXM4-40GB", "fp16", 312),
        ("NVIDIA A100-PCIE-40GB", "fp32", 19.5),
        ("NVIDIA A100 80GB PCIe", "bf16", 312),
        ("NVIDIA L4", "fp8", 242.5),
        ("NVIDIA L4", "bf16", 121),
        ("NVIDIA L40S", "bf16", 362.05),
        ("NVIDIA L40S", "fp8", 733),
        ("Tesla T4", "fp16", 65),
    ],
)
def test_peaks_of_known_gpus(device_name: str, precision: str, peak: float) -> None:
    assert peak_tflops("cuda", device_name, precision) == pytest.approx(peak)


def test_every_arm_has_its_peak() -> None:
    """Each arm divides by its own datasheet figure: both FP8 recipes by the FP8 one."""
    h100 = {
        "fp32": 67, "tf32": 494.5, "fp16": 989.5, "bf16": 989.5, "fp8": 1979,
        "fp8-rowwise": 1979,
    }  # fmt: skip
    assert set(h100) == set(ARMS)
    for precision, peak in h100.items():
        assert peak_tflops("cuda", "NVIDIA H100 80GB HBM3", precision) == peak, precision
    assert {arm.peak for arm in ARMS.values()} <= {f.name for f in dataclasses.fields(Peaks)}


@pytest.mark.parametrize(
    ("device_type", "device_name", "precision"),
    [
        ("cpu", "Intel(R) Xeon(R) Platinum 8480+", "bf16"),  # a CPU: never a peak
        ("cpu", "NVIDIA H100 80GB HBM3", "bf16"),
        ("cuda", "NVIDIA GeForce RTX 4090", "bf16"),  # not listed
        ("cuda", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "bf16"),  # a slice of the GPU
        ("cuda", "NVIDIA A10G", "bf16"),
        ("cuda", "NVIDIA A100-SXM4-80GB", "fp8"),  # no FP8 tensor cores on Ampere
        ("cuda", "Tesla T4", "bf16"),
        ("cuda", "NVIDIA H100 80GB HBM3", "amp"),  # not a resolved precision
    ],
)
def test_no_peak_where_none_is_known(device_type: str, device_name: str, precision: str) -> None:
    assert peak_tflops(device_type, device_name, precision) is None


def test_similar_names_are_told_apart() -> None:
    assert gpu_model("NVIDIA L4") == "L4"
    assert gpu_model("NVIDIA L40S") == "L40S"
    assert gpu_model("NVIDIA L40") == "L40"
    assert gpu_model("NVIDIA H200 NVL") == "H200 NVL"
    assert gpu_model("NVIDIA H100 NVL") == "H100 NVL"
    assert gpu_model("NVIDIA A10") == "A10"


def test_every_peak_is_dense_and_ordered() -> None:
    # Tensor-core rates never below the CUDA cores' FP32, and each format at most twice the
    # one above it: a figure left "with sparsity" would break the ratio somewhere.
    for model, peaks in GPU_PEAKS.items():
        if peaks.tf32 is not None:
            assert peaks.fp32 <= peaks.tf32, model
        if peaks.tf32 is not None and peaks.bf16 is not None:
            assert peaks.bf16 == pytest.approx(2 * peaks.tf32, rel=0.02), model
        if peaks.fp8 is not None and peaks.fp16 is not None:
            assert peaks.fp8 == pytest.approx(2 * peaks.fp16, rel=0.02), model


def test_achieved_tflops_and_mfu() -> None:
    achieved = achieved_tflops(flops_per_step=5 * 10**12, steps=100, seconds=2.0)
    assert achieved == pytest.approx(250.0)
    assert mfu(achieved, 1000.0) == pytest.approx(0.25)
    assert mfu(achieved, None) is None
