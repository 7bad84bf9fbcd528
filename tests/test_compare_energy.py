"""Energy and cost in the comparison: the energy ratio is J/image's, per seed; an absent figure
says why; each arm's cost is its device-hours and kWh at the prices given, what it saves is the
baseline's cost less its own, and the verdict names it; no price, no cost."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from arms import arm_result, with_

from ampbench.compare.analysis import compare_arms
from ampbench.compare.report import render_markdown, render_text
from ampbench.comparison import Prices
from ampbench.results import ArmResults, Energy

NO_COUNTER = "no energy counter on this device (no readable RAPL zone in /x)"


def with_energy(run: ArmResults, train_j: float, end_to_end_j: float) -> ArmResults:
    images = run.timing.trained_images
    return with_(run, energy=Energy("nvml", None, train_j, end_to_end_j, train_j / images, True, 1))


def arms(energy: bool = True) -> dict[str, list[ArmResults]]:
    """Two seeds: fp32 trains 100 s on 40 kJ, amp 50 s on 16 kJ and 24 kJ."""
    fp32 = [arm_result("fp32", seed, 0.70, 3000.0, 100.0) for seed in (0, 1)]
    amp = [arm_result("amp", seed, 0.70, 1500.0, 50.0) for seed in (0, 1)]
    if not energy:
        return {"fp32": fp32, "amp": amp}
    return {
        "fp32": [with_energy(run, 40_000.0, 60_000.0) for run in fp32],
        "amp": [
            with_energy(amp[0], 16_000.0, 30_000.0),
            with_energy(amp[1], 24_000.0, 38_000.0),
        ],
    }


def test_the_energy_ratio_is_j_per_image_per_seed() -> None:
    comparison = compare_arms(arms())
    ratio = comparison.comparisons["amp"].energy_ratio
    assert ratio is not None
    assert ratio.value == pytest.approx(math.sqrt(0.4 * 0.6))  # geometric mean of 0.4, 0.6
    assert ratio.low is not None and ratio.low < ratio.value < ratio.high  # type: ignore[operator]
    energy = comparison.arms["amp"].energy
    assert energy is not None and energy.train_j.value == pytest.approx(20_000.0)
    text = render_text(comparison)
    assert "Energy (training, nvml): fp32 40,000.0 J" in text
    assert f"energy ratio (J/image, amp / fp32): {ratio.value:.2f}x (95% CI" in text
    assert "UNRELIABLE" not in text
    assert "| energy ratio |" in render_markdown(comparison)


def test_an_unreliable_window_is_labelled_not_hidden() -> None:
    runs = arms()
    runs["amp"][0] = with_(runs["amp"][0], energy__reliable=False)
    text = render_text(compare_arms(runs))
    assert "Energy (training, nvml): fp32" in text
    assert "UNRELIABLE: a timed window shorter than the counter resolves" in text


def test_absent_energy_says_why() -> None:
    runs = arms(energy=False)
    absent = Energy(None, NO_COUNTER, None, None, None, None, 0)
    runs = {name: [with_(run, energy=absent) for run in arm] for name, arm in runs.items()}
    comparison = compare_arms(runs)
    assert comparison.comparisons["amp"].energy_ratio is None
    assert f"Energy: not measured: {NO_COUNTER}" in render_text(comparison)
    # Results written before energy existed say so.
    assert "Energy: not measured: energy not recorded" in render_text(compare_arms(arms(False)))


def test_the_cost_is_device_hours_and_energy_at_the_prices() -> None:
    prices = Prices(device_hour=2.5, kwh=0.3)
    comparison = compare_arms(arms(), prices=prices)
    fp32 = 2.5 * 100 / 3600 + 0.3 * 40_000 / 3.6e6
    amp_seeds = [2.5 * 50 / 3600 + 0.3 * j / 3.6e6 for j in (16_000, 24_000)]
    cost = comparison.arms["fp32"].cost
    assert cost is not None and cost.train.value == pytest.approx(fp32)
    assert cost.end_to_end.value == pytest.approx(2.5 * 110 / 3600 + 0.3 * 60_000 / 3.6e6)
    saved = comparison.comparisons["amp"].cost_saved
    assert saved is not None
    assert saved.value == pytest.approx(fp32 - sum(amp_seeds) / 2)
    assert "At 2.5 per device-hour and 0.3 per kWh, amp saves" in comparison.verdict
    assert f"({1000 * saved.value:,.2f} per 1,000 runs" in comparison.verdict
    text = render_text(comparison)
    assert "Cost, fp32 (at 2.5 per device-hour and 0.3 per kWh): 0.0728 per run" in text
    assert "Cost, amp (at" in text and "against fp32" in text


def test_an_arm_that_costs_more_says_so() -> None:
    slower = {
        "fp32": [arm_result("fp32", seed, 0.70, 3000.0, 100.0) for seed in (0, 1)],
        "amp": [arm_result("amp", seed, 0.70, 1500.0, 200.0) for seed in (0, 1)],
    }
    comparison = compare_arms(slower, prices=Prices(2.5, None))
    assert "amp costs 0.0694 more per run (69.44 per 1,000 runs" in comparison.verdict


def test_a_price_for_energy_not_measured_prices_the_device_hours_alone() -> None:
    comparison = compare_arms(arms(energy=False), prices=Prices(2.5, 0.3))
    cost = comparison.arms["fp32"].cost
    assert cost is not None and not cost.energy_included
    assert cost.train.value == pytest.approx(2.5 * 100 / 3600)
    assert "energy not measured: the device-hours only" in render_text(comparison)
    # An energy price alone, and no energy: nothing to price, and the line says so.
    alone = compare_arms(arms(energy=False), prices=Prices(None, 0.3))
    assert alone.arms["fp32"].cost is None
    assert "Cost, fp32: not given" in render_text(alone)


def test_no_price_no_cost() -> None:
    comparison = compare_arms(arms())
    assert comparison.prices is None
    assert comparison.arms["amp"].cost is None
    assert "Cost" not in render_text(comparison)
    assert "per device-hour" not in comparison.verdict
    assert Prices.given(0.0, 0.0) is None
    assert Prices.given(2.5, 0.0) == Prices(2.5, None)


def test_a_negative_price_is_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ampbench.cli", "run", "--gpu-hour-price", "-1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "--gpu-hour-price" in done.stderr
    assert "Traceback" not in done.stderr
