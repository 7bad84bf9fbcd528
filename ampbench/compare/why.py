"""Why an arm gained what it gained, and what its figures cannot carry: one table of rules,
each a sentence with the figure behind it where its figures trigger it.

A rule that `qualifies` a claim ("speed", "accuracy") also changes the verdict: the claim is
made with the rule's sentence beside it, not on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ampbench.comparison import ArmComparison, ArmSummary, Finding
from ampbench.results import ArmResults, Profile

# A speed figure needs this much timed training in every run of both arms: fewer steps or
# seconds are within the clock's and the device's jitter (a first step's page faults, a
# frequency change, a timer tick).
MIN_TIMED_STEPS = 20
MIN_TIMED_S = 1.0
BINOMIAL_CONFIDENCE = 0.95
# From the profile (train/profile.py): a device busy for less of a step's wall time waits on
# launches or the host; less of its time in matmul and convolution leaves little for a lower
# precision to speed up; less coverage leaves FLOPs in fp32.
BUSY_SHARE = 0.8
MATMUL_SHARE = 0.5
COVERAGE_SHARE = 0.9
LAYERS_NAMED = 5


@dataclass(frozen=True)
class Pair:
    """What a rule reads: the arm, its baseline, and the one against the other."""

    arm: ArmSummary
    base: ArmSummary
    comparison: ArmComparison


@dataclass(frozen=True)
class Rule:
    name: str
    check: Callable[[Pair], str | None]  # the sentence, where the figures trigger the rule
    qualifies: Literal["speed", "accuracy"] | None = None


def timed_steps(run: ArmResults) -> int:
    """The optimizer steps on the clock: the images trained over the global batch."""
    batch = int(run.hyperparameters["batch_size"]) * run.world_size  # type: ignore[arg-type]
    return run.timing.trained_images // batch


def short_window(pair: Pair) -> str | None:
    runs = [*pair.base.per_seed, *pair.arm.per_seed]
    shortest = min(runs, key=lambda run: (timed_steps(run), run.timing.train_time_s))
    steps = min(timed_steps(run) for run in runs)
    seconds = min(run.timing.train_time_s for run in runs)
    if steps >= MIN_TIMED_STEPS and seconds >= MIN_TIMED_S:
        return None
    return (
        f"its speed is from as few as {steps} timed steps in {seconds:.2f} s a run "
        f"({shortest.precision.requested} seed {shortest.seed}): too short a window to carry a "
        f"speed figure (at least {MIN_TIMED_STEPS} steps and {MIN_TIMED_S:g} s; train longer "
        "or on more data)"
    )


def binomial_interval(run: ArmResults) -> tuple[float, float]:
    """The Clopper-Pearson interval of the run's test accuracy."""
    from scipy import stats

    images = run.dataset.test_images
    found = stats.binomtest(round(run.accuracy * images), images).proportion_ci(BINOMIAL_CONFIDENCE)
    return float(found.low), float(found.high)


def unresolved_accuracy(pair: Pair) -> str | None:
    """One seed per arm: the delta against the test set's own resolution (each arm's binomial
    interval); with seeds the delta's own interval says it."""
    if len(pair.comparison.seeds) > 1:
        return None
    base, arm = pair.base.per_seed[0], pair.arm.per_seed[0]
    (base_low, base_high), (arm_low, arm_high) = binomial_interval(base), binomial_interval(arm)
    if arm_low > base_high or base_low > arm_high:
        return None
    return (
        f"{base.dataset.test_images:,} test images cannot resolve its accuracy difference "
        f"({BINOMIAL_CONFIDENCE:.0%} binomial intervals: {pair.base.name} {base_low:.1%} to "
        f"{base_high:.1%}, {pair.arm.name} {arm_low:.1%} to {arm_high:.1%}, overlapping)"
    )


def emulated(pair: Pair) -> str | None:
    precision = pair.arm.precision
    if not precision.emulated:
        return None
    return (
        f"it ran {precision.resolved} emulated ({precision.support.removeprefix('EMULATED: ')}): "
        "its speed and memory measure the emulation, not mixed precision"
    )


def baseline_not_strict(pair: Pair) -> str | None:
    precision = pair.base.precision
    if precision.resolved == "fp32" and not precision.tf32:
        return None
    what = "TF32 matmuls and convolutions" if precision.tf32 else precision.resolved
    return (
        f"its baseline {pair.base.name} is not strict FP32 ({what}): the gain shown is over "
        "that, less than over FP32"
    )


def _profile(pair: Pair) -> Profile | None:
    """The arm's profile (its first seed's: the seeds train the same steps)."""
    return pair.arm.per_seed[0].profile


def launch_bound(pair: Pair) -> str | None:
    profile = _profile(pair)
    if profile is None or profile.device_busy_share >= BUSY_SHARE:
        return None
    how = "CUDA-graph replays" if profile.replayed else "eager steps"
    return (
        f"the device is busy only {profile.device_busy_share:.0%} of each step's wall time "
        f"({profile.steps} profiled {how}, {profile.wall_ms_per_step:.1f} ms a step): the step "
        "waits on kernel launches or the host, which a lower precision does not shorten; CUDA "
        "graphs, torch.compile or a larger batch would"
    )


def outside_matmul(pair: Pair) -> str | None:
    profile = _profile(pair)
    if profile is None or profile.matmul_conv_share >= MATMUL_SHARE:
        return None
    top = profile.top_ops[0] if profile.top_ops else None
    return (
        f"only {profile.matmul_conv_share:.0%} of its device time is in matmul and convolution "
        "work, the part a lower precision speeds up; the rest (elementwise, normalisation, the "
        "optimizer) runs at memory speed"
        + (f" (the largest: {top.name}, {top.share:.0%})" if top else "")
    )


def low_coverage(pair: Pair) -> str | None:
    profile = _profile(pair)
    if profile is None or profile.low_precision_flop_share is None:
        return None
    if profile.low_precision_flop_share >= COVERAGE_SHARE:
        return None
    layers = profile.fp32_layers
    named = ", ".join(layers[:LAYERS_NAMED]) + (
        f" and {len(layers) - LAYERS_NAMED} more" if len(layers) > LAYERS_NAMED else ""
    )
    return (
        f"autocast ran only {profile.low_precision_flop_share:.0%} of its matmul and "
        f"convolution FLOPs in {pair.arm.precision.autocast_dtype or pair.arm.precision.resolved}"
        + (f"; layers left in fp32: {named}" if layers else "")
    )


RULES = (
    Rule("short timed window", short_window, qualifies="speed"),
    Rule("accuracy the test set cannot resolve", unresolved_accuracy, qualifies="accuracy"),
    Rule("launch- or host-bound", launch_bound),
    Rule("time outside matmul and convolution", outside_matmul),
    Rule("low autocast coverage", low_coverage),
    Rule("emulated precision", emulated),
    Rule("baseline not strict FP32", baseline_not_strict),
)


def findings(arm: ArmSummary, base: ArmSummary, comparison: ArmComparison) -> list[Finding]:
    """Every rule's sentence that the arm's figures trigger, in the table's order."""
    pair = Pair(arm, base, comparison)
    found = []
    for rule in RULES:
        sentence = rule.check(pair)
        if sentence is not None:
            found.append(Finding(rule.name, sentence, rule.qualifies))
    return found
