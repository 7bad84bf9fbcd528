"""The results schema, defined once: what a training arm reports (a comparison's record is
comparison.py's).

The engine fills ArmResults, the train step adds what only it knows (MLflow run, the resources
the task asked Kubernetes for), the compare step reads files back through `read_arm_results`
(refusing schema versions it does not know, upgrading older ones: old_results.py). Written as
JSON (`schema.dump`).

Free of torch and of any package beyond the standard library: the engine writes these on
bare GPU machines, and the command line reads them without importing torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ampbench import schema
from ampbench.errors import AmpbenchError
from ampbench.old_results import upgrade_v1, upgrade_v2, upgrade_v3

# An arm's results and a comparison, as files and as MLflow artifacts.
RESULTS_FILE = "results.json"

RESULTS_SCHEMA_VERSION = 4

# A compiled step fetched from a shared compile cache, or compiled (train/compile_cache.py).
CompileCacheOutcome = Literal["hit", "miss"]


@dataclass(frozen=True)
class PrecisionRecord:
    requested: str  # the arm as asked for: fp32, tf32, fp16, bf16, amp, fp8 or fp8-rowwise
    resolved: str  # what it is on this device: any of those but amp
    autocast_dtype: str | None  # float16, bfloat16 or None
    grad_scaler: bool
    tf32: bool  # TF32 allowed for matmuls and cuDNN convolutions
    emulated: bool  # the device has no native math for it (only with --allow-emulated)
    support: str  # one line: why this device runs it as it does


@dataclass(frozen=True)
class DeviceRecord:
    type: Literal["cpu", "cuda"]
    name: str  # the CPU or GPU model
    capability: str  # CUDA compute capability, or the CPU's reduced-precision features


@dataclass(frozen=True)
class DatasetRecord:
    path: str
    source: str  # as this run was given it
    sha256: str
    classes: int
    image_shape: list[int]  # height, width, channels
    train_images: int
    test_images: int
    # A cache hit: the source the cached copy was prepared from (None: prepared from `source`).
    cached_from: str | None = None


@dataclass(frozen=True)
class Startup:
    """DEFINITIONS["Start-up"], in two parts."""

    total_s: float  # imports_s + state_s
    imports_s: float  # process start to the device ready: interpreter, imports, device init
    state_s: float  # then the data read and uploaded, the model and optimizer built


@dataclass(frozen=True)
class Timing:
    train_time_s: float  # DEFINITIONS["Time"]
    throughput_img_s: float  # trained_images / train_time_s: the steady-state rate
    trained_images: int
    end_to_end_s: float  # warmup_s + train_time_s + eval_s + checkpoint_s
    warmup_s: float
    warmup_steps: int
    compile_s: float  # part of warmup_s: the first warm-up step of a compiled model
    # With --compile and a shared compile cache: "hit" where this graph's compiled artefacts
    # were fetched (compile_s then also their download), "miss" where they were compiled.
    compile_cache: CompileCacheOutcome | None
    eval_s: float
    checkpoint_s: float
    # Before end_to_end_s, not part of it. None: not recorded (schema 2, or no /proc).
    startup: Startup | None


@dataclass(frozen=True)
class Memory:
    kind: Literal["cuda_allocated", "cpu_rss"]
    train_peak_mb: float  # DEFINITIONS["Memory"]: the headline figure
    total_peak_mb: float  # DEFINITIONS["Total peak memory"]
    resident_mb: float  # before the first step, above the process before the data upload
    train_peak_reserved_mb: float | None  # CUDA: the caching allocator's reserved memory
    total_peak_reserved_mb: float | None
    # CUDA: what NVML (nvidia-smi) counts as the process's at the end of the training steps,
    # CUDA context and the allocator's whole pool included; None: NVML could not say.
    nvml_used_mb: float | None = None


@dataclass(frozen=True)
class Energy:
    """DEFINITIONS["Energy"]: the device's energy counter over the training clock and over the
    end-to-end window, summed over the processes' devices (train/energy.py)."""

    counter: Literal["nvml", "rapl"] | None  # None: no counter; `unavailable` says why
    unavailable: str | None
    train_j: float | None
    end_to_end_j: float | None
    j_per_image: float | None  # train_j over the images trained
    reliable: bool | None  # False: a window too short for the counter's updates to resolve
    devices: int  # the counters summed


@dataclass(frozen=True)
class EpochRecord:
    epoch: int
    train_loss: float
    train_accuracy: float
    test_loss: float
    test_accuracy: float
    val_loss: float | None
    val_accuracy: float | None
    time_s: float
    throughput_img_s: float
    train_peak_memory_mb: float
    lr: float
    loss_scale: float  # 1 without a GradScaler: every arm logs the same metric names
    skipped_steps: int
    loss_scales: list[float] | None = None  # fp16: the scale each step trained with


@dataclass(frozen=True)
class Fp16Numerics:
    """Once per fp16 arm, after training and off the clock (train/numerics.py): one batch's
    loss unscaled and scaled, and the share of its parameters' gradient elements (the nonzero
    ones) that fp16 would flush to zero without the loss scale, and that overflow at it."""

    loss: float
    loss_scale: float
    scaled_loss: float
    gradient_elements: int  # the nonzero ones, over which the shares are taken
    underflow_share: float  # zero in fp16 unscaled
    overflow_share: float  # inf in fp16 once scaled


@dataclass(frozen=True)
class OpTime:
    name: str  # an aten op (a CPU) or a kernel (CUDA)
    ms_per_step: float  # its own device time
    share: float  # of the profile's device time


@dataclass(frozen=True)
class Profile:
    """K more steps after the timed epochs, off the clock and undone (train/profile.py)."""

    steps: int
    replayed: bool  # CUDA-graph replays, as the arm trained
    wall_ms_per_step: float
    device_busy_share: float  # CUDA: kernel time over wall time; a CPU: op time over it
    matmul_conv_share: float  # of device time
    tensor_core_share: float | None  # of device time, by kernel name; None: not CUDA
    top_ops: list[OpTime]
    flops_by_dtype: dict[str, int]  # matmul, convolution and attention FLOPs of one step
    low_precision_flop_share: float | None  # autocast's coverage; None: no low dtype
    fp32_layers: list[str]  # convolutions and Linear layers autocast left in fp32
    trace: str | None  # the Chrome trace's file name, a step output beside the results


@dataclass(frozen=True)
class Versions:
    ampbench: str
    torch: str
    torchvision: str
    cuda: str | None
    cudnn: int | None
    python: str


@dataclass(frozen=True)
class TrackingRecord:
    tracking_uri: str  # never with credentials
    experiment: str
    run_id: str | None


@dataclass(frozen=True)
class RequestedResources:
    """What a pipeline task asked Kubernetes for (recorded only inside a pod)."""

    gpu_type: str
    gpu_count: int
    cpu: str
    memory: str


@dataclass(frozen=True)
class Compute:
    """What the arm's training achieved in FLOP/s (DEFINITIONS["Achieved TFLOP/s"], ["MFU"])."""

    flops_per_step: int
    achieved_tflops: float
    peak_tflops: float | None  # the device's dense peak for this precision, where known
    mfu: float | None  # achieved over peak; None where the peak is not known


@dataclass(frozen=True)
class Distributed:
    """How many processes trained the arm (torchrun; 1: a single process) and how the batch
    was shared among them."""

    world_size: int
    per_rank_batch: int  # --batch-size: each process's share of a step
    global_batch: int  # per_rank_batch x world_size: the images of one optimizer step
    backend: str | None  # nccl or gloo; None in a single process
    grad_comm: str  # the precision gradients were all-reduced in


@dataclass(frozen=True)
class TimeToTarget:
    """DEFINITIONS["Time to target"]."""

    target_accuracy: float
    reached: bool
    train_time_s: float | None  # None: not reached within the epochs
    epoch: int | None


Hyperparameters = dict[str, str | int | float | bool | None]


@dataclass(frozen=True)
class ArmResults:
    """One training run of one arm and seed."""

    schema_version: int
    precision: PrecisionRecord
    device: DeviceRecord
    model: str
    parameters: int
    hyperparameters: Hyperparameters  # TrainConfig.hyperparameters()
    dataset: DatasetRecord
    accuracy: float  # test accuracy after the last epoch
    test_loss: float
    timing: Timing
    memory: Memory
    skipped_steps: int
    loss_scale: float | None
    resumed_from: str | None
    versions: Versions
    epochs: list[EpochRecord]
    # Added by the train step:
    mlflow: TrackingRecord | None = None
    requested_resources: RequestedResources | None = None
    # Optional within schema version 2 (files written before they existed lack them):
    compute: Compute | None = None
    time_to_target: TimeToTarget | None = None
    distributed: Distributed | None = None  # None: written before it existed (one process)
    energy: Energy | None = None  # None: written before energy was measured
    fp16_numerics: Fp16Numerics | None = None  # fp16 arms only
    profile: Profile | None = None  # None: --profile-steps 0
    # Set when read from an older schema (old_results.py): its figures mean what they meant then.
    upgraded_from_schema: int | None = None

    @property
    def seed(self) -> int:
        return int(self.hyperparameters["seed"])  # type: ignore[arg-type]

    @property
    def world_size(self) -> int:
        return self.distributed.world_size if self.distributed else 1


def read_arm_results(path: Path) -> ArmResults:
    """A training run's results file, validated; any problem is one line naming the file."""
    data = schema.read_json(path, "results file")
    what = "the results of an ampbench training run"
    for version, upgrade in ((1, upgrade_v1), (2, upgrade_v2), (3, upgrade_v3)):
        if isinstance(data, dict) and data.get("schema_version") == version:
            try:
                data = upgrade(data)
            except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:
                raise AmpbenchError(
                    f"{path}: not valid ampbench results of schema version {version} ({error!r} "
                    "missing or malformed)"
                ) from None
    check_version(data, RESULTS_SCHEMA_VERSION, path, what)
    try:
        return schema.load(ArmResults, data)
    except schema.SchemaError as error:
        raise AmpbenchError(f"{path}: not valid ampbench results ({error})") from None


def check_version(data: object, known: int, path: Path, what: str) -> None:
    if not isinstance(data, dict) or "schema_version" not in data:
        raise AmpbenchError(f"{path}: not {what} (no schema_version)")
    version = data["schema_version"]
    if version != known:
        raise AmpbenchError(
            f"{path}: schema version {version!r} is not one this ampbench reads ({known}); "
            "produce it again with this version"
        )


def write_json(path: Path, record: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(schema.dump(record), indent=2) + "\n", encoding="utf-8")
