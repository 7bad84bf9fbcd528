"""The results schema, defined once: what a training arm reports and what a comparison reports.

The engine fills ArmResults, the train step adds what only it knows (MLflow run, the resources
the task asked Kubernetes for), the compare step reads files back through `read_arm_results`
(refusing schema versions it does not know) and builds a Comparison, which the report, the
plots and `ampbench run` read. Both are written as JSON (`schema.dump`).

Free of torch and of any package beyond the standard library: the engine writes these on
bare GPU machines, and the command line reads them without importing torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ampbench import schema
from ampbench.errors import AmpbenchError

# An arm's results and a comparison, as files and as MLflow artifacts.
RESULTS_FILE = "results.json"

RESULTS_SCHEMA_VERSION = 3
COMPARISON_SCHEMA_VERSION = 4

# What each headline figure means; the report prints these, and nothing else defines them.
DEFINITIONS = {
    "Time": (
        "training time: wall time of the training steps of all epochs, device-synchronised, "
        "after an untimed warm-up of each arm (compilation, autotuning, lazy loading and the "
        "allocator's growth happen there); evaluation and checkpoint writes are timed apart"
    ),
    "Steady-state speedup": (
        "training images/s of the arm over those of the baseline, both after the warm-up: "
        "the geometric mean of the per-seed ratios, over the seeds both arms ran"
    ),
    "End-to-end time ratio": (
        "baseline over arm of the end-to-end training time: warm-up + training steps + "
        "per-epoch evaluation + checkpoint writes (geometric mean of per-seed ratios)"
    ),
    "Memory": (
        "peak memory of the training steps above what is resident before the first step "
        "(model, optimizer state and the data set on the device); on CUDA "
        "torch.cuda.max_memory_allocated, on a CPU the process's peak resident set (VmHWM). "
        "The memory ratio is arm over baseline of this figure (geometric mean of per-seed ratios)"
    ),
    "Total peak memory": (
        "the whole run's peak above the process's memory before the data upload: data set, "
        "model, training and evaluation (not the warm-up, where cuDNN's autotuning tries "
        "algorithms with scratch memory of their own)"
    ),
    "Achieved TFLOP/s": (
        "the FLOPs of one training step (forward and backward, counted once by PyTorch's "
        "FlopCounterMode: matrix multiplications, convolutions and attention, 2 FLOPs per "
        "multiply-add; elementwise work not counted) times the steps trained, over the training "
        "time"
    ),
    "Scaling efficiency": (
        "images/s of an arm in N processes (torchrun; one per GPU) over N times its images/s "
        "in one process, at the same batch per process (the global batch grows with N): 1.0 "
        "is perfect scaling"
    ),
    "MFU": (
        "model FLOP/s utilisation: achieved TFLOP/s over the device's dense peak for the arm's "
        "precision (ampbench/train/flops.py lists the peaks and their sources); omitted where "
        "the peak is not known (every CPU, unlisted GPUs)"
    ),
    "Time to target": (
        "with --target-accuracy: the training time (as Time) up to the end of the first epoch "
        "whose test accuracy reached the target, evaluated after each epoch off the clock; the "
        "run stops there. The ratio is baseline over arm, over the seeds where both got there"
    ),
    "Start-up": (
        "the arm's process from its start (the kernel's start time, so the interpreter and every "
        "import count) to the training state ready for the warm-up: imports and device "
        "initialisation, then the data read and put on the device and the model and optimizer "
        "built. Not in the end-to-end time; what a task spends after training (outputs, the "
        "MLflow model, exit) is in neither"
    ),
    "Accuracy delta": (
        "arm minus baseline test accuracy in percentage points, the mean of per-seed differences"
    ),
    "Intervals": (
        "95 % Student-t intervals over seeds; for ratios on the log ratios, so that each "
        "interval is centred (geometrically) on the figure shown; one seed gives no interval"
    ),
}


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
    source: str
    sha256: str
    classes: int
    image_shape: list[int]  # height, width, channels
    train_images: int
    test_images: int


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
    # Set when read from an older schema (upgrade_v1, upgrade_v2): its figures mean what they
    # meant then.
    upgraded_from_schema: int | None = None

    @property
    def seed(self) -> int:
        return int(self.hyperparameters["seed"])  # type: ignore[arg-type]

    @property
    def world_size(self) -> int:
        return self.distributed.world_size if self.distributed else 1


def read_arm_results(path: Path) -> ArmResults:
    """A training run's results file, validated; any problem is one line naming the file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise AmpbenchError(f"{path}: not a readable results file ({error})") from None
    what = "the results of an ampbench training run"
    for version, upgrade in ((1, upgrade_v1), (2, upgrade_v2)):
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


UNRECORDED = "not recorded (schema version 1)"


def upgrade_v1(old: dict) -> dict:
    """Results of schema version 1 (ampbench before its measurement protocol) in schema 2.

    Nothing is made up: what version 1 did not record says so (UNRECORDED, an empty image
    shape, no warm-up), and its figures keep their meaning: its time holds the first epoch's
    one-time costs, its peak memory counts the data set and the model. The comparison warns.
    """
    hyperparameters = old["hyperparameters"]
    dataset = old["dataset"]
    steps = dataset["train_images"] // hyperparameters["batch_size"]
    trained_images = len(old["epochs"]) * steps * hyperparameters["batch_size"]
    train_time = old["train_time_s"]
    extra_time = sum(old.get(key) or 0.0 for key in ("eval_time_s", "checkpoint_time_s"))
    compile_time = old.get("compile_time_s") or 0.0
    reserved = old.get("peak_memory_reserved_mb")
    return {
        "schema_version": 2,
        "precision": {
            "requested": old["precision"],
            "resolved": old["resolved_precision"],
            "autocast_dtype": old["autocast_dtype"],
            "grad_scaler": old["grad_scaler"],
            "tf32": old["tf32_matmul"],
            "emulated": False,
            "support": UNRECORDED,
        },
        "device": {"type": old["device"], "name": old["device_name"], "capability": UNRECORDED},
        "model": old["model"],
        "parameters": old["parameters"],
        "hyperparameters": hyperparameters,
        "dataset": {**dataset, "image_shape": []},
        "accuracy": old["accuracy"],
        "test_loss": old["test_loss"],
        "timing": {
            "train_time_s": train_time,
            "throughput_img_s": old.get("throughput_img_s") or trained_images / train_time,
            "trained_images": trained_images,
            "end_to_end_s": compile_time + train_time + extra_time,
            "warmup_s": compile_time,
            "warmup_steps": 0,
            "compile_s": compile_time,
            "eval_s": old.get("eval_time_s") or 0.0,
            "checkpoint_s": old.get("checkpoint_time_s") or 0.0,
        },
        "memory": {
            "kind": {"cuda_max_allocated": "cuda_allocated"}.get(old["memory_kind"], "cpu_rss"),
            "train_peak_mb": old["peak_memory_mb"],
            "total_peak_mb": old["peak_memory_mb"],
            "resident_mb": 0.0,
            "train_peak_reserved_mb": reserved,
            "total_peak_reserved_mb": reserved,
        },
        "skipped_steps": old["skipped_steps"],
        "loss_scale": old["loss_scale"],
        "resumed_from": old["resumed_from"],
        "versions": old["versions"],
        "epochs": [
            {
                "epoch": epoch["epoch"],
                "train_loss": epoch["train_loss"],
                "train_accuracy": epoch["train_accuracy"],
                "test_loss": epoch["test_loss"],
                "test_accuracy": epoch["test_accuracy"],
                "val_loss": epoch.get("val_loss"),
                "val_accuracy": epoch.get("val_accuracy"),
                "time_s": epoch["time_s"],
                "throughput_img_s": steps * hyperparameters["batch_size"] / epoch["time_s"],
                "train_peak_memory_mb": epoch["peak_memory_mb"],
                "lr": epoch["lr"],
                "loss_scale": epoch["loss_scale"],
                "skipped_steps": epoch["skipped_steps"],
            }
            for epoch in old["epochs"]
        ],
        "mlflow": old.get("mlflow"),
        "requested_resources": old.get("requested_resources"),
        "upgraded_from_schema": 1,
    }


def upgrade_v2(old: dict) -> dict:
    """Results of schema version 2 in this schema: the same protocol and figures, without the
    process's start-up, which version 2 did not record."""
    return {
        **old,
        "schema_version": 3,
        "timing": {**old["timing"], "startup": None},
        "upgraded_from_schema": old.get("upgraded_from_schema") or 2,
    }


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


# -- the comparison -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Estimate:
    """A figure over seeds: `value` with its 95 % interval (None with one seed)."""

    value: float
    low: float | None
    high: float | None
    n: int

    def excludes(self, reference: float) -> bool | None:
        """Whether the interval lies wholly on one side of `reference` (None: no interval)."""
        if self.low is None or self.high is None:
            return None
        return not self.low <= reference <= self.high


@dataclass(frozen=True)
class ScalingRow:
    """One arm at one world size, against the same arm in one process (DEFINITIONS["Scaling
    efficiency"]) and against its baseline precision at the same scale."""

    model: str
    per_rank_batch: int
    precision: str
    world_size: int
    arm: str
    throughput_img_s: float
    scaling_efficiency: float | None  # None: no one-process run of this arm to scale from
    speedup: float | None  # over the baseline precision at this world size; None: the baseline


@dataclass(frozen=True)
class TimeSpent:
    """Where an arm's time went, in seconds, each the mean over its seeds: start-up (imports,
    then state), warm-up (compilation part of it), training, evaluation, checkpoint writes."""

    startup_s: float | None  # None where a seed did not record it (results of schema 2)
    imports_s: float | None
    state_s: float | None
    warmup_s: float
    compile_s: float
    train_s: float
    eval_s: float
    checkpoint_s: float


@dataclass(frozen=True)
class ArmSummary:
    """One arm over the seeds compared."""

    name: str
    precision: PrecisionRecord
    model: str
    batch_size: int
    group: str  # the (model, batch size) group the arm belongs to, e.g. "resnet18, batch 128"
    baseline_arm: str  # the group's baseline arm, which this arm is compared with
    seeds: list[int]
    accuracy: Estimate
    train_time_s: Estimate
    throughput_img_s: Estimate
    end_to_end_s: Estimate
    time_spent: TimeSpent
    train_peak_memory_mb: Estimate
    total_peak_memory_mb: Estimate
    achieved_tflops: Estimate | None  # None where a seed did not record it
    mfu: Estimate | None  # None where the device's peak is not known
    time_to_target_s: Estimate | None  # over the seeds that reached the target
    target_reached: list[int] | None  # the seeds that reached it; None: no target was set
    epochs: list[dict[str, float]]  # per-epoch figures averaged over seeds, for the plots
    per_seed: list[ArmResults]


@dataclass(frozen=True)
class ArmComparison:
    """One arm against the baseline, over the seeds both ran (paired by seed)."""

    arm: str
    baseline: str
    seeds: list[int]
    speedup: Estimate  # DEFINITIONS["Steady-state speedup"]
    end_to_end_ratio: Estimate
    memory_ratio: Estimate | None  # None where a baseline peak is 0 (see note)
    total_memory_ratio: Estimate | None
    accuracy_delta_pp: Estimate
    # Baseline over arm of the time to target, over the seeds where both reached it:
    time_to_target_ratio: Estimate | None
    per_seed: dict[str, list[float | None]]  # each figure's per-seed values, in `seeds` order
    note: str | None = None


@dataclass(frozen=True)
class Comparison:
    schema_version: int
    baseline: str
    headline_arm: str
    verdict: str
    warnings: list[str]  # what a reader must know before trusting the figures
    accuracy_at_chance: bool
    settings: dict[str, str]  # what every compared run shares
    arms: dict[str, ArmSummary]
    comparisons: dict[str, ArmComparison]
    unpaired_seeds: dict[str, list[int]]  # per arm: seeds left out (no partner)
    mismatches: list[str]  # differences compared anyway (--allow-mismatch)
    resumed: list[str]  # runs continued from a checkpoint
    emulated: list[str]  # arms that ran an emulated precision
    published_differences: list[str]  # empty: our setup is the published one
    groups: list[str]  # the (model, batch size) groups, each with its own baseline arm
    # Per model: the arm with the most images/s and no significant accuracy loss against its
    # group's baseline (see analysis.best_per_model).
    best_per_model: dict[str, str]
    # The headline arm's figures, flat, for scripts, KFP metrics and MLflow:
    speedup: float
    end_to_end_ratio: float
    memory_ratio: float | None
    accuracy_delta_pp: float
    mlflow: dict[str, str] | None = None  # experiment, experiment_id, parent_run_id
    definitions: dict[str, str] = field(default_factory=lambda: dict(DEFINITIONS))
    # Where arms ran at several world sizes (torchrun processes: GPUs); empty otherwise.
    scaling: list[ScalingRow] = field(default_factory=list)


def read_comparison(path: Path) -> Comparison:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise AmpbenchError(f"{path}: not a readable comparison ({error})") from None
    check_version(data, COMPARISON_SCHEMA_VERSION, path, "an ampbench comparison")
    try:
        return schema.load(Comparison, data)
    except schema.SchemaError as error:
        raise AmpbenchError(f"{path}: not a valid ampbench comparison ({error})") from None
