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

import re
from collections.abc import Callable, Mapping, Sequence

from ampbench.compare.published import published_differences, unlike_published
from ampbench.compare.stats import mean_estimate, ratio_estimate
from ampbench.compare.summary import (
    batch_size_of,
    best_per_model,
    measured_energy,
    run_cost,
    scaling_rows,
    summarize,
)
from ampbench.compare.why import findings
from ampbench.compare.wording import Notes, best_sentence, verdict
from ampbench.comparison import (
    COMPARISON_SCHEMA_VERSION,
    ArmComparison,
    Comparison,
    Estimate,
    Prices,
)
from ampbench.errors import AmpbenchError
from ampbench.matrix import group_label
from ampbench.results import ArmResults
from ampbench.settings import described
from ampbench.train.config import TrainConfig
from ampbench.train.precisions import BASELINE_PRECISION

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


def _zero_means() -> dict[str, str]:
    """What 0 means for each training setting whose description says ("(0: off; ...)"), so
    that a setting that is off reads "off", not 0."""
    found = {}
    for each in described(TrainConfig):
        meaning = re.search(r"\(0: ([^;,)]+)", each.description)
        if meaning and not each.default:
            found[each.name] = meaning[1]
    return found


ZERO_MEANS = _zero_means()


def shared_settings(run: ArmResults) -> dict[str, str]:
    settings = {name: str(value_of(run)) for name, value_of in SHARED.items()}
    for key, value in run.hyperparameters.items():
        if key not in FREE_HYPERPARAMETERS:
            shown = ZERO_MEANS[key] if key in ZERO_MEANS and not value else str(value)
            settings[key.replace("_", " ")] = shown
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


def _memory_ratios(
    pairs: Sequence[tuple[ArmResults, ArmResults]], peak: Callable[[ArmResults], float]
) -> list[float] | None:
    """Per-seed ratios, or None if any peak is zero: a ratio over some seeds only would
    pass for one over all of them."""
    if all(peak(b) > 0 and peak(a) > 0 for b, a in pairs):
        return [peak(a) / peak(b) for b, a in pairs]
    return None


def _energy_ratios(pairs: Sequence[tuple[ArmResults, ArmResults]]) -> list[float] | None:
    """Per-seed J/image ratios, arm over baseline, where every run of both measured it."""
    if not measured_energy([run for both in pairs for run in both]):
        return None
    per_image = [
        (b.energy.j_per_image, a.energy.j_per_image)  # type: ignore[union-attr]
        for b, a in pairs
    ]
    if not all(b and a and b > 0 and a > 0 for b, a in per_image):
        return None
    return [a / b for b, a in per_image]  # type: ignore[operator]


def _costs_saved(
    pairs: Sequence[tuple[ArmResults, ArmResults]], prices: Prices | None
) -> tuple[Estimate | None, Estimate | None]:
    """The baseline's cost minus the arm's, per seed, over training and end to end."""
    if prices is None:
        return None, None
    costs = [(run_cost(b, prices), run_cost(a, prices)) for b, a in pairs]
    if any(b is None or a is None for b, a in costs):
        return None, None
    train = [b[0] - a[0] for b, a in costs]  # type: ignore[index]
    end_to_end = [b[1] - a[1] for b, a in costs]  # type: ignore[index]
    return mean_estimate(train), mean_estimate(end_to_end)


def pair(
    baseline: str,
    base: Sequence[ArmResults],
    name: str,
    arm: Sequence[ArmResults],
    prices: Prices | None = None,
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
    energy = _energy_ratios(pairs)
    cost_saved, end_to_end_cost_saved = _costs_saved(pairs, prices)
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
            "accuracy_delta_pp": list(deltas),
        },
        note=note,
        energy_ratio=ratio_estimate(energy) if energy else None,
        cost_saved=cost_saved,
        end_to_end_cost_saved=end_to_end_cost_saved,
    )


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


def compare_runs(
    runs: Sequence[ArmResults],
    baseline: str = BASELINE_PRECISION,
    allow_mismatch: bool = False,
    prices: Prices | None = None,
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
    return compare_arms(arms, baseline, allow_mismatch, group_by=MATRIX_SETTINGS, prices=prices)


def _differences_allowed(
    arms: Mapping[str, Sequence[ArmResults]], group_by: Sequence[str], allow_mismatch: bool
) -> list[str]:
    """How the arms differ beyond precision, seed and group_by; refused unless allowed."""
    found = differences(arms, group_by)
    if found and not allow_mismatch:
        raise AmpbenchError(
            f"the arms differ in more than precision: {'; '.join(found)}; refused, since the "
            "figures would not be precision's alone (--allow-mismatch compares them anyway)"
        )
    return found


def compare_arms(
    arms: Mapping[str, Sequence[ArmResults]],
    baseline: str = BASELINE_PRECISION,
    allow_mismatch: bool = False,
    group_by: Sequence[str] = (),
    prices: Prices | None = None,
) -> Comparison:
    """Every arm against its group's `baseline` precision; see the module docstring.

    group_by: the settings (of MATRIX_SETTINGS) that put arms into groups; without it all arms
    form one group and must agree in everything but precision and seed. prices: what the cost
    figures are priced at (None: no cost figures).
    """
    found = _differences_allowed(arms, group_by, allow_mismatch)
    group_of, baseline_of = _baselines(arms, baseline, group_by)
    common, paired, unpaired = _paired_seeds(arms)
    summaries = {
        name: summarize(name, runs, group_of[name], baseline_of[name], prices)
        for name, runs in paired.items()
    }
    comparisons = {
        name: pair(baseline_of[name], paired[baseline_of[name]], name, runs, prices)
        for name, runs in paired.items()
        if name != baseline_of[name]
    }
    headline = next(iter(comparisons))
    first = paired[baseline_of[headline]][0]
    notes = Notes.of(paired, first, summaries, found, unpaired, above_chance)
    groups = list(dict.fromkeys(group_of.values()))
    best = best_per_model(summaries, comparisons)
    at_chance = bool(notes.at_chance)
    this = comparisons[headline]
    why = {
        name: findings(summaries[name], summaries[this_arm.baseline], this_arm)
        for name, this_arm in comparisons.items()
    }
    sentence = verdict(
        this,
        summaries[headline],
        summaries[baseline_of[headline]],
        at_chance,
        prices,
        why[headline],
    )
    if len(groups) > 1:
        sentence += " " + best_sentence(best, summaries, comparisons)
    return Comparison(
        schema_version=COMPARISON_SCHEMA_VERSION,
        baseline=baseline,
        headline_arm=headline,
        verdict=sentence,
        warnings=notes.warnings(),
        accuracy_at_chance=at_chance,
        settings=_settings(first, paired, group_by, common),
        arms=summaries,
        comparisons=comparisons,
        unpaired_seeds=unpaired,
        mismatches=found,
        resumed=notes.resumed,
        emulated=notes.emulated,
        published_differences=published_differences(first, baseline, headline, len(arms)),
        unlike_published=unlike_published(first),
        groups=groups,
        best_per_model=best,
        scaling=scaling_rows(summaries, comparisons),
        prices=prices,
        why=why,
        speedup=this.speedup.value,
        end_to_end_ratio=this.end_to_end_ratio.value,
        memory_ratio=this.memory_ratio.value if this.memory_ratio else None,
        accuracy_delta_pp=this.accuracy_delta_pp.value,
    )


def _baselines(
    arms: Mapping[str, Sequence[ArmResults]], baseline: str, group_by: Sequence[str]
) -> tuple[dict[str, str], dict[str, str]]:
    """Each arm's group, and its group's baseline arm; refused where a group has none, or
    where no arm has a baseline to be compared with."""
    if group_by:
        group_of = {name: group_name(runs[0]) for name, runs in arms.items()}
    else:  # one group, which differences() has made the same model and batch size
        group_of = dict.fromkeys(arms, group_name(next(iter(arms.values()))[0]))
    baseline_of: dict[str, str] = {}
    for group in dict.fromkeys(group_of.values()):
        members = [name for name in arms if group_of[name] == group]
        bases = [name for name in members if arms[name][0].precision.requested == baseline]
        if not bases:
            where = f" in group {group}" if group_by else ""
            raise AmpbenchError(f"no results for the baseline arm '{baseline}'{where}")
        baseline_of.update(dict.fromkeys(members, bases[0]))
    if all(name == baseline_of[name] for name in arms):
        raise AmpbenchError(f"nothing to compare: only the baseline arm '{baseline}' has results")
    return group_of, baseline_of


def _paired_seeds(
    arms: Mapping[str, Sequence[ArmResults]],
) -> tuple[list[int], dict[str, list[ArmResults]], dict[str, list[int]]]:
    """The seeds every arm ran; each arm's runs of those seeds, in that order; and the seeds
    each arm ran that some other arm did not (left out)."""
    by_seed = {name: _by_seed(runs, name) for name, runs in arms.items()}
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
    return common, paired, unpaired


def _settings(
    first: ArmResults,
    paired: Mapping[str, Sequence[ArmResults]],
    group_by: Sequence[str],
    common: Sequence[int],
) -> dict[str, str]:
    """What the compared runs share, and the values of each group setting that varies."""
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
            **(
                {"dataset cached from": first.dataset.cached_from}
                if first.dataset.cached_from
                else {}
            ),
            "memory measured": first.memory.kind,
            "seeds": ", ".join(map(str, common)),
            "python": first.versions.python,
            "ampbench": first.versions.ampbench,
        }
    )
    return settings


def _natural(value: str) -> tuple[int, str]:
    """Numbers by value (batch 64 before 512), then text."""
    return (int(value), "") if value.isdigit() else (2**62, value)


def runs_of(arms: Mapping[str, Sequence[ArmResults]]) -> list[ArmResults]:
    return [run for runs in arms.values() for run in runs]
