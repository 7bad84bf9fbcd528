"""Precision resolution in detail: what each arm records, how the CPU's features are read, and
the boundaries of CUDA compute capability (the fast tests `make mutation` runs)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from ampbench import schema
from ampbench.errors import AmpbenchError
from ampbench.train import AMP_PRECISION, BASELINE_PRECISION, PRECISIONS
from ampbench.train import fp8 as fp8_module
from ampbench.train import precision as precision_module
from ampbench.train.config import TrainConfig
from ampbench.train.fp8 import torchao_version
from ampbench.train.loop import Trainer
from ampbench.train.precision import (
    Precision,
    cpu_capability,
    cpu_name,
    cpu_native_features,
    math_mode,
    resolve,
)
from ampbench.train.precisions import ALIASES, ARMS, FP8_RECIPES, CpuRule

CPU = torch.device("cpu")
CPUINFO_X86 = [
    "processor\t: 0",
    "model name\t: AMD EPYC 9004",
    "flags\t\t: fpu avx2 avx512f avx512_bf16 avx512_fp16",
]


FakeGpu = Callable[[tuple[int, int]], torch.device]


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> FakeGpu:
    """Sets the compute capability resolve() sees; returns the CUDA device."""

    # The second GPU, so that a query of the current device (cuda:0) reads another one.
    device = torch.device("cuda", 1)

    def at(capability: tuple[int, int]) -> torch.device:
        def capability_of(queried: object = None) -> tuple[int, int]:
            return capability if queried == device else (6, 0)

        def name_of(queried: object = None) -> str:
            return "Test GPU" if queried == device else "another GPU"

        monkeypatch.setattr(torch.cuda, "get_device_capability", capability_of)
        monkeypatch.setattr(torch.cuda, "get_device_name", name_of)
        return device

    return at


@pytest.mark.parametrize(
    ("name", "autocast", "scaler", "tf32"),
    [
        ("fp32", None, False, False),
        ("tf32", None, False, True),
        ("fp16", "float16", True, False),
        ("bf16", "bfloat16", False, False),
        ("fp8", "bfloat16", False, False),
        ("fp8-rowwise", "bfloat16", False, False),
    ],
)
def test_each_arm_records_its_autocast_scaler_and_tf32(
    name: str, autocast: str | None, scaler: bool, tf32: bool
) -> None:
    precision = Precision("asked", name, "cuda", emulated=True, support="why")
    assert schema.dump(precision.record()) == {
        "requested": "asked", "resolved": name, "autocast_dtype": autocast,
        "grad_scaler": scaler, "tf32": tf32, "emulated": True, "support": "why",
    }  # fmt: skip
    assert precision.autocast_dtype == (autocast and getattr(torch, autocast))
    assert precision.fp8_recipe == {"fp8": "tensorwise", "fp8-rowwise": "rowwise"}.get(name)


@pytest.mark.parametrize(
    ("requested", "name", "emulated", "label"),
    [
        ("fp32", "fp32", False, "fp32"),
        ("bf16", "bf16", True, "bf16 (EMULATED)"),
        ("amp", "fp16", False, "amp (fp16)"),
        ("amp", "bf16", True, "amp (bf16, EMULATED)"),
    ],
)
def test_labels_name_what_ran(requested: str, name: str, emulated: bool, label: str) -> None:
    assert Precision(requested, name, "cpu", emulated).label == label


def test_autocast_is_off_for_full_precision_arms_and_follows_the_arm_otherwise() -> None:
    with Precision("fp32", "fp32", "cpu").autocast():
        assert not torch.is_autocast_enabled("cpu")
    with Precision("amp", "bf16", "cpu").autocast(cache_enabled=False):
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert not torch.is_autocast_cache_enabled()
    with Precision("amp", "bf16", "cpu").autocast():
        assert torch.is_autocast_cache_enabled()


def cpuinfo(lines: list[str]) -> Callable[[str], list[str]]:
    """_read_lines as it reads these lines from /proc/cpuinfo (and nothing from elsewhere)."""
    return lambda path: lines if path == "/proc/cpuinfo" else []


def test_the_cpus_name_and_flags_come_from_cpuinfo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision_module, "_read_lines", cpuinfo(CPUINFO_X86))
    monkeypatch.setattr(precision_module.platform, "machine", lambda: "x86_64")
    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported", "_is_amx_fp16_supported"):
        monkeypatch.delattr(torch.cpu, probe, raising=False)
    assert cpu_name() == "AMD EPYC 9004"
    assert cpu_native_features() == {
        "AVX512_BF16": True, "AMX-BF16": False, "AVX512_FP16": True, "AMX-FP16": False
    }  # fmt: skip
    assert cpu_capability() == "AVX512_BF16 yes, AMX-BF16 no, AVX512_FP16 yes, AMX-FP16 no"
    assert resolve("amp", CPU).support == "native: AVX512_BF16 on AMD EPYC 9004"
    assert resolve("fp16", CPU).support == "native: AVX512_FP16 on AMD EPYC 9004"
    # torch's own probe, where this torch has it, wins over the kernel's flags.
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert resolve("bf16", CPU).support == "native: AMX-BF16 on AMD EPYC 9004"


@pytest.mark.parametrize("machine", ["aarch64", "arm64"])
def test_an_arm_cpu_reads_its_features_flags(machine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = ["model name\t: Neoverse", "Features\t: fp asimd bf16"]
    monkeypatch.setattr(precision_module, "_read_lines", cpuinfo(lines))
    monkeypatch.setattr(precision_module.platform, "machine", lambda: machine)
    assert cpu_native_features() == {"BF16": True}
    assert resolve("bf16", CPU).support == "native: BF16 on Neoverse"
    with pytest.raises(AmpbenchError, match=r"^--precision fp16: Neoverse has no native fp16 math"):
        resolve("fp16", CPU)


def test_a_cpu_without_cpuinfo_is_named_by_the_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision_module, "_read_lines", lambda path: [])
    monkeypatch.setattr(precision_module.platform, "processor", lambda: "")
    monkeypatch.setattr(precision_module.platform, "machine", lambda: "riscv64")
    assert cpu_name() == "riscv64"
    assert precision_module._cpu_flags() == set()
    monkeypatch.setattr(precision_module.platform, "processor", lambda: "Some CPU")
    assert cpu_name() == "Some CPU"


def test_a_missing_cpuinfo_reads_as_no_lines() -> None:
    assert precision_module._read_lines("/nonexistent/cpuinfo") == []


@pytest.mark.parametrize("requested", PRECISIONS)
def test_every_precision_resolves_natively_on_a_new_gpu(requested: str, gpu: FakeGpu) -> None:
    if requested.startswith("fp8") and torchao_version() is None:
        pytest.fail("torchao is a dev dependency: install .[dev]")
    precision = resolve(requested, gpu((8, 9)))
    assert precision.name == ("fp16" if requested == "amp" else requested)
    assert not precision.emulated and precision.device_type == "cuda"
    assert precision.support.startswith("native: Test GPU, compute capability 8.9")


@pytest.mark.parametrize(
    ("requested", "native_from", "below"),
    [("tf32", (8, 0), (7, 5)), ("bf16", (8, 0), (7, 5)), ("amp", (7, 0), (6, 1))],
)
def test_capability_boundaries(
    requested: str, native_from: tuple[int, int], below: tuple[int, int], gpu: FakeGpu
) -> None:
    assert not resolve(requested, gpu(native_from)).emulated
    name = "fp16" if requested == "amp" else requested
    with pytest.raises(AmpbenchError) as refused:
        resolve(requested, gpu(below))
    assert str(refused.value).startswith(
        f"--precision {requested}: Test GPU (compute capability {below[0]}.{below[1]}) has no "
        f"{name} tensor cores (needs {native_from[0]}.{native_from[1]} or newer)"
    )


def test_fp8_below_ada_is_refused_or_emulated_with_its_recipe(gpu: FakeGpu) -> None:
    version = torchao_version()
    assert version is not None, "torchao is a dev dependency: install .[dev]"
    hopper_less = gpu((8, 6))
    with pytest.raises(AmpbenchError, match=r"has no FP8 tensor cores \(needs 8\.9 or newer\)"):
        resolve("fp8-rowwise", hopper_less)
    emulated = resolve("fp8-rowwise", hopper_less, allow_emulated=True)
    assert emulated.emulated and emulated.name == "fp8-rowwise"
    assert emulated.support == (
        "EMULATED: Test GPU (compute capability 8.6) has no FP8 tensor cores (needs 8.9 or "
        f"newer); torchao {version} float8 rowwise on the Linear layers, bf16 autocast, fp32 "
        "matmuls"
    )
    native = resolve("fp8", gpu((9, 0)))
    assert native.support == (
        f"native: Test GPU, compute capability 9.0 (torchao {version} float8 tensorwise on the "
        "Linear layers, bf16 autocast)"
    )


def test_fp8_on_a_cpu_only_emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    version = torchao_version()
    assert version is not None, "torchao is a dev dependency: install .[dev]"
    monkeypatch.setattr(precision_module, "cpu_name", lambda: "Test CPU")
    with pytest.raises(AmpbenchError) as refused:
        resolve("fp8", CPU)
    assert str(refused.value) == (
        "--precision fp8: Test CPU has no FP8 matmul (float8 training needs CUDA compute "
        "capability 8.9+); pass --allow-emulated to run its numerics with fp32 matmuls "
        "(labelled emulated)"
    )
    emulated = resolve("fp8", CPU, allow_emulated=True)
    assert (emulated.name, emulated.emulated, emulated.device_type) == ("fp8", True, "cpu")
    assert emulated.support == (
        "EMULATED: Test CPU has no FP8 matmul (float8 training needs CUDA compute capability "
        f"8.9+); torchao {version} float8 tensorwise on the Linear layers, bf16 autocast, fp32 "
        "matmuls"
    )


def test_fp32_is_strict_and_has_no_autocast() -> None:
    precision = resolve("fp32", CPU)
    assert precision.autocast_dtype is None
    assert not precision.grad_scaler
    assert not precision.tf32
    record = precision.record()
    assert (record.tf32, record.emulated, record.support) == (False, False, "native")


def cpu_with(monkeypatch: pytest.MonkeyPatch, *, bf16: bool, fp16: bool = False) -> None:
    """This process sees a CPU with (or without) native bf16 and fp16 math, through the probes
    precision.py asks: torch.cpu's feature checks and the kernel's flags."""
    monkeypatch.setattr(precision_module.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_fp16_supported", lambda: fp16, raising=False)
    monkeypatch.setattr(precision_module, "_cpu_flags", lambda: {"avx512f", "avx512bw"})
    monkeypatch.setattr(precision_module, "cpu_name", lambda: "Test Xeon")


@pytest.mark.parametrize("requested", ["bf16", "amp"])
def test_bf16_and_amp_on_a_cpu_with_native_bf16(
    requested: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu_with(monkeypatch, bf16=True)
    precision = resolve(requested, CPU)
    assert precision.name == "bf16" and not precision.emulated
    assert precision.autocast_dtype == torch.bfloat16
    assert not precision.grad_scaler
    assert precision.support == "native: AVX512_BF16 on Test Xeon"


@pytest.mark.parametrize("requested", ["bf16", "amp", "fp16"])
def test_a_cpu_without_native_math_is_refused_unless_emulation_is_asked_for(
    requested: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # oneDNN's own check says yes on any AVX-512 CPU; it is not what decides.
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    cpu_with(monkeypatch, bf16=False)
    name = "fp16" if requested == "fp16" else "bf16"
    missing = "AVX512_FP16 or AMX-FP16" if name == "fp16" else "AVX512_BF16 or AMX-BF16"
    with pytest.raises(AmpbenchError) as refused:
        resolve(requested, CPU)
    message = str(refused.value)
    assert message.startswith(f"--precision {requested}: Test Xeon has no {missing}")
    assert "--allow-emulated" in message and "\n" not in message
    emulated = resolve(requested, CPU, allow_emulated=True)
    assert (emulated.name, emulated.emulated) == (name, True)
    assert emulated.support == f"EMULATED: Test Xeon has no {missing}"
    assert emulated.record().emulated and emulated.label == (
        f"amp ({name}, EMULATED)" if requested == "amp" else f"{name} (EMULATED)"
    )


def test_an_emulated_precision_is_refused_before_any_data_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu_with(monkeypatch, bf16=False)
    config = TrainConfig(dataset_dir=tmp_path / "missing", precision="amp", device="cpu")
    with pytest.raises(AmpbenchError, match="--precision amp: Test Xeon has no AVX512_BF16"):
        Trainer(config)


def test_tf32_is_refused_on_a_cpu_even_when_emulation_is_allowed(tmp_path: Path) -> None:
    config = TrainConfig(
        dataset_dir=tmp_path / "missing", precision="tf32", device="cpu", allow_emulated=True
    )
    with pytest.raises(AmpbenchError, match="TF32 is a CUDA tensor-core mode"):
        Trainer(config)


def test_cuda_precisions_resolve_by_compute_capability(gpu: FakeGpu) -> None:
    hopper = gpu((9, 0))
    amp = resolve("amp", hopper)
    assert (amp.name, amp.autocast_dtype, amp.grad_scaler) == ("fp16", torch.float16, True)
    assert amp.support == "native: Test GPU, compute capability 9.0"
    bf16 = resolve("bf16", hopper)
    assert (bf16.autocast_dtype, bf16.grad_scaler, bf16.emulated) == (torch.bfloat16, False, False)
    tf32 = resolve("tf32", hopper)
    assert tf32.autocast_dtype is None and tf32.record().tf32 is True
    assert resolve("fp32", hopper).record().tf32 is False


@pytest.mark.parametrize(
    ("requested", "capability", "message"),
    [
        ("bf16", (7, 0), r"Test GPU \(compute capability 7\.0\) has no bf16 tensor cores"),
        ("bf16", (7, 5), "has no bf16 tensor cores"),
        ("amp", (6, 1), r"has no fp16 tensor cores \(needs 7\.0 or newer\)"),
    ],
)
def test_precisions_a_gpu_lacks_are_refused_or_labelled_emulated(
    requested: str, capability: tuple[int, int], message: str, gpu: FakeGpu
) -> None:
    device = gpu(capability)
    with pytest.raises(AmpbenchError, match=message):
        resolve(requested, device)
    assert resolve(requested, device, allow_emulated=True).emulated


def test_tf32_without_tensor_cores_is_refused_even_with_emulation(gpu: FakeGpu) -> None:
    with pytest.raises(AmpbenchError, match=r"has no tf32 tensor cores \(needs 8\.0"):
        resolve("tf32", gpu((7, 5)), allow_emulated=True)


# The TF32 switches math_mode sets: torch 2.9's fp32_precision settings (an operation's "none"
# falls back to its backend's, then to the global one; torch reads it as that) and the legacy
# flags.
SWITCHES = {
    "global": torch.backends,
    "cudnn": torch.backends.cudnn,
    "mkldnn": torch.backends.mkldnn,
    "cuda.matmul": torch.backends.cuda.matmul,
    "cudnn.conv": torch.backends.cudnn.conv,
    "cudnn.rnn": torch.backends.cudnn.rnn,
    "mkldnn.matmul": torch.backends.mkldnn.matmul,
}


def fp32_precisions() -> dict[str, str]:
    return {name: switch.fp32_precision for name, switch in SWITCHES.items()}


@pytest.fixture
def tf32_switches() -> Iterator[None]:
    """Puts back every TF32 switch a test sets: this process's torch is shared by the tests."""
    matmul, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    saved = fp32_precisions()
    yield
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cudnn.allow_tf32 = cudnn
    for name, value in saved.items():  # global, then backends, then operations
        SWITCHES[name].fp32_precision = value
    assert fp32_precisions() == saved


def tf32_is(allowed: bool) -> None:
    """TF32 is on (or off) for matmuls and cuDNN, through both APIs: a legacy read raises where
    the two disagree."""
    expected = "tf32" if allowed else "ieee"
    for name in ("cuda.matmul", "cudnn.conv", "cudnn.rnn"):
        assert SWITCHES[name].fp32_precision == expected, name
    assert torch.backends.cuda.matmul.allow_tf32 is allowed
    assert torch.backends.cudnn.allow_tf32 is allowed


def test_math_mode_sets_tf32_only_for_the_tf32_arm_and_puts_it_back(
    gpu: FakeGpu, tf32_switches: None
) -> None:
    hopper = gpu((9, 0))
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    precisions = fp32_precisions()
    for name, expected in (("fp32", False), ("tf32", True), ("bf16", False)):
        with math_mode(resolve(name, hopper)):
            tf32_is(expected)
            assert torch.get_float32_matmul_precision() == ("high" if expected else "highest")
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
        assert fp32_precisions() == precisions


def test_math_mode_turns_tf32_off_after_the_new_api_turned_it_on(tf32_switches: None) -> None:
    """The new API alone leaves the legacy flags behind (reading them then raises), and cuDNN's
    legacy flag alone leaves conv to a cudnn-wide "tf32": the fp32 arm must be strict anyway."""
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.cudnn.fp32_precision = "tf32"
    precisions = fp32_precisions()
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        _ = torch.backends.cuda.matmul.allow_tf32
    with math_mode(Precision("fp32", "fp32", "cuda")):
        tf32_is(False)
        assert torch.get_float32_matmul_precision() == "highest"
    assert fp32_precisions() == precisions


def test_cudnn_tf32_is_off_where_only_the_cudnn_wide_setting_was_tf32(tf32_switches: None) -> None:
    torch.backends.cudnn.fp32_precision = "tf32"
    torch.backends.cudnn.allow_tf32 = False  # the legacy flag alone sets conv and rnn "none",
    precisions = fp32_precisions()
    assert precisions["cudnn.conv"] == "tf32"  # which falls back to the cudnn-wide "tf32"
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        _ = torch.backends.cudnn.allow_tf32
    with math_mode(Precision("fp32", "fp32", "cuda")):
        tf32_is(False)
    assert fp32_precisions() == precisions


def test_math_mode_puts_back_a_medium_matmul_precision(tf32_switches: None) -> None:
    """torch.set_float32_matmul_precision("medium") also sets oneDNN's matmul to bf16."""
    torch.set_float32_matmul_precision("medium")
    precisions = fp32_precisions()
    for name in ("fp32", "tf32"):
        with math_mode(Precision(name, name, "cuda")):
            tf32_is(name == "tf32")
        assert torch.get_float32_matmul_precision() == "medium"
        assert fp32_precisions() == precisions


def test_math_mode_on_a_torch_without_fp32_precision_sets_the_legacy_flags(
    monkeypatch: pytest.MonkeyPatch, tf32_switches: None
) -> None:
    monkeypatch.setattr(precision_module, "_fp32_precision_switches", lambda *names: {})
    torch.backends.cudnn.allow_tf32 = False
    with math_mode(Precision("tf32", "tf32", "cuda")):
        assert torch.backends.cuda.matmul.allow_tf32 is True
        assert torch.backends.cudnn.allow_tf32 is True
    assert torch.backends.cuda.matmul.allow_tf32 is False
    assert torch.backends.cudnn.allow_tf32 is False


@pytest.mark.parametrize("name", ["fp32", "tf32"])
def test_math_mode_refuses_to_run_where_the_switches_did_not_take(
    name: str, monkeypatch: pytest.MonkeyPatch, tf32_switches: None
) -> None:
    """As ROCm ignores allow_tf32 = True unless HIPBLASLT_ALLOW_TF32=1: the arm would be
    measured under a label it does not run."""
    monkeypatch.setattr(precision_module, "_set_tf32", lambda allowed: None)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    torch.backends.cudnn.conv.fp32_precision = torch.backends.cudnn.rnn.fp32_precision = "tf32"
    state = fp32_precisions()
    with pytest.raises(AmpbenchError) as refused, math_mode(Precision(name, name, "cuda")):
        pass
    assert str(refused.value) == (
        f"TF32 {'on' if name == 'tf32' else 'off'} did not take: torch has {{'cuda.matmul': "
        "'ieee', 'cudnn.conv': 'tf32', 'cudnn.rnn': 'tf32', 'cuda.matmul.allow_tf32': False, "
        "'cudnn.allow_tf32': True}"
    )
    torch.backends.cuda.matmul.fp32_precision = "tf32"  # a legacy read of it now raises
    with (
        pytest.raises(
            AmpbenchError,
            match=f"^TF32 {'on' if name == 'tf32' else 'off'} did not "
            "take: PyTorch is checking whether allow_tf32_new is enabled",
        ),
        math_mode(Precision(name, name, "cuda")),
    ):
        pass
    assert fp32_precisions() == state | {"cuda.matmul": "tf32"}


def test_unknown_precision_is_an_error() -> None:
    with pytest.raises(AmpbenchError, match="'fp4' is not one of"):
        resolve("fp4", CPU)


def test_a_name_with_a_colon_and_the_amx_flags_where_torch_has_no_probe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = ["model name\t: Xeon: engineering sample", "flags\t\t: avx512f amx_bf16 amx_fp16"]
    monkeypatch.setattr(precision_module, "_read_lines", cpuinfo(lines))
    monkeypatch.setattr(precision_module.platform, "machine", lambda: "x86_64")
    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported", "_is_amx_fp16_supported"):
        monkeypatch.delattr(torch.cpu, probe, raising=False)
    assert cpu_name() == "Xeon: engineering sample"
    assert precision_module._cpu_flags() == {"avx512f", "amx_bf16", "amx_fp16"}
    assert cpu_native_features() == {
        "AVX512_BF16": False, "AMX-BF16": True, "AVX512_FP16": False, "AMX-FP16": True
    }  # fmt: skip


def test_both_bf16_features_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_with(monkeypatch, bf16=True)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert resolve("bf16", CPU).support == "native: AVX512_BF16 and AMX-BF16 on Test Xeon"


def test_fp16_on_a_cpu_with_amx_fp16_is_native(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_with(monkeypatch, bf16=False, fp16=True)
    assert resolve("fp16", CPU).support == "native: AMX-FP16 on Test Xeon"


def test_fp16_autocast_on_a_cpu_is_float16() -> None:
    # (bf16 is autocast's default on a CPU: only fp16 shows that the dtype is passed.)
    with Precision("fp16", "fp16", "cpu", emulated=True).autocast():
        assert torch.get_autocast_dtype("cpu") == torch.float16


def test_every_path_of_resolution_gives_the_whole_precision(
    monkeypatch: pytest.MonkeyPatch, gpu: FakeGpu
) -> None:
    version = torchao_version()
    assert resolve("fp32", CPU) == Precision("fp32", "fp32", "cpu", False, "native")
    cpu_with(monkeypatch, bf16=True)
    assert resolve("amp", CPU) == Precision(
        "amp", "bf16", "cpu", False, "native: AVX512_BF16 on Test Xeon"
    )
    cpu_with(monkeypatch, bf16=False)
    assert resolve("amp", CPU, allow_emulated=True) == Precision(
        "amp", "bf16", "cpu", True, "EMULATED: Test Xeon has no AVX512_BF16 or AMX-BF16"
    )
    assert resolve("fp8", CPU, allow_emulated=True) == Precision(
        "fp8", "fp8", "cpu", True,
        "EMULATED: Test Xeon has no FP8 matmul (float8 training needs CUDA compute capability "
        f"8.9+); torchao {version} float8 tensorwise on the Linear layers, bf16 autocast, fp32 "
        "matmuls",
    )  # fmt: skip
    assert resolve("amp", gpu((9, 0))) == Precision(
        "amp", "fp16", "cuda", False, "native: Test GPU, compute capability 9.0"
    )
    assert resolve("bf16", gpu((7, 5)), allow_emulated=True) == Precision(
        "bf16", "bf16", "cuda", True,
        "EMULATED: Test GPU (compute capability 7.5) has no bf16 tensor cores (needs 8.0 or newer)",
    )  # fmt: skip


def test_refusals_in_full(monkeypatch: pytest.MonkeyPatch, gpu: FakeGpu) -> None:
    def refusal(requested: str, device: torch.device) -> str:
        with pytest.raises(AmpbenchError) as refused:
            resolve(requested, device)
        return str(refused.value)

    assert refusal("fp4", CPU) == (f"--precision: 'fp4' is not one of {', '.join(PRECISIONS)}")
    assert ", ".join(PRECISIONS).startswith("fp32, ")
    cpu_with(monkeypatch, bf16=False)
    assert refusal("bf16", CPU) == (
        "--precision bf16: Test Xeon has no AVX512_BF16 or AMX-BF16, so bf16 autocast would run "
        "slow emulation kernels and measure nothing of mixed precision; run on a GPU or a CPU "
        "with it, or pass --allow-emulated to measure the emulation (labelled emulated)"
    )
    assert refusal("amp", gpu((6, 1))) == (
        "--precision amp: Test GPU (compute capability 6.1) has no fp16 tensor cores (needs 7.0 "
        "or newer), so it would run emulated and measure nothing of mixed precision; pass "
        "--allow-emulated to measure it anyway (labelled emulated)"
    )


def test_without_torchao_only_the_fp8_arms_are_refused(
    monkeypatch: pytest.MonkeyPatch, gpu: FakeGpu
) -> None:
    monkeypatch.setattr(fp8_module, "torchao_version", lambda: None)
    hopper = gpu((9, 0))
    assert resolve("bf16", hopper).name == "bf16"
    for requested, device in (("fp8", hopper), ("fp8-rowwise", CPU)):
        with pytest.raises(AmpbenchError) as refused:
            resolve(requested, device, allow_emulated=True)
        assert str(refused.value) == (
            f"--precision {requested}: float8 training needs torchao, which is not installed "
            "(pip install 'ampbench[fp8]')"
        )


# -- the registry, as each reader uses it -------------------------------------------------------
def test_the_registry_lists_the_precisions_in_the_command_lines_order() -> None:
    assert PRECISIONS == ("fp32", "tf32", "fp16", "bf16", "amp", "fp8", "fp8-rowwise")
    assert FP8_RECIPES == {"fp8": "tensorwise", "fp8-rowwise": "rowwise"}
    assert (BASELINE_PRECISION, AMP_PRECISION) == ("fp32", "amp")
    assert set(ARMS) | set(ALIASES) == set(PRECISIONS)
    assert {alias.on("cuda") for alias in ALIASES.values()} <= set(ARMS)
    assert {alias.on("cpu") for alias in ALIASES.values()} <= set(ARMS)
    for arm in ARMS.values():  # CPU features name only the arms whose CPU rule reads them
        assert bool(arm.cpu_features) == (arm.cpu is CpuRule.FEATURES), arm.name


def test_the_registry_imports_no_torch() -> None:
    """The command line lists the names without waiting for torch."""
    code = (
        "import sys\n"
        "from ampbench.train.precisions import PRECISIONS, arm_of\n"
        "assert arm_of('amp', 'cuda').name == 'fp16' and arm_of('amp', 'cpu').name == 'bf16'\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


CAPABILITIES = {
    "fp32": (0, 0), "tf32": (8, 0), "fp16": (7, 0), "bf16": (8, 0), "fp8": (8, 9),
    "fp8-rowwise": (8, 9),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ARMS))
def test_each_arm_is_native_from_its_compute_capability_and_not_below(
    name: str, gpu: FakeGpu
) -> None:
    assert set(CAPABILITIES) == set(ARMS)
    major, minor = needed = CAPABILITIES[name]
    assert not resolve(name, gpu(needed)).emulated
    if needed == (0, 0):
        return
    below = (major, minor - 1) if minor else (major - 1, 9)
    with pytest.raises(AmpbenchError, match=rf"needs {major}\.{minor} or newer"):
        resolve(name, gpu(below))


@pytest.mark.parametrize(
    ("requested", "with_features", "without"),
    [
        ("fp32", "native", "native"),
        ("tf32", "refused", "refused"),
        ("fp16", "native: AMX-FP16 on Test Xeon", "EMULATED: Test Xeon has no AVX512_FP16 or"),
        ("bf16", "native: AVX512_BF16 on Test Xeon", "EMULATED: Test Xeon has no AVX512_BF16"),
        ("amp", "native: AVX512_BF16 on Test Xeon", "EMULATED: Test Xeon has no AVX512_BF16"),
        ("fp8", "EMULATED: Test Xeon has no FP8", "EMULATED: Test Xeon has no FP8"),
        ("fp8-rowwise", "EMULATED: Test Xeon has no FP8", "EMULATED: Test Xeon has no FP8"),
    ],
)
def test_each_precisions_cpu_rule(
    requested: str, with_features: str, without: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fp32 runs on every CPU, tf32 on none, fp16 and bf16 natively with their features, fp8
    only emulated."""
    for has, expected in ((True, with_features), (False, without)):
        cpu_with(monkeypatch, bf16=has, fp16=has)
        if expected == "refused":
            with pytest.raises(AmpbenchError, match="is a CUDA tensor-core mode"):
                resolve(requested, CPU, allow_emulated=True)
            continue
        precision = resolve(requested, CPU, allow_emulated=True)
        assert precision.support.startswith(expected), (requested, has)
        assert precision.emulated == expected.startswith("EMULATED")
        if not precision.emulated:
            assert resolve(requested, CPU) == precision  # no --allow-emulated needed
