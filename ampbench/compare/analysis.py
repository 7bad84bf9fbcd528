"""The comparison of arms: paired by seed, and refused when the arms differ in more than
precision.

Arms fall into groups by the settings an experiment matrix varies besides precision (model
and batch size): each group has its own baseline arm (strict fp32 by default), and each arm is
compared with its group's baseline only. Every run compared must share device model, data set,
image shape, image counts, software versions and every hyperparameter but the seed and the
group's own settings; a difference is one line naming it (`--allow-mismatch` compares anyway,
with a warning in front of every figure). Only seeds that every arm ran are compared; the
others are left out and named. Ratios and deltas are taken per seed and summarised as
stats.py says; the verdict sentence says what they show and whether it is significant.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from statistics import fmean

from ampbench.compare.stats import mean_estimate, ratio_estimate
from ampbench.errors import AmpbenchError
from ampbench.matrix import group_label
from ampbench.results import (
    COMPARISON_SCHEMA_VERSION,
    ArmComparison,
    ArmResults,
    ArmSummary,
    Comparison,
    Estimate,
    PrecisionRecord,
    ScalingRow,
    TimeSpent,
)
from ampbench.train.precisions import ALIASES, AMP_PRECISION, ARMS, BASELINE_PRECISION

# The published experiment this project starts from (ResNet-18, CIFAR-10, 2 epochs, a GPU).
PUBLISHED_ARMS = (BASELINE_PRECISION, AMP_PRECISION)
PUBLISHED = {
    BASELINE_PRECISION: {"accuracy": 0.7114, "peak_memory_mb": 3219.65, "train_time_s": 309.41},
    AMP_PRECISION: {"accuracy": 0.6969, "peak_memory_mb": 1916.57, "train_time_s": 252.56},
}
PUBLISHED_SETUP: dict[str, Callable[[ArmResults], object]] = {
    "model": lambda r: r.model,
    "epochs": lambda r: r.hyperparameters.get("epochs"),
    "batch size": lambda r: r.hyperparameters.get("batch_size"),
    "training images": lambda r: r.dataset.train_images,
    "test images": lambda r: r.dataset.test_images,
    "classes": lambda r: r.dataset.classes,
    "device": lambda r: r.device.type,
}
PUBLISHED_VALUES = {
    "model": "resnet18",
    "epochs": 2,
    "batch size": 128,
    "training images": 50_000,
    "test images": 10_000,
    "classes": 10,
    "device": "cuda",
}

# What every compared run must share, beside the hyperparameters.
SHARED: dict[str, Callable[[ArmResults], object]] = {
    "device": lambda r: f"{r.device.name} ({r.device.type})",
    "model": lambda r: r.model,
    "dataset": lambda r: r.dataset.sha256[:12],
    "image shape": lambda r: "x".join(map(str, r.dataset.image_shape)),
    "training images": lambda r: r.dataset.train_images,
    "test images": lambda r: r.dataset.test_images,
    "world size": lambda r: r.world_size,
    "torch": lambda r: r.versions.torch,
    "torchvision": lambda r: r.versions.torchvision,
    "CUDA": lambda r: r.versions.cuda,
    "cuDNN": lambda r: r.versions.cudnn,
}
# Hyperparameters that may differ: what defines an arm or a seed, and how often checkpoints
# are written (their time is kept out of the training time).
FREE_HYPERPARAMETERS = {"seed", "precision", "checkpoint_every"}
CHANCE_P_VALUE = 0.01  # accuracy above chance only if a binomial test says so at this level
# The settings an experiment matrix varies besides precision, as shared_settings names them:
# arms that differ in these are compared within their group, never across.
MATRIX_SETTINGS = ("model", "batch size", "world size")


def shared_settings(run: ArmResults) -> dict[str, str]:
    settings = {name: str(value_of(run)) for name, value_of in SHARED.items()}
    for key, value in run.hyperparameters.items():
        if key not in FREE_HYPERPARAMETERS:
            settings[key.replace("_", " ")] = str(value)
    return settings


def differences(
    arms: Mapping[str, Sequence[ArmResults]], group_by: Sequence[str] = ()
) -> list[str]:
    """Each setting that is not the same in every run, with its values per arm (the group
    settings `group_by` may differ)."""
    per_arm = {name: [shared_settings(run) for run in runs] for name, runs in arms.items()}
    keys = list(dict.fromkeys(key for runs in per_arm.values() for s in runs for key in s))
    found = []
    for key in keys:
        if key in group_by:
            continue
        values = {
            name: sorted({s.get(key, "unrecorded") for s in runs}) for name, runs in per_arm.items()
        }
        if len({v for vs in values.values() for v in vs}) > 1:
            listed = "; ".join(f"{name}: {'/'.join(vs)}" for name, vs in values.items())
            found.append(f"{key} ({listed})")
    return found


def _by_seed(runs: Sequence[ArmResults], arm: str) -> dict[int, ArmResults]:
    if not runs:
        raise AmpbenchError(f"arm {arm}: no training results")
    precisions = sorted({run.precision.requested for run in runs})
    if len(precisions) > 1:
        raise AmpbenchError(f"arm {arm}: results of several precisions ({', '.join(precisions)})")
    by_seed: dict[int, ArmResults] = {}
    for run in runs:
        if run.seed in by_seed:
            raise AmpbenchError(f"arm {arm}: two results for seed {run.seed}")
        by_seed[run.seed] = run
    return by_seed


def _mean_epochs(runs: Sequence[ArmResults]) -> list[dict[str, float]]:
    """Per-epoch figures averaged over seeds (a value missing in some seed is left out)."""
    epochs = []
    for index in range(min(len(run.epochs) for run in runs)):
        records = [dataclasses.asdict(run.epochs[index]) for run in runs]
        keys = [k for k, v in records[0].items() if isinstance(v, (int, float))]
        epochs.append(
            {
                key: mean_estimate(values).value
                for key in keys
                if (values := [r[key] for r in records if r.get(key) is not None])
            }
        )
    return epochs


def _estimate_all(values: Sequence[float | None]) -> Estimate | None:
    """The mean over seeds, or None if any seed lacks the figure (or there is none): a mean
    over some seeds would pass for one over all of them."""
    if not values or any(value is None for value in values):
        return None
    return mean_estimate([value for value in values if value is not None])


def time_spent(runs: Sequence[ArmResults]) -> TimeSpent:
    """Where the arm's time went, each phase the mean over its seeds; the start-up only where
    every seed recorded it (a mean over some would pass for one over all)."""
    startups = [run.timing.startup for run in runs]
    known = [s for s in startups if s is not None] if None not in startups else []
    return TimeSpent(
        startup_s=fmean([s.total_s for s in known]) if known else None,
        imports_s=fmean([s.imports_s for s in known]) if known else None,
        state_s=fmean([s.state_s for s in known]) if known else None,
        warmup_s=fmean([run.timing.warmup_s for run in runs]),
        compile_s=fmean([run.timing.compile_s for run in runs]),
        train_s=fmean([run.timing.train_time_s for run in runs]),
        eval_s=fmean([run.timing.eval_s for run in runs]),
        checkpoint_s=fmean([run.timing.checkpoint_s for run in runs]),
    )


def summarize(name: str, runs: Sequence[ArmResults], group: str, baseline_arm: str) -> ArmSummary:
    return ArmSummary(
        name=name,
        precision=runs[0].precision,
        model=runs[0].model,
        batch_size=batch_size_of(runs[0]),
        group=group,
        baseline_arm=baseline_arm,
        seeds=[run.seed for run in runs],
        accuracy=mean_estimate([run.accuracy for run in runs]),
        train_time_s=mean_estimate([run.timing.train_time_s for run in runs]),
        throughput_img_s=mean_estimate([run.timing.throughput_img_s for run in runs]),
        end_to_end_s=mean_estimate([run.timing.end_to_end_s for run in runs]),
        time_spent=time_spent(runs),
        train_peak_memory_mb=mean_estimate([run.memory.train_peak_mb for run in runs]),
        total_peak_memory_mb=mean_estimate([run.memory.total_peak_mb for run in runs]),
        achieved_tflops=_estimate_all(
            [r.compute.achieved_tflops if r.compute else None for r in runs]
        ),
        mfu=_estimate_all([r.compute.mfu if r.compute else None for r in runs]),
        time_to_target_s=_estimate_all(
            [
                r.time_to_target.train_time_s
                for r in runs
                if r.time_to_target and r.time_to_target.reached
            ]
        ),
        target_reached=(
            [r.seed for r in runs if r.time_to_target.reached]  # type: ignore[union-attr]
            if all(r.time_to_target for r in runs)
            else None
        ),
        epochs=_mean_epochs(runs),
        per_seed=list(runs),
    )


def _memory_ratios(
    pairs: Sequence[tuple[ArmResults, ArmResults]], peak: Callable[[ArmResults], float]
) -> list[float] | None:
    """Per-seed ratios, or None if any peak is zero: a ratio over some seeds only would
    pass for one over all of them."""
    if all(peak(b) > 0 and peak(a) > 0 for b, a in pairs):
        return [peak(a) / peak(b) for b, a in pairs]
    return None


def pair(
    baseline: str, base: Sequence[ArmResults], name: str, arm: Sequence[ArmResults]
) -> ArmComparison:
    """The arm against the baseline; both lists hold the same seeds in the same order."""
    pairs = list(zip(base, arm, strict=True))
    speedups = [a.timing.throughput_img_s / b.timing.throughput_img_s for b, a in pairs]
    end_to_end = [b.timing.end_to_end_s / a.timing.end_to_end_s for b, a in pairs]
    memory = _memory_ratios(pairs, lambda r: r.memory.train_peak_mb)
    total = _memory_ratios(pairs, lambda r: r.memory.total_peak_mb)
    deltas = [100.0 * (a.accuracy - b.accuracy) for b, a in pairs]
    # MLPerf's comparison: time to the target, baseline over arm, where both got there.
    to_target = [
        b.time_to_target.train_time_s / a.time_to_target.train_time_s
        for b, a in pairs
        if b.time_to_target
        and a.time_to_target
        and b.time_to_target.train_time_s
        and a.time_to_target.train_time_s
    ]
    note = None
    if memory is None:
        note = (
            "memory ratio not given: a training peak of 0 MB in some seed (on a CPU the resident "
            "set need not grow when freed pages are reused)"
        )
    return ArmComparison(
        arm=name,
        baseline=baseline,
        seeds=[run.seed for run in arm],
        speedup=ratio_estimate(speedups),
        end_to_end_ratio=ratio_estimate(end_to_end),
        memory_ratio=ratio_estimate(memory) if memory else None,
        total_memory_ratio=ratio_estimate(total) if total else None,
        accuracy_delta_pp=mean_estimate(deltas),
        time_to_target_ratio=ratio_estimate(to_target) if to_target else None,
        per_seed={
            "speedup": list(speedups),
            "end_to_end_ratio": list(end_to_end),
            "memory_ratio": list(memory) if memory else [None] * len(arm),
            "accuracy_delta_pp": deltas,
        },
        note=note,
    )


def batch_size_of(run: ArmResults) -> int:
    return int(run.hyperparameters["batch_size"])  # type: ignore[arg-type]


def group_name(run: ArmResults) -> str:
    name = group_label(run.model, batch_size_of(run))
    return name if run.world_size == 1 else f"{name} per process, {run.world_size} processes"


def arm_label(
    run: ArmResults, models_vary: bool, batch_sizes_vary: bool, world_sizes_vary: bool = False
) -> str:
    """An arm's name in a matrix: the precision, after what else varies (`vit-s b512 x8 bf16`:
    8 processes of batch 512); in the two-arm experiment just the precision."""
    parts = [run.model] if models_vary else []
    parts += [f"b{batch_size_of(run)}"] if batch_sizes_vary else []
    parts += [f"x{run.world_size}"] if world_sizes_vary else []
    return " ".join([*parts, run.precision.requested])


def scaling_rows(
    summaries: Mapping[str, ArmSummary], comparisons: Mapping[str, ArmComparison]
) -> list[ScalingRow]:
    """Each arm at each world size against its one-process self; empty where every arm ran
    at one world size (DEFINITIONS["Scaling efficiency"])."""
    if len({arm.per_seed[0].world_size for arm in summaries.values()}) < 2:
        return []
    single = {
        (arm.model, arm.batch_size, arm.precision.requested): arm.throughput_img_s.value
        for arm in summaries.values()
        if arm.per_seed[0].world_size == 1
    }
    rows = []
    for name, arm in summaries.items():
        world = arm.per_seed[0].world_size
        one = single.get((arm.model, arm.batch_size, arm.precision.requested))
        rows.append(
            ScalingRow(
                model=arm.model,
                per_rank_batch=arm.batch_size,
                precision=arm.precision.requested,
                world_size=world,
                arm=name,
                throughput_img_s=arm.throughput_img_s.value,
                scaling_efficiency=arm.throughput_img_s.value / (world * one) if one else None,
                speedup=comparisons[name].speedup.value if name in comparisons else None,
            )
        )
    return sorted(rows, key=lambda r: (r.model, r.per_rank_batch, r.world_size))


def best_per_model(
    summaries: Mapping[str, ArmSummary], comparisons: Mapping[str, ArmComparison]
) -> dict[str, str]:
    """Per model, the arm with the most training images/s whose accuracy is not
    significantly below its group's baseline (an interval wholly below 0 pp; with one seed
    there is no interval, and no arm is ruled out)."""
    best: dict[str, str] = {}
    for name, arm in summaries.items():
        this = comparisons.get(name)
        if (
            this is not None
            and this.accuracy_delta_pp.excludes(0.0)
            and (this.accuracy_delta_pp.value < 0)
        ):
            continue
        current = best.get(arm.model)
        if current is None or arm.throughput_img_s.value > (
            summaries[current].throughput_img_s.value
        ):
            best[arm.model] = name
    return best


def best_sentence(
    best: Mapping[str, str],
    summaries: Mapping[str, ArmSummary],
    comparisons: Mapping[str, ArmComparison],
) -> str:
    """`Fastest per model without a significant accuracy loss: resnet18: b512 bf16 (...)`."""
    parts = []
    for model, name in best.items():
        arm = summaries[name]
        text = f"{model}: {arm.precision.requested} at batch {arm.batch_size} "
        text += f"({arm.throughput_img_s.value:,.1f} images/s"
        if name in comparisons:
            text += f", {comparisons[name].speedup.value:.2f}x its {arm.baseline_arm} baseline"
        parts.append(text + ")")
    return "Fastest per model without a significant accuracy loss: " + "; ".join(parts) + "."


def above_chance(run: ArmResults) -> bool:
    """Whether the run's test accuracy is significantly above chance (binomial test). Each
    seed on its own: seeds share their test images, and one diverged seed must show."""
    from scipy import stats

    images = run.dataset.test_images
    correct = round(run.accuracy * images)
    chance = 1.0 / run.dataset.classes
    return bool(
        stats.binomtest(correct, images, chance, alternative="greater").pvalue < CHANCE_P_VALUE
    )


def published_differences(
    run: ArmResults, baseline: str, headline: str, arm_count: int = 2
) -> list[str]:
    """How our setup differs from the published run's (empty: a reproduction)."""
    found = [
        f"{key} {value_of(run)} (published: {PUBLISHED_VALUES[key]})"
        for key, value_of in PUBLISHED_SETUP.items()
        if value_of(run) != PUBLISHED_VALUES[key]
    ]
    published = " and ".join(PUBLISHED_ARMS)
    if arm_count > 2:
        found.append(f"a matrix of {arm_count} arms (published: {published})")
    elif (baseline, headline) != PUBLISHED_ARMS:
        found.append(f"arms {baseline} and {headline} (published: {published})")
    return found


def precision_label(precision: PrecisionRecord) -> str:
    """`AMP (fp16)`, `bf16 autocast (emulated)`, `strict FP32`: the registry's labels."""
    alias = ALIASES.get(precision.requested)
    if alias is not None:
        detail = [precision.resolved] + (["emulated"] if precision.emulated else [])
        return f"{alias.label} ({', '.join(detail)})"
    return ARMS[precision.resolved].label + (" (emulated)" if precision.emulated else "")


def _ci(estimate: Estimate, fmt: str, unit: str = "") -> str:
    if estimate.low is None or estimate.high is None:
        return ""
    return f"95 % CI {estimate.low:{fmt}}{unit}-{estimate.high:{fmt}}{unit}"


def verdict(comparison: ArmComparison, arm: ArmSummary, base: ArmSummary, at_chance: bool) -> str:
    """One sentence a person can act on, from the headline arm's figures."""
    run = arm.per_seed[0]
    against = precision_label(base.precision)
    speed = comparison.speedup
    ci = _ci(speed, ".2f", "x")
    if speed.excludes(1.0) is False:
        speed_text = (
            f"showed no significant difference in speed from {against} ({speed.value:.2f}x, {ci})"
        )
    elif speed.value >= 1:
        speed_text = f"trained {speed.value:.2f}x faster than {against}" + (
            f" ({ci})" if ci else ""
        )
    else:
        speed_text = (
            f"trained {1 / speed.value:.2f}x slower than {against} (speedup {speed.value:.2f}x"
            + (f", {ci})" if ci else ")")
        )
    memory = comparison.memory_ratio
    if memory is None:
        memory_text = "with training memory not comparable"
    elif memory.excludes(1.0) is False:
        memory_text = (
            f"with no significant difference in training memory ({memory.value:.2f}x, "
            f"{_ci(memory, '.2f', 'x')})"
        )
    else:
        ci = _ci(memory, ".2f", "x")
        memory_text = f"with {memory.value:.2f}x the training memory" + (f" ({ci})" if ci else "")
    delta = comparison.accuracy_delta_pp
    if at_chance:
        accuracy_text = "; accuracy at chance level: too short to judge accuracy"
    elif delta.excludes(0.0) is False:
        accuracy_text = (
            f" and no significant difference in accuracy ({delta.value:+.2f} pp, "
            f"{delta.low:+.2f}...{delta.high:+.2f})"
        )
    else:
        interval = f" ({delta.low:+.2f}...{delta.high:+.2f})" if delta.low is not None else ""
        accuracy_text = f" and {delta.value:+.2f} pp accuracy{interval}"
    sentence = (
        f"On {run.device.name} ({run.device.type}), {precision_label(arm.precision)} "
        f"{speed_text} {memory_text}{accuracy_text}."
    )
    if speed.n == 1:
        sentence += " One seed per arm: no intervals, so no claim of significance."
    return sentence


def compare_runs(
    runs: Sequence[ArmResults], baseline: str = BASELINE_PRECISION, allow_mismatch: bool = False
) -> Comparison:
    """An experiment matrix's runs (any models, batch sizes, precisions and seeds), each arm
    named by arm_label and compared within its (model, batch size) group."""
    if not runs:
        raise AmpbenchError("no training results to compare")
    models_vary = len({run.model for run in runs}) > 1
    batch_sizes_vary = len({batch_size_of(run) for run in runs}) > 1
    world_sizes_vary = len({run.world_size for run in runs}) > 1
    # The order of a matrix whatever the order the runs come in (KFP collects them as they
    # finish): models and precisions as first seen, batch sizes ascending, baselines first.
    models = list(dict.fromkeys(run.model for run in runs))
    precisions = list(dict.fromkeys(run.precision.requested for run in runs))
    runs = sorted(
        runs,
        key=lambda run: (
            models.index(run.model),
            batch_size_of(run),
            run.world_size,
            run.precision.requested != baseline,
            precisions.index(run.precision.requested),
        ),
    )
    arms: dict[str, list[ArmResults]] = {}
    for run in runs:
        label = arm_label(run, models_vary, batch_sizes_vary, world_sizes_vary)
        arms.setdefault(label, []).append(run)
    return compare_arms(arms, baseline, allow_mismatch, group_by=MATRIX_SETTINGS)


def compare_arms(
    arms: Mapping[str, Sequence[ArmResults]],
    baseline: str = BASELINE_PRECISION,
    allow_mismatch: bool = False,
    group_by: Sequence[str] = (),
) -> Comparison:
    """Every arm against its group's `baseline` precision; see the module docstring.

    group_by: the settings (of MATRIX_SETTINGS) that put arms into groups; without it all arms
    form one group and must agree in everything but precision and seed.
    """
    by_seed = {name: _by_seed(runs, name) for name, runs in arms.items()}
    found = differences(arms, group_by)
    if found and not allow_mismatch:
        raise AmpbenchError(
            f"the arms differ in more than precision: {'; '.join(found)}; refused, since the "
            "figures would not be precision's alone (--allow-mismatch compares them anyway)"
        )
    if group_by:
        group_of = {name: group_name(runs[0]) for name, runs in arms.items()}
    else:  # one group, which the check above has made the same model and batch size
        group_of = dict.fromkeys(arms, group_name(next(iter(arms.values()))[0]))
    groups = list(dict.fromkeys(group_of.values()))
    baseline_of: dict[str, str] = {}
    for group in groups:
        members = [name for name in arms if group_of[name] == group]
        bases = [name for name in members if arms[name][0].precision.requested == baseline]
        if not bases:
            where = f" in group {group}" if group_by else ""
            raise AmpbenchError(f"no results for the baseline arm '{baseline}'{where}")
        baseline_of.update(dict.fromkeys(members, bases[0]))
    if all(name == baseline_of[name] for name in arms):
        raise AmpbenchError(f"nothing to compare: only the baseline arm '{baseline}' has results")
    common = sorted(set.intersection(*(set(seeds) for seeds in by_seed.values())))
    if not common:
        listed = "; ".join(
            f"{name}: {', '.join(map(str, sorted(s)))}" for name, s in by_seed.items()
        )
        raise AmpbenchError(f"no seed that every arm ran ({listed}): nothing to pair")
    unpaired = {
        name: sorted(set(seeds) - set(common))
        for name, seeds in by_seed.items()
        if set(seeds) - set(common)
    }
    paired = {name: [seeds[s] for s in common] for name, seeds in by_seed.items()}
    summaries = {
        name: summarize(name, runs, group_of[name], baseline_of[name])
        for name, runs in paired.items()
    }
    comparisons = {
        name: pair(baseline_of[name], paired[baseline_of[name]], name, runs)
        for name, runs in paired.items()
        if name != baseline_of[name]
    }
    headline = next(iter(comparisons))
    headline_baseline = baseline_of[headline]
    at_chance_runs = [
        f"{name} seed {run.seed}"
        for name, runs in paired.items()
        for run in runs
        if not above_chance(run)
    ]
    at_chance = bool(at_chance_runs)
    resumed = [
        f"{name} seed {run.seed}"
        for name, runs in paired.items()
        for run in runs
        if run.resumed_from
    ]
    emulated = [name for name, summary in summaries.items() if summary.precision.emulated]
    first = paired[headline_baseline][0]
    warnings = []
    if found:
        warnings.append(
            f"Compared although the arms differ in more than precision (--allow-mismatch): "
            f"{'; '.join(found)}. The figures are not precision's alone."
        )
    for name in emulated:
        precision = summaries[name].precision
        warnings.append(
            f"Arm {name} ran {precision.resolved} EMULATED "
            f"({precision.support.removeprefix('EMULATED: ')}): its speed and memory measure "
            "the emulation, not mixed precision."
        )
    if resumed:
        warnings.append(
            f"Resumed from a checkpoint: {', '.join(resumed)}. Their training time adds up "
            "several processes, each with its own warm-up."
        )
    # Schema 2 measured as this one does (only its start-up is not recorded): no warning.
    if any(r.upgraded_from_schema == 1 for runs in paired.values() for r in runs):
        warnings.append(
            "Some results are of schema version 1 (an earlier "
            "ampbench, before its measurement protocol): their time holds the first epoch's "
            "one-time costs, their memory counts the data set and the model, and whether their "
            "precision was native was not recorded."
        )
    if unpaired:
        left_out = "; ".join(
            f"{name} seed {', '.join(map(str, s))}" for name, s in unpaired.items()
        )
        warnings.append(f"Left out, with no partner in every arm: {left_out}.")
    if at_chance:
        warnings.append(
            f"Accuracy is at chance level (1/{first.dataset.classes}) in "
            f"{', '.join(at_chance_runs)}: too short (or diverged) to judge accuracy."
        )
    missed = [
        f"{name} seed {run.seed}"
        for name, runs in paired.items()
        for run in runs
        if run.time_to_target and not run.time_to_target.reached
    ]
    if missed:
        target = first.time_to_target.target_accuracy if first.time_to_target else None
        warnings.append(
            f"Never reached the target accuracy {target}: {', '.join(missed)} (their time "
            "to target is left out, and so are their pairs in the time-to-target ratio)."
        )
    this = comparisons[headline]
    varying = {
        key: sorted({shared_settings(r)[key] for r in runs_of(paired)}, key=_natural)
        for key in group_by
    }
    settings = {
        key: value
        for key, value in shared_settings(first).items()
        if len(varying.get(key, ())) <= 1
    }
    settings.update(
        {f"{key}s": ", ".join(values) for key, values in varying.items() if len(values) > 1}
    )
    if len(varying.get("model", ())) <= 1:
        settings["parameters"] = f"{first.parameters:,}"
    settings.update(
        {
            "dataset source": first.dataset.source,
            "memory measured": first.memory.kind,
            "seeds": ", ".join(map(str, common)),
            "python": first.versions.python,
            "ampbench": first.versions.ampbench,
        }
    )
    best = best_per_model(summaries, comparisons)
    sentence = verdict(this, summaries[headline], summaries[headline_baseline], at_chance)
    if len(groups) > 1:
        sentence += " " + best_sentence(best, summaries, comparisons)
    return Comparison(
        schema_version=COMPARISON_SCHEMA_VERSION,
        baseline=baseline,
        headline_arm=headline,
        verdict=sentence,
        warnings=warnings,
        accuracy_at_chance=at_chance,
        settings=settings,
        arms=summaries,
        comparisons=comparisons,
        unpaired_seeds=unpaired,
        mismatches=found,
        resumed=resumed,
        emulated=emulated,
        published_differences=published_differences(first, baseline, headline, len(arms)),
        groups=groups,
        best_per_model=best,
        scaling=scaling_rows(summaries, comparisons),
        speedup=this.speedup.value,
        end_to_end_ratio=this.end_to_end_ratio.value,
        memory_ratio=this.memory_ratio.value if this.memory_ratio else None,
        accuracy_delta_pp=this.accuracy_delta_pp.value,
    )


def _natural(value: str) -> tuple[int, str]:
    """Numbers by value (batch 64 before 512), then text."""
    return (int(value), "") if value.isdigit() else (2**62, value)


def runs_of(arms: Mapping[str, Sequence[ArmResults]]) -> list[ArmResults]:
    return [run for runs in arms.values() for run in runs]
