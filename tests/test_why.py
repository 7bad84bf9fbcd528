"""The table of why-rules: each rule fires on figures that trigger it and stays silent on
figures that don't; the verdict does not make a claim a rule qualifies on its own."""

from __future__ import annotations

import pytest
from arms import arm_result, with_

from ampbench.compare.analysis import compare_arms
from ampbench.compare.report import render_text
from ampbench.compare.why import MIN_TIMED_S, MIN_TIMED_STEPS, RULES
from ampbench.results import ArmResults, OpTime, Profile


def pair(fp32: list[ArmResults], amp: list[ArmResults], baseline: str = "fp32") -> list[str]:
    """The rules that fire for the second arm against the first."""
    names = [arm[0].precision.requested for arm in (fp32, amp)]
    comparison = compare_arms(dict(zip(names, (fp32, amp), strict=True)), baseline=baseline)
    return [finding.rule for finding in comparison.why[names[1]]]


def runs(precision: str, seeds: int = 2, **changes: object) -> list[ArmResults]:
    return [
        with_(arm_result(precision, seed, 0.70, 3000.0, 100.0), **changes) for seed in range(seeds)
    ]


def test_every_rule_is_tested_here() -> None:
    assert [rule.name for rule in RULES] == [
        "short timed window",
        "accuracy the test set cannot resolve",
        "launch- or host-bound",
        "time outside matmul and convolution",
        "low autocast coverage",
        "emulated precision",
        "baseline not strict FP32",
    ]


def test_long_runs_of_native_precisions_trigger_nothing() -> None:
    assert pair(runs("fp32"), runs("amp")) == []


@pytest.mark.parametrize(
    ("changes", "fires"),
    [
        ({"timing__trained_images": 128 * (MIN_TIMED_STEPS - 1)}, True),  # too few steps
        ({"timing__trained_images": 128 * MIN_TIMED_STEPS}, False),
        ({"timing__train_time_s": MIN_TIMED_S * 0.9}, True),  # too few seconds
        ({"timing__train_time_s": MIN_TIMED_S}, False),
    ],
)
def test_a_short_timed_window_qualifies_the_speed(changes: dict, fires: bool) -> None:
    found = pair(runs("fp32"), runs("amp", **changes))
    assert ("short timed window" in found) is fires
    # The baseline's window counts as much as the arm's.
    assert ("short timed window" in pair(runs("fp32", **changes), runs("amp"))) is fires


def test_the_verdict_says_a_short_window_is_not_a_speed_figure() -> None:
    short = {"timing__trained_images": 128 * 3, "timing__train_time_s": 0.02}
    comparison = compare_arms({"fp32": runs("fp32"), "amp": runs("amp", **short)})
    assert "Not a speed figure: its speed is from as few as 3 timed steps in 0.02 s" in (
        comparison.verdict
    )
    assert "Why, amp: Its speed is from as few as 3 timed steps" in render_text(comparison)


def one_seed(precision: str, accuracy: float, test_images: int) -> list[ArmResults]:
    run = arm_result(precision, 0, accuracy, 3000.0, 100.0)
    return [with_(run, dataset__test_images=test_images)]


def test_an_accuracy_delta_the_test_set_cannot_resolve_is_qualified() -> None:
    """+33 pp from 30 test images and one seed: the binomial intervals overlap."""
    found = compare_arms({"fp32": one_seed("fp32", 0.4, 30), "amp": one_seed("amp", 0.7333, 30)})
    assert [f.rule for f in found.why["amp"]] == ["accuracy the test set cannot resolve"]
    assert "Not an accuracy figure: 30 test images cannot resolve" in found.verdict
    # The same delta on 10,000 images is resolved; with two seeds their interval says it.
    resolved = compare_arms(
        {"fp32": one_seed("fp32", 0.4, 10_000), "amp": one_seed("amp", 0.7333, 10_000)}
    )
    assert resolved.why["amp"] == []
    assert "accuracy the test set" not in pair(
        runs("fp32", dataset__test_images=30), runs("amp", dataset__test_images=30)
    )


def profiled(busy: float = 0.95, matmul: float = 0.8, coverage: float | None = 1.0) -> Profile:
    return Profile(
        steps=20,
        replayed=False,
        wall_ms_per_step=10.0,
        device_busy_share=busy,
        matmul_conv_share=matmul,
        tensor_core_share=None,
        top_ops=[OpTime("aten::add_", 2.0, 0.2)],
        flops_by_dtype={"float16": 90, "float32": 10},
        low_precision_flop_share=coverage,
        fp32_layers=["fc", "features.0"] if coverage is not None and coverage < 1 else [],
        trace=None,
    )


@pytest.mark.parametrize(
    ("profile", "rule", "fires"),
    [
        (profiled(busy=0.5), "launch- or host-bound", True),
        (profiled(busy=0.8), "launch- or host-bound", False),
        (profiled(matmul=0.3), "time outside matmul and convolution", True),
        (profiled(matmul=0.5), "time outside matmul and convolution", False),
        (profiled(coverage=0.6), "low autocast coverage", True),
        (profiled(coverage=0.9), "low autocast coverage", False),
        (profiled(coverage=None), "low autocast coverage", False),
    ],
)
def test_the_profile_s_rules(profile: Profile, rule: str, fires: bool) -> None:
    found = pair(runs("fp32"), runs("amp", profile=profile))
    assert (rule in found) is fires
    assert len(found) == int(fires)  # the other rules stay silent on these figures


def test_low_coverage_names_the_layers_left_in_fp32() -> None:
    comparison = compare_arms(
        {"fp32": runs("fp32"), "amp": runs("amp", profile=profiled(coverage=0.6))}
    )
    (finding,) = comparison.why["amp"]
    assert finding.sentence == (
        "autocast ran only 60% of its matmul and convolution FLOPs in float16; layers left in "
        "fp32: fc, features.0"
    )


def test_an_emulated_arm_is_named() -> None:
    emulated = [with_(run, precision__emulated=True) for run in runs("amp")]
    assert pair(runs("fp32"), emulated) == ["emulated precision"]


def test_a_baseline_that_is_not_strict_fp32_is_named() -> None:
    assert pair(runs("tf32"), runs("amp"), baseline="tf32") == ["baseline not strict FP32"]
