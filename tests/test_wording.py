"""The comparison's sentences, whole: the verdict in each of its cases, every warning, and the
interval format. A reader acts on these words, so a changed word, bound or branch must show."""

from __future__ import annotations

import dataclasses

import pytest
from arms import arm_result, with_

from ampbench.compare.analysis import compare_arms, compare_runs
from ampbench.compare.wording import Notes, best_sentence, interval, verdict
from ampbench.comparison import Estimate
from ampbench.results import ArmResults, TimeToTarget

SIGNIFICANT = Estimate(1.5, 1.25, 1.75, 3)


def test_an_interval_is_written_one_way_and_left_out_where_there_is_none() -> None:
    assert interval(Estimate(1.2, 1.1, 1.3, 3), ".2f", "x") == "95% CI 1.10x to 1.30x"
    assert interval(Estimate(0.5, -1.0, 2.0, 3), "+.2f", " pp") == "95% CI -1.00 pp to +2.00 pp"
    assert interval(Estimate(1.2, 1.1, 1.3, 3), ".3f") == "95% CI 1.100 to 1.300"
    assert interval(Estimate(1.2, None, None, 1), ".2f", "x") == ""
    assert interval(None, ".2f", "x") == ""


def sentence(
    speedup: Estimate,
    memory: Estimate | None = SIGNIFICANT,
    delta: Estimate = SIGNIFICANT,
    *,
    at_chance: bool = False,
) -> str:
    """The verdict of an AMP arm against strict FP32 with these three figures."""
    runs = {p: [arm_result(p, s, 0.7, 1000.0, 100.0) for s in range(3)] for p in ("fp32", "amp")}
    comparison = compare_arms(runs)
    amp = dataclasses.replace(
        comparison.comparisons["amp"],
        speedup=speedup,
        memory_ratio=memory,
        accuracy_delta_pp=delta,
    )
    return verdict(amp, comparison.arms["amp"], comparison.arms["fp32"], at_chance)


ON = "On NVIDIA H200 (cuda), AMP (fp16)"
ONE_SEED = " One seed per arm: no intervals, so no claim of significance."


@pytest.mark.parametrize(
    ("figures", "expected"),
    [
        (
            {"speedup": Estimate(2.0, 1.8, 2.2, 3), "memory": Estimate(0.5, 0.4, 0.6, 3)},
            f"{ON} trained 2.00x faster than strict FP32 (95% CI 1.80x to 2.20x) with 0.50x the "
            "training memory (95% CI 0.40x to 0.60x) and +1.50 pp accuracy "
            "(95% CI +1.25 pp to +1.75 pp).",
        ),
        (
            {
                "speedup": Estimate(0.5, 0.4, 0.6, 3),
                "memory": Estimate(1.5, 0.5, 1.9, 3),  # holds 1, not 2
                "delta": Estimate(0.5, -0.5, 0.9, 3),  # holds 0, not 1
            },
            f"{ON} trained 2.00x slower than strict FP32 (speedup 0.50x, 95% CI 0.40x to 0.60x) "
            "with no significant difference in training memory (1.50x, 95% CI 0.50x to 1.90x) "
            "and no significant difference in accuracy (+0.50 pp, 95% CI -0.50 pp to +0.90 pp).",
        ),
        (
            {"speedup": Estimate(1.01, 0.9, 1.1, 3), "memory": None},
            f"{ON} showed no significant difference in speed from strict FP32 (1.01x, "
            "95% CI 0.90x to 1.10x) with training memory not comparable and +1.50 pp accuracy "
            "(95% CI +1.25 pp to +1.75 pp).",
        ),
        (
            {"speedup": Estimate(1.5, 1.25, 1.75, 3), "at_chance": True},
            f"{ON} trained 1.50x faster than strict FP32 (95% CI 1.25x to 1.75x) with 1.50x the "
            "training memory (95% CI 1.25x to 1.75x); accuracy at chance level: too short to "
            "judge accuracy.",
        ),
        # One seed: no interval, no parentheses, and exactly 1.0 is "faster".
        (
            {
                "speedup": Estimate(1.0, None, None, 1),
                "memory": Estimate(0.5, None, None, 1),
                "delta": Estimate(-0.25, None, None, 1),
            },
            f"{ON} trained 1.00x faster than strict FP32 with 0.50x the training memory and "
            f"-0.25 pp accuracy.{ONE_SEED}",
        ),
        (
            {"speedup": Estimate(1.5, None, None, 1), "memory": None},
            f"{ON} trained 1.50x faster than strict FP32 with training memory not comparable "
            f"and +1.50 pp accuracy (95% CI +1.25 pp to +1.75 pp).{ONE_SEED}",
        ),
        (
            {"speedup": Estimate(0.8, None, None, 1)},
            f"{ON} trained 1.25x slower than strict FP32 (speedup 0.80x) with 1.50x the "
            f"training memory (95% CI 1.25x to 1.75x) and +1.50 pp accuracy "
            f"(95% CI +1.25 pp to +1.75 pp).{ONE_SEED}",
        ),
    ],
)
def test_the_verdict_reads_as_written_in_each_case(
    figures: dict[str, Estimate | bool | None], expected: str
) -> None:
    assert sentence(**figures) == expected  # type: ignore[arg-type]


def test_every_warning_reads_as_written_in_print_order() -> None:
    notes = Notes(
        found=["lr (fp32: 0.1; amp: 0.2)", "epochs (fp32: 1; amp: 2)"],
        emulated=["bf16"],
        emulated_support={"bf16": "bf16 EMULATED (no AVX512_BF16)"},
        resumed=["fp32 seed 0", "amp seed 1"],
        schema_1=True,
        unpaired={"amp": [3, 4], "bf16": [5]},
        at_chance=["amp seed 1", "bf16 seed 2"],
        classes=100,
        missed_target=["amp seed 2", "bf16 seed 0"],
        target_accuracy=0.75,
        fetched_compiled=["amp seed 0", "bf16 seed 1"],
    )
    assert notes.warnings() == [
        "Compared although the arms differ in more than precision (--allow-mismatch): "
        "lr (fp32: 0.1; amp: 0.2); epochs (fp32: 1; amp: 2). The figures are not precision's "
        "alone.",
        "Arm bf16 ran bf16 EMULATED (no AVX512_BF16): its speed and memory measure the "
        "emulation, not mixed precision.",
        "Resumed from a checkpoint: fp32 seed 0, amp seed 1. Their training time adds up "
        "several processes, each with its own warm-up.",
        "Some results are of schema version 1 (an earlier ampbench, before its measurement "
        "protocol): their time holds the first epoch's one-time costs, their memory counts the "
        "data set and the model, and whether their precision was native was not recorded.",
        "Left out, with no partner in every arm: amp seed 3, 4; bf16 seed 5.",
        "Accuracy is at chance level (1/100) in amp seed 1, bf16 seed 2: too short (or diverged) "
        "to judge accuracy.",
        "Never reached the target accuracy 0.75: amp seed 2, bf16 seed 0 (their time to target "
        "is left out, and so are their pairs in the time-to-target ratio).",
        "Fetched the compiled step from the compile cache: amp seed 0, bf16 seed 1; the other "
        "runs compiled theirs. Warm-up and end-to-end times differ by that as well as by "
        "precision (training time and throughput do not include it).",
    ]
    quiet = Notes([], [], {}, [], False, {}, [], 10, [], None, [])
    assert quiet.warnings() == []


def test_the_missed_target_is_the_one_the_runs_missed() -> None:
    """Under --allow-mismatch the baseline may have no target while an arm missed its own."""
    missed = TimeToTarget(0.9, False, None, None)
    runs = {
        "fp32": [arm_result("fp32", 0, 0.7, 1000.0, 100.0)],
        "amp": [with_(arm_result("amp", 0, 0.7, 1000.0, 100.0), time_to_target=missed)],
    }
    summaries = compare_arms(runs, allow_mismatch=True).arms
    notes = Notes.of(runs, runs["fp32"][0], summaries, [], {}, lambda _: True)
    assert notes.missed_target == ["amp seed 0"] and notes.target_accuracy == 0.9


def test_the_fastest_arm_per_model_follows_the_verdict_only_with_several_groups() -> None:
    def run(precision: str, batch: int, seed: int, time_s: float) -> ArmResults:
        result = arm_result(precision, seed, 0.7, 1000.0, time_s)
        return dataclasses.replace(
            result, hyperparameters={**result.hyperparameters, "batch_size": batch}
        )

    one_group = compare_runs([run(p, 128, s, 100.0 + s) for p in ("fp32", "amp") for s in (0, 1)])
    headline = one_group.comparisons[one_group.headline_arm]
    arms = one_group.arms
    assert one_group.verdict == verdict(
        headline, arms[one_group.headline_arm], arms[headline.baseline], False
    )
    runs = [
        run(p, b, s, 50.0 + b / 8 + s) for p in ("fp32", "amp") for b in (128, 512) for s in (0, 1)
    ]
    two_groups = compare_runs(runs)
    headline = two_groups.comparisons[two_groups.headline_arm]
    arms = two_groups.arms
    alone = verdict(headline, arms[two_groups.headline_arm], arms[headline.baseline], False)
    fastest = best_sentence(two_groups.best_per_model, arms, two_groups.comparisons)
    assert two_groups.verdict == f"{alone} {fastest}"
    assert fastest.startswith("Fastest per model without a significant accuracy loss: resnet18:")
