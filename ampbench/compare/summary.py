"""Each arm over its seeds: means with intervals, where its time went, and across arms the
scaling table and the fastest arm per model."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from statistics import fmean

from ampbench.compare.stats import mean_estimate
from ampbench.comparison import (
    ArmComparison,
    ArmSummary,
    CostSummary,
    EnergySummary,
    Estimate,
    Prices,
    ScalingRow,
    TimeSpent,
)
from ampbench.results import ArmResults


def batch_size_of(run: ArmResults) -> int:
    return int(run.hyperparameters["batch_size"])  # type: ignore[arg-type]


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
    cached = [run.timing.compile_cache for run in runs]
    return TimeSpent(
        startup_s=fmean([s.total_s for s in known]) if known else None,
        imports_s=fmean([s.imports_s for s in known]) if known else None,
        state_s=fmean([s.state_s for s in known]) if known else None,
        warmup_s=fmean([run.timing.warmup_s for run in runs]),
        compile_s=fmean([run.timing.compile_s for run in runs]),
        compile_cache_hits=cached.count("hit"),
        compile_cache_misses=cached.count("miss"),
        seeds=len(runs),
        train_s=fmean([run.timing.train_time_s for run in runs]),
        eval_s=fmean([run.timing.eval_s for run in runs]),
        checkpoint_s=fmean([run.timing.checkpoint_s for run in runs]),
    )


J_PER_KWH = 3.6e6


def measured_energy(runs: Sequence[ArmResults]) -> bool:
    """Whether every seed has an energy figure (a mean over some would pass for all)."""
    return all(run.energy is not None and run.energy.train_j is not None for run in runs)


def energy_summary(runs: Sequence[ArmResults]) -> EnergySummary | None:
    if not measured_energy(runs):
        return None
    energies = [run.energy for run in runs if run.energy is not None]
    return EnergySummary(
        counter=str(energies[0].counter),
        train_j=mean_estimate([float(e.train_j) for e in energies]),  # type: ignore[arg-type]
        end_to_end_j=mean_estimate([float(e.end_to_end_j) for e in energies]),  # type: ignore[arg-type]
        j_per_image=mean_estimate([float(e.j_per_image) for e in energies]),  # type: ignore[arg-type]
        reliable=all(e.reliable for e in energies),
    )


def energy_unavailable(runs: Sequence[ArmResults]) -> str | None:
    """Why a seed has no energy figure: its own words, or that it was not recorded."""
    for run in runs:
        if run.energy is None:
            return "energy not recorded by the ampbench that trained it"
        if run.energy.unavailable:
            return run.energy.unavailable
    return None


def run_cost(run: ArmResults, prices: Prices) -> tuple[float, float] | None:
    """(training, end-to-end) cost of one run at `prices` (DEFINITIONS["Cost"]); None where
    nothing it has can be priced."""
    energy = run.energy if run.energy is not None and run.energy.train_j is not None else None
    if prices.device_hour is None and (prices.kwh is None or energy is None):
        return None
    costs = []
    for seconds, joules in (
        (run.timing.train_time_s, energy.train_j if energy else None),
        (run.timing.end_to_end_s, energy.end_to_end_j if energy else None),
    ):
        cost = (prices.device_hour or 0.0) * run.world_size * seconds / 3600.0
        if prices.kwh is not None and joules is not None:
            cost += prices.kwh * joules / J_PER_KWH
        costs.append(cost)
    return costs[0], costs[1]


def cost_summary(runs: Sequence[ArmResults], prices: Prices | None) -> CostSummary | None:
    if prices is None:
        return None
    costs = [run_cost(run, prices) for run in runs]
    if any(cost is None for cost in costs):
        return None
    known = [cost for cost in costs if cost is not None]
    return CostSummary(
        train=mean_estimate([cost[0] for cost in known]),
        end_to_end=mean_estimate([cost[1] for cost in known]),
        energy_included=prices.kwh is None or measured_energy(runs),
    )


def summarize(
    name: str,
    runs: Sequence[ArmResults],
    group: str,
    baseline_arm: str,
    prices: Prices | None = None,
) -> ArmSummary:
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
        energy=energy_summary(runs),
        energy_unavailable=energy_unavailable(runs),
        cost=cost_summary(runs, prices),
    )


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
