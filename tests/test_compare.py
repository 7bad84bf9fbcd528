"""The compare step for one pair of arms: paired seeds, ratio intervals centred on the figure
shown, comparisons of arms that differ in more than precision refused, the verdict."""

from __future__ import annotations

import math
from typing import Any

import pytest
from arms import T_975_DF2, arm_result, with_

from ampbench.compare.analysis import (
    compare_arms,
)
from ampbench.compare.published import PUBLISHED, published_differences
from ampbench.compare.report import render_markdown, render_text, results_block, tables
from ampbench.compare.stats import mean_estimate, ratio_estimate
from ampbench.compare.wording import precision_label
from ampbench.errors import AmpbenchError
from ampbench.results import PrecisionRecord
from ampbench.train import PRECISIONS

PUBLISHED_BLOCK = """===== RESULTS =====
FP32 Accuracy: 0.7114
FP32 Memory : 3219.65 MB
FP32 Time   : 309.41 sec

Mixed Accuracy: 0.6969
Mixed Memory  : 1916.57 MB
Mixed Time    : 252.56 sec"""


def test_results_block_matches_the_published_layout() -> None:
    assert results_block(PUBLISHED["fp32"], PUBLISHED["amp"]) == PUBLISHED_BLOCK


def test_single_seed_figures_follow_from_the_arms() -> None:
    comparison = compare_arms(
        {
            "fp32": [arm_result("fp32", 0, 0.70, 3000.0, 300.0)],
            "amp": [arm_result("amp", 0, 0.68, 1500.0, 120.0)],
        }
    )
    assert comparison.speedup == pytest.approx(2.5)
    assert comparison.end_to_end_ratio == pytest.approx(310.0 / 130.0)
    assert comparison.memory_ratio == pytest.approx(0.5)
    assert comparison.accuracy_delta_pp == pytest.approx(-2.0)
    assert comparison.arms["amp"].train_time_s.value == 120.0
    assert comparison.comparisons["amp"].speedup.low is None  # one seed: no interval
    text = render_text(comparison)
    assert "FP32 Time   : 300.00 sec" in text
    assert "Mixed Memory  : 1500.00 MB" in text
    assert "Steady-state speedup (images/s, amp / fp32): 2.50x\n" in text
    assert "Accuracy delta (amp - fp32): -2.00 pp" in text
    assert "One seed per arm: no intervals" in comparison.verdict
    assert (
        "Time spent, amp: start-up 6.00 s (imports and device 4.00, data and model 2.00), "
        "warm-up 5.00 s, training 120.00 s, evaluation 5.00 s\n" in text
    )


@pytest.mark.parametrize(
    ("outcomes", "said"),
    [
        ((None, None), " (compilation 2.00)"),
        (("miss", "miss"), " (compilation 2.00, compiled: a compile cache miss)"),
        (("hit", "hit"), " (compilation 2.00, fetched from the compile cache)"),
        (("miss", "hit"), " (compilation 2.00, fetched from the compile cache in 1 of 2 seeds)"),
        ((None, "hit"), " (compilation 2.00, fetched from the compile cache in 1 of 2 seeds)"),
    ],
)
def test_time_spent_says_whether_the_compiled_step_came_from_the_compile_cache(
    outcomes: tuple[str | None, str | None], said: str
) -> None:
    """A compilation time means compiling or fetching what another process compiled: the
    footer says which, per arm over its seeds."""
    fp32 = [arm_result("fp32", seed, 0.70, 3000.0, 300.0) for seed in (0, 1)]
    amp = [
        with_(arm_result("amp", seed, 0.68, 1500.0, 120.0), timing__compile_s=2.0,
              timing__compile_cache=outcome)
        for seed, outcome in zip((0, 1), outcomes, strict=True)
    ]  # fmt: skip
    comparison = compare_arms({"fp32": fp32, "amp": amp})
    (line,) = [
        line for line in render_text(comparison).splitlines() if line.startswith("Time spent, amp:")
    ]
    assert f"warm-up 5.00 s{said}, training" in line
    # fp32 fetched nothing: where amp fetched any, its warm-up is not precision's alone.
    fetched = [f"amp seed {seed}" for seed, o in zip((0, 1), outcomes, strict=True) if o == "hit"]
    warning = (
        f"Fetched the compiled step from the compile cache: {', '.join(fetched)}; the other "
        "runs compiled theirs."
    )
    assert any(w.startswith(warning) for w in comparison.warnings) == bool(fetched)


def test_time_spent_is_the_mean_over_seeds_and_unrecorded_where_a_seed_lacks_it() -> None:
    fp32 = [arm_result("fp32", seed, 0.70, 3000.0, 300.0 + seed) for seed in (0, 2)]
    amp = [arm_result("amp", 0, 0.68, 1500.0, 120.0), arm_result("amp", 2, 0.68, 1500.0, 120.0)]
    amp[1] = with_(amp[1], timing__startup=None, timing__compile_s=1.5)
    comparison = compare_arms({"fp32": fp32, "amp": amp})
    spent = comparison.arms["fp32"].time_spent
    assert (spent.startup_s, spent.imports_s, spent.state_s) == (7.0, 4.0, 3.0)
    assert spent.train_s == 301.0 and spent.warmup_s == 5.0 and spent.compile_s == 0.0
    assert comparison.arms["amp"].time_spent.startup_s is None  # not a mean of one seed
    text = render_text(comparison)
    assert (
        "Time spent, fp32: start-up 7.00 s (imports and device 4.00, data and model 3.00)" in text
    )
    assert (
        "Time spent, amp: start-up not recorded, warm-up 5.00 s (compilation 0.75), training "
        "120.00 s" in text
    )
    header, rows = tables(comparison)["Where the time went (s, mean over seeds)"]
    assert header[:4] == ["arm", "start-up", "imports and device", "data and model"]
    assert rows == [
        ["fp32", "7.00", "4.00", "3.00", "5.00", "0.00", "301.00", "5.00", "0.00"],
        ["amp", "-", "-", "-", "5.00", "0.75", "120.00", "5.00", "0.00"],
    ]


def test_ratio_interval_is_the_t_interval_of_the_logs_centred_on_the_figure() -> None:
    ratios = [2.0, 2.5, 3.2]
    estimate = ratio_estimate(ratios)
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((v - mean) ** 2 for v in logs) / 2)
    assert estimate.value == pytest.approx(math.exp(mean))  # the geometric mean
    assert estimate.low == pytest.approx(math.exp(mean - T_975_DF2 * sd / math.sqrt(3)), rel=1e-6)
    assert estimate.high == pytest.approx(math.exp(mean + T_975_DF2 * sd / math.sqrt(3)), rel=1e-6)
    # Centred on the figure shown, on the log scale; the reciprocal has the reciprocal interval.
    assert math.log(estimate.value / estimate.low) == pytest.approx(
        math.log(estimate.high / estimate.value)
    )
    inverse = ratio_estimate([1 / r for r in ratios])
    assert inverse.value == pytest.approx(1 / estimate.value)
    assert inverse.low == pytest.approx(1 / estimate.high)
    difference = mean_estimate([1.0, 2.0, 3.0])
    assert (difference.low, difference.high) == pytest.approx(
        (2 - T_975_DF2 / math.sqrt(3), 2 + T_975_DF2 / math.sqrt(3)), rel=1e-6
    )


def test_reported_ratios_are_the_centre_of_their_intervals_over_paired_seeds() -> None:
    fp32 = [arm_result("fp32", s, 0.70 + 0.01 * s, 3000.0 + s, 300.0 + 10 * s) for s in range(3)]
    amp = [arm_result("amp", s, 0.69 + 0.01 * s, 1500.0 - s, 100.0 + 17 * s) for s in range(3)]
    comparison = compare_arms({"fp32": fp32, "amp": amp})
    this = comparison.comparisons["amp"]
    per_seed = [(300.0 + 10 * s) / (100.0 + 17 * s) for s in range(3)]
    assert this.per_seed["speedup"] == pytest.approx(per_seed)
    assert comparison.speedup == pytest.approx(math.exp(sum(map(math.log, per_seed)) / 3))
    for estimate in (this.speedup, this.memory_ratio, this.end_to_end_ratio):
        assert estimate is not None and estimate.low < estimate.value < estimate.high
        assert estimate.value**2 == pytest.approx(estimate.low * estimate.high)
    assert this.accuracy_delta_pp.value == pytest.approx(-1.0)
    text = render_text(comparison)
    assert f"{comparison.speedup:.2f}x (95% CI {this.speedup.low:.2f}x to" in text
    assert "±" not in render_markdown(comparison)


def test_unpaired_seeds_are_left_out_and_named() -> None:
    fp32 = [arm_result("fp32", s, 0.70, 3000.0, 300.0) for s in (0, 1, 2)]
    amp = [arm_result("amp", s, 0.69, 1500.0, 100.0) for s in (0, 1)]
    amp.append(arm_result("amp", 7, 0.10, 9999.0, 1.0))  # no fp32 partner: must not count
    comparison = compare_arms({"fp32": fp32, "amp": amp})
    assert comparison.unpaired_seeds == {"fp32": [2], "amp": [7]}
    assert comparison.arms["amp"].seeds == [0, 1] and comparison.arms["fp32"].seeds == [0, 1]
    assert comparison.speedup == pytest.approx(3.0)
    assert comparison.arms["amp"].accuracy.value == pytest.approx(0.69)
    assert any("fp32 seed 2; amp seed 7" in w for w in comparison.warnings)
    with pytest.raises(AmpbenchError, match=r"no seed that every arm ran \(fp32: 0; amp: 1\)"):
        compare_arms({"fp32": fp32[:1], "amp": [arm_result("amp", 1, 0.7, 1.0, 1.0)]})


MISMATCHES = [
    ("device", {"device__name": "NVIDIA A100-SXM4-80GB"}, "device"),
    ("model", {"model": "small-cnn"}, "model (fp32: resnet18; amp: small-cnn)"),
    ("batch size", {"hyperparameters": {"batch_size": 512}}, "batch size (fp32: 128; amp: 512)"),
    ("epochs", {"hyperparameters": {"epochs": 5}}, "epochs (fp32: 2; amp: 5)"),
    ("image shape", {"dataset__image_shape": [64, 64, 3]}, "image shape (fp32: 32x32x3"),
    ("dataset", {"dataset__sha256": "cd" * 32}, "dataset (fp32: abababababab; amp: cdcdcdcdcdcd)"),
    ("torch", {"versions__torch": "2.15.0"}, "torch (fp32: 2.14.1; amp: 2.15.0)"),
    ("CUDA", {"versions__cuda": "12.8"}, "CUDA (fp32: 13.0; amp: 12.8)"),
    ("cuDNN", {"versions__cudnn": 90100}, "cuDNN (fp32: 91000; amp: 90100)"),
    ("compile", {"hyperparameters": {"compile": True}}, "compile (fp32: False; amp: True)"),
]


@pytest.mark.parametrize(("what", "change", "named"), MISMATCHES, ids=[m[0] for m in MISMATCHES])
def test_arms_that_differ_in_more_than_precision_are_refused_in_one_line(
    what: str, change: dict[str, Any], named: str
) -> None:
    fp32 = arm_result("fp32", 0, 0.7, 3000.0, 300.0)
    amp = arm_result("amp", 0, 0.7, 1500.0, 100.0)
    if "hyperparameters" in change:
        change = {"hyperparameters": {**amp.hyperparameters, **change["hyperparameters"]}}
    other = with_(amp, **change)
    with pytest.raises(AmpbenchError) as refused:
        compare_arms({"fp32": [fp32], "amp": [other]})
    message = str(refused.value)
    assert "\n" not in message and named in message and "--allow-mismatch" in message
    allowed = compare_arms({"fp32": [fp32], "amp": [other]}, allow_mismatch=True)
    assert allowed.mismatches and named in allowed.mismatches[0]
    assert "WARNING:" in render_text(allowed) and "--allow-mismatch" in allowed.warnings[0]
    assert "**WARNING:**" in render_markdown(allowed)


def test_seeds_of_one_arm_must_agree_too() -> None:
    amp = [arm_result("amp", 0, 0.7, 1.0, 1.0), arm_result("amp", 1, 0.7, 1.0, 1.0, lr=0.2)]
    with pytest.raises(AmpbenchError, match=r"lr \(fp32: 0\.1; amp: 0\.1/0\.2\)"):
        compare_arms({"fp32": [arm_result("fp32", s, 0.7, 1.0, 1.0) for s in (0, 1)], "amp": amp})
    with pytest.raises(AmpbenchError, match=r"arm amp: results of several precisions"):
        compare_arms(
            {
                "fp32": [arm_result("fp32", 0, 0.7, 1.0, 1.0)],
                "amp": [arm_result("amp", 0, 0.7, 1.0, 1.0), arm_result("bf16", 1, 0.7, 1.0, 1.0)],
            }
        )


def test_verdict_says_what_is_and_is_not_significant() -> None:
    fp32 = [arm_result("fp32", s, 0.70 + 0.004 * s, 3000.0 + 10 * s, 300.0 + s) for s in range(3)]
    amp = [arm_result("amp", s, 0.70 + 0.004 * (2 - s), 1560.0, 100.0 + s) for s in range(3)]
    verdict = compare_arms({"fp32": fp32, "amp": amp}).verdict
    assert verdict.startswith("On NVIDIA H200 (cuda), AMP (fp16) trained 2.98x faster")
    assert "x faster than strict FP32 (95% CI 2." in verdict
    assert "with 0.52x the training memory (95% CI 0.5" in verdict
    assert (
        "no significant difference in accuracy (+0.00 pp, 95% CI -1.99 pp to +1.99 pp)" in verdict
    )
    same_speed = [arm_result("amp", s, 0.60, 1560.0, 300.0 + 20 * (s - 1)) for s in range(3)]
    verdict = compare_arms({"fp32": fp32, "amp": same_speed}).verdict
    assert "showed no significant difference in speed from strict FP32 (" in verdict
    assert " and -10.40 pp accuracy (" in verdict
    slower = [arm_result("amp", s, 0.70, 1500.0, 600.0 + s) for s in range(3)]
    assert "trained 2.00x slower than strict FP32 (speedup 0.50x, 95% CI" in (
        compare_arms({"fp32": fp32, "amp": slower}).verdict
    )


def test_accuracy_at_chance_is_said_instead_of_a_delta() -> None:
    comparison = compare_arms(
        {
            "fp32": [arm_result("fp32", 0, 0.104, 3000.0, 300.0)],
            "amp": [arm_result("amp", 0, 0.71, 1500.0, 100.0)],
        }
    )
    assert comparison.accuracy_at_chance
    assert "accuracy at chance level: too short to judge accuracy" in comparison.verdict
    assert "pp accuracy" not in comparison.verdict
    # 0.104 over 10,000 test images is chance; 0.13 is not (binomial test).
    above = compare_arms(
        {
            "fp32": [arm_result("fp32", 0, 0.13, 3000.0, 300.0)],
            "amp": [arm_result("amp", 0, 0.13, 1500.0, 100.0)],
        }
    )
    assert not above.accuracy_at_chance
    # One diverged seed among good ones shows, named: seeds are judged one by one.
    fp32 = [arm_result("fp32", s, 0.70, 3000.0, 300.0) for s in range(3)]
    amp = [arm_result("amp", s, 0.70 if s != 1 else 0.10, 1500.0, 100.0) for s in range(3)]
    diverged = compare_arms({"fp32": fp32, "amp": amp})
    assert diverged.accuracy_at_chance
    assert any("chance level (1/10) in amp seed 1:" in w for w in diverged.warnings)


def test_resumed_and_emulated_runs_are_flagged() -> None:
    comparison = compare_arms(
        {
            "fp32": [arm_result("fp32", 0, 0.7, 3000.0, 300.0, resumed=True)],
            "bf16": [arm_result("bf16", 0, 0.7, 3000.0, 3000.0, emulated=True)],
        }
    )
    assert comparison.resumed == ["fp32 seed 0"] and comparison.emulated == ["bf16"]
    assert "bf16 autocast (emulated) trained 10.00x slower" in comparison.verdict
    text = render_text(comparison)
    assert "WARNING: Arm bf16 ran bf16 EMULATED (no tensor cores)" in text
    assert "WARNING: Resumed from a checkpoint: fp32 seed 0." in text
    assert "| bf16 | bf16 (emulated) |" in render_markdown(comparison)


def test_a_zero_memory_peak_gives_no_ratio_rather_than_a_ratio_of_some_seeds() -> None:
    fp32 = [arm_result("fp32", s, 0.7, 3000.0 if s else 0.0, 300.0) for s in range(2)]
    amp = [arm_result("amp", s, 0.7, 1500.0, 100.0) for s in range(2)]
    comparison = compare_arms({"fp32": fp32, "amp": amp})
    assert comparison.memory_ratio is None
    assert comparison.comparisons["amp"].note and "0 MB" in comparison.comparisons["amp"].note
    assert "Memory ratio (training peak, amp / fp32): n/a" in render_text(comparison)


def test_the_published_run_is_a_reference_unless_the_setup_matches() -> None:
    same = compare_arms(
        {
            "fp32": [arm_result("fp32", 0, 0.7, 3000.0, 300.0)],
            "amp": [arm_result("amp", 0, 0.7, 1500.0, 100.0)],
        }
    )
    assert same.published_differences == []
    assert "## The published run this reproduces" in render_markdown(same)
    small = [
        with_(arm_result(p, 0, 0.7, 1.0, 1.0), model="small-cnn", dataset__train_images=300)
        for p in ("fp32", "amp")
    ]
    other = compare_arms({"fp32": small[:1], "amp": small[1:]})
    assert "model small-cnn (published: resnet18)" in other.published_differences
    assert "training images 300 (published: 50000)" in other.published_differences
    assert "## Published run, for reference only: not a reproduction (" in render_markdown(other)


def test_the_published_pair_is_two_arms_fp32_and_amp() -> None:
    run = arm_result("fp32", 0, 0.7, 1.0, 1.0)
    assert published_differences(run, "fp32", "amp", 2) == []
    published = "(published: fp32 and amp)"
    assert published_differences(run, "fp32", "bf16", 2) == [f"arms fp32 and bf16 {published}"]
    assert published_differences(run, "fp32", "amp", 3) == [f"a matrix of 3 arms {published}"]


@pytest.mark.parametrize("requested", PRECISIONS)
def test_every_precision_has_a_label_for_the_verdict(requested: str) -> None:
    resolved = "bf16" if requested == "amp" else requested
    for emulated in (False, True):
        record = PrecisionRecord(requested, resolved, None, False, False, emulated, "test")
        label = precision_label(record)
        assert label and label.endswith("emulated)") == emulated


@pytest.mark.parametrize(
    ("requested", "resolved", "label"),
    [
        ("fp32", "fp32", "strict FP32"),
        ("tf32", "tf32", "TF32"),
        ("fp16", "fp16", "fp16 autocast"),
        ("bf16", "bf16", "bf16 autocast (emulated)"),
        ("amp", "fp16", "AMP (fp16)"),
        ("amp", "bf16", "AMP (bf16, emulated)"),
        ("fp8", "fp8", "FP8 training (tensorwise scales)"),
        ("fp8-rowwise", "fp8-rowwise", "FP8 training (rowwise scales) (emulated)"),
    ],
)
def test_the_verdict_names_each_precision_as_the_registry_does(
    requested: str, resolved: str, label: str
) -> None:
    emulated = label.endswith("emulated)")
    record = PrecisionRecord(requested, resolved, None, False, False, emulated, "test")
    assert precision_label(record) == label
