"""The comparison's record, defined once: what the compare step reports, and what each of its
headline figures means. The report, the plots and `ampbench run` read it; written as JSON
(`schema.dump`) like an arm's results.

Free of torch, like results.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ampbench import schema
from ampbench.errors import AmpbenchError
from ampbench.results import ArmResults, PrecisionRecord, check_version

COMPARISON_SCHEMA_VERSION = 5

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
    "Energy": (
        "the device's own energy counter read where the training clock starts and stops (after "
        "the device sync) and over the end-to-end window: NVML's total energy on CUDA, the RAPL "
        "package zones of Linux powercap on a CPU, summed over the processes' devices; J/image is "
        "the training energy over the images trained, and the energy ratio arm over baseline of "
        "J/image (geometric mean of per-seed ratios). Marked unreliable where a window is shorter "
        "than 10 of the counter's updates (NVML: 100 ms) per reading"
    ),
    "Cost": (
        "with --gpu-hour-price and/or --energy-price: device-hours x processes x the device-hour "
        "price, plus kWh x the energy price, for the training time and for the end-to-end time; "
        "saved is the baseline's cost minus the arm's (mean of per-seed differences), per run "
        "and per 1,000 runs. Start-up and what follows training are in neither"
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
    # Of the seeds, those that fetched their compiled step from a shared compile cache and
    # those that compiled it there (seeds without one are neither).
    compile_cache_hits: int
    compile_cache_misses: int
    seeds: int
    train_s: float
    eval_s: float
    checkpoint_s: float


@dataclass(frozen=True)
class EnergySummary:
    """An arm's energy over its seeds (DEFINITIONS["Energy"])."""

    counter: str  # nvml or rapl
    train_j: Estimate
    end_to_end_j: Estimate
    j_per_image: Estimate
    reliable: bool  # every seed's windows long enough for the counter to resolve


@dataclass(frozen=True)
class Prices:
    """What the cost figures are priced at (DEFINITIONS["Cost"]); None: not given."""

    device_hour: float | None
    kwh: float | None

    @classmethod
    def given(cls, gpu_hour_price: float, energy_price: float) -> Prices | None:
        """The prices a run was given (0: none); None where neither was."""
        if not (gpu_hour_price or energy_price):
            return None
        return cls(gpu_hour_price or None, energy_price or None)


@dataclass(frozen=True)
class CostSummary:
    """An arm's cost per run over its seeds, at Comparison.prices."""

    train: Estimate
    end_to_end: Estimate
    energy_included: bool  # False: an energy price was given but no energy was measured


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
    energy: EnergySummary | None = None  # None: not every seed measured it
    energy_unavailable: str | None = None  # why there is no energy figure, where recorded
    cost: CostSummary | None = None  # None: no price given (or nothing to price)


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
    energy_ratio: Estimate | None = None  # J/image, arm over baseline; None: not measured
    # The baseline's cost per run minus the arm's, at Comparison.prices; None: no price.
    cost_saved: Estimate | None = None  # over the training time
    end_to_end_cost_saved: Estimate | None = None


@dataclass(frozen=True)
class Finding:
    """What limits an arm's gain, or what its figures cannot carry (compare/why.py's rules)."""

    rule: str
    sentence: str  # with the figure behind it
    qualifies: Literal["speed", "accuracy"] | None  # the verdict's claim it qualifies


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
    # experiment, experiment_id, parent_run_id, arm_run_ids (comma-separated)
    mlflow: dict[str, str] | None = None
    definitions: dict[str, str] = field(default_factory=lambda: dict(DEFINITIONS))
    # Where arms ran at several world sizes (torchrun processes: GPUs); empty otherwise.
    scaling: list[ScalingRow] = field(default_factory=list)
    prices: Prices | None = None  # None: no price given, no cost figures
    why: dict[str, list[Finding]] = field(default_factory=dict)  # per compared arm
    # Why the published run is not set beside this one (None: it is; see compare/published.py).
    unlike_published: str | None = None


def read_comparison(path: Path) -> Comparison:
    data = schema.read_json(path, "comparison")
    check_version(data, COMPARISON_SCHEMA_VERSION, path, "an ampbench comparison")
    try:
        return schema.load(Comparison, data)
    except schema.SchemaError as error:
        raise AmpbenchError(f"{path}: not a valid ampbench comparison ({error})") from None
