"""The comparison's words: how an arm's precision is named, the verdict sentence, the fastest
arm per model, and the warnings printed in front of the figures."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ampbench.comparison import ArmComparison, ArmSummary, Estimate, Finding, Prices
from ampbench.results import ArmResults, PrecisionRecord
from ampbench.train.precisions import ALIASES, ARMS


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


def precision_label(precision: PrecisionRecord) -> str:
    """`AMP (fp16)`, `bf16 autocast (emulated)`, `strict FP32`: the registry's labels."""
    alias = ALIASES.get(precision.requested)
    if alias is not None:
        detail = [precision.resolved] + (["emulated"] if precision.emulated else [])
        return f"{alias.label} ({', '.join(detail)})"
    return ARMS[precision.resolved].label + (" (emulated)" if precision.emulated else "")


def interval(estimate: Estimate | None, fmt: str, unit: str = "") -> str:
    """`95% CI 1.10x to 1.30x`: how the verdict and the report write every interval; "" where
    there is none (one seed)."""
    if estimate is None or estimate.low is None or estimate.high is None:
        return ""
    return f"95% CI {estimate.low:{fmt}}{unit} to {estimate.high:{fmt}}{unit}"


def amount(value: float) -> str:
    """A sum of money in the prices' unit, three significant digits, never in e-notation."""
    if value == 0:
        return "0"
    digits = max(2, 2 - math.floor(math.log10(abs(value))))
    return f"{value:,.{digits}f}"


def prices_text(prices: Prices) -> str:
    """`2.5 per device-hour and 0.3 per kWh`: what the costs are priced at."""
    parts = [f"{prices.device_hour:g} per device-hour"] if prices.device_hour is not None else []
    parts += [f"{prices.kwh:g} per kWh"] if prices.kwh is not None else []
    return " and ".join(parts)


def saving_text(saved: Estimate) -> str:
    """`saves 0.00694 per run (6.94 per 1,000 runs; 95% CI ...)`, or `costs ... more`."""
    figure = abs(saved.value)
    text = (
        f"saves {amount(figure)} per run"
        if saved.value >= 0
        else (f"costs {amount(figure)} more per run")
    )
    text += f" ({amount(1000 * figure)} per 1,000 runs"
    if saved.low is not None and saved.high is not None:
        text += f"; saved per run, 95% CI {amount(saved.low)} to {amount(saved.high)}"
    return text + ")"


def cost_sentence(comparison: ArmComparison, prices: Prices | None) -> str:
    """What the arm saves against its baseline at the given prices; "" without a price."""
    if prices is None or comparison.cost_saved is None:
        return ""
    return (
        f" At {prices_text(prices)}, {comparison.arm} {saving_text(comparison.cost_saved)} "
        f"against {comparison.baseline} in training time."
    )


def verdict(
    comparison: ArmComparison,
    arm: ArmSummary,
    base: ArmSummary,
    at_chance: bool,
    prices: Prices | None = None,
    why: Sequence[Finding] = (),
) -> str:
    """One sentence a person can act on, from the headline arm's figures (and what it saves,
    where a price is given); a claim that a finding of compare/why.py qualifies is made with
    the finding beside it."""
    qualified = {f.qualifies: f.sentence for f in why if f.qualifies is not None}
    run = arm.per_seed[0]
    against = precision_label(base.precision)
    speed = comparison.speedup
    ci = interval(speed, ".2f", "x")
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
            f"{interval(memory, '.2f', 'x')})"
        )
    else:
        ci = interval(memory, ".2f", "x")
        memory_text = f"with {memory.value:.2f}x the training memory" + (f" ({ci})" if ci else "")
    delta = comparison.accuracy_delta_pp
    if at_chance:
        accuracy_text = "; accuracy at chance level: too short to judge accuracy"
    elif delta.excludes(0.0) is False:
        accuracy_text = (
            f" and no significant difference in accuracy ({delta.value:+.2f} pp, "
            f"{interval(delta, '+.2f', ' pp')})"
        )
    else:
        ci = interval(delta, "+.2f", " pp")
        accuracy_text = f" and {delta.value:+.2f} pp accuracy" + (f" ({ci})" if ci else "")
    sentence = (
        f"On {run.device.name} ({run.device.type}), {precision_label(arm.precision)} "
        f"{speed_text} {memory_text}{accuracy_text}."
    )
    if "speed" in qualified:
        sentence += f" Not a speed figure: {qualified['speed']}."
    if "accuracy" in qualified and not at_chance:
        sentence += f" Not an accuracy figure: {qualified['accuracy']}."
    sentence += cost_sentence(comparison, prices)
    if speed.n == 1:
        sentence += " One seed per arm: no intervals, so no claim of significance."
    return sentence


@dataclass(frozen=True)
class Notes:
    """What a reader must know before reading the figures, as lists of `arm seed N`."""

    found: list[str]  # differences beyond precision, compared under --allow-mismatch
    emulated: list[str]
    emulated_support: dict[str, str]
    resumed: list[str]
    schema_1: bool
    unpaired: dict[str, list[int]]
    at_chance: list[str]
    classes: int  # chance is 1/classes, as in the headline's baseline
    missed_target: list[str]
    target_accuracy: float | None  # the target the runs in missed_target missed
    # Runs that fetched their compiled step, where the arms did not all fetch as many.
    fetched_compiled: list[str]

    @classmethod
    def of(
        cls,
        paired: Mapping[str, Sequence[ArmResults]],
        first: ArmResults,
        summaries: Mapping[str, ArmSummary],
        found: list[str],
        unpaired: dict[str, list[int]],
        above_chance: Callable[[ArmResults], bool],
    ) -> Notes:
        runs = [(name, run) for name, arm_runs in paired.items() for run in arm_runs]

        def runs_where(keep: Callable[[ArmResults], object]) -> list[str]:
            return [f"{name} seed {run.seed}" for name, run in runs if keep(run)]

        missed = [
            run.time_to_target
            for _, run in runs
            if run.time_to_target is not None and not run.time_to_target.reached
        ]

        emulated = [name for name, summary in summaries.items() if summary.precision.emulated]
        fetched = {sum(r.timing.compile_cache == "hit" for r in rs) for rs in paired.values()}
        return cls(
            found=found,
            emulated=emulated,
            emulated_support={
                name: f"{summaries[name].precision.resolved} EMULATED "
                f"({summaries[name].precision.support.removeprefix('EMULATED: ')})"
                for name in emulated
            },
            resumed=runs_where(lambda run: run.resumed_from),
            # Schema 2 measured as this one does (only its start-up is not recorded).
            schema_1=any(run.upgraded_from_schema == 1 for _, run in runs),
            unpaired=unpaired,
            at_chance=runs_where(lambda run: not above_chance(run)),
            classes=first.dataset.classes,
            missed_target=runs_where(lambda run: run.time_to_target in missed),
            target_accuracy=missed[0].target_accuracy if missed else None,
            fetched_compiled=runs_where(lambda run: run.timing.compile_cache == "hit")
            if len(fetched) > 1
            else [],
        )

    def warnings(self) -> list[str]:
        """The warnings, in the order the report prints them."""
        warnings = []
        if self.found:
            warnings.append(
                f"Compared although the arms differ in more than precision (--allow-mismatch): "
                f"{'; '.join(self.found)}. The figures are not precision's alone."
            )
        for name in self.emulated:
            warnings.append(
                f"Arm {name} ran {self.emulated_support[name]}: its speed and memory measure "
                "the emulation, not mixed precision."
            )
        if self.resumed:
            warnings.append(
                f"Resumed from a checkpoint: {', '.join(self.resumed)}. Their training time "
                "adds up several processes, each with its own warm-up."
            )
        if self.schema_1:
            warnings.append(
                "Some results are of schema version 1 (an earlier "
                "ampbench, before its measurement protocol): their time holds the first epoch's "
                "one-time costs, their memory counts the data set and the model, and whether "
                "their precision was native was not recorded."
            )
        if self.unpaired:
            left_out = "; ".join(
                f"{name} seed {', '.join(map(str, s))}" for name, s in self.unpaired.items()
            )
            warnings.append(f"Left out, with no partner in every arm: {left_out}.")
        if self.at_chance:
            warnings.append(
                f"Accuracy is at chance level (1/{self.classes}) in "
                f"{', '.join(self.at_chance)}: too short (or diverged) to judge accuracy."
            )
        if self.missed_target:
            warnings.append(
                f"Never reached the target accuracy {self.target_accuracy}: "
                f"{', '.join(self.missed_target)} (their time to target is left out, and so are "
                "their pairs in the time-to-target ratio)."
            )
        if self.fetched_compiled:
            warnings.append(
                f"Fetched the compiled step from the compile cache: "
                f"{', '.join(self.fetched_compiled)}; the other runs compiled theirs. Warm-up "
                "and end-to-end times differ by that as well as by precision (training time "
                "and throughput do not include it)."
            )
        return warnings
