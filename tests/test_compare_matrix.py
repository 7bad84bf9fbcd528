"""The compare step over an experiment matrix: each arm against its own group's baseline,
the fastest arm, time to target, FLOPs, scaling over world sizes, and the wording."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from arms import IMAGES, arm_result, with_, write_results

from ampbench.compare.analysis import (
    arm_label,
    batch_size_of,
    compare_arms,
    compare_runs,
    pair,
)
from ampbench.compare.plots import BATCH_PLOT, PLOTS, SCALING_PLOT
from ampbench.compare.report import render_text, tables
from ampbench.compare.stats import mean_estimate, ratio_estimate
from ampbench.compare.step import CompareOutputs, run_comparison
from ampbench.comparison import read_comparison
from ampbench.errors import AmpbenchError
from ampbench.results import (
    ArmResults,
    Compute,
    Distributed,
    TimeToTarget,
)

# -- an experiment matrix -----------------------------------------------------------------------
# Training time per (model, batch size, precision), per seed offset: each group's baseline is
# made different, so that an arm compared with the wrong group's baseline shows.
MATRIX_TIMES = {
    ("resnet18", 128, "fp32"): 300.0,
    ("resnet18", 128, "bf16"): 150.0,
    ("resnet18", 512, "fp32"): 200.0,
    ("resnet18", 512, "bf16"): 50.0,
    ("vit-s", 128, "fp32"): 400.0,
    ("vit-s", 128, "bf16"): 100.0,
    ("vit-s", 512, "fp32"): 360.0,
    ("vit-s", 512, "bf16"): 60.0,
}


def matrix_run(model: str, batch: int, precision: str, seed: int) -> ArmResults:
    time_s = MATRIX_TIMES[(model, batch, precision)] * (1 + 0.01 * seed * (precision == "bf16"))
    run = arm_result(precision, seed, 0.7 + 0.001 * seed, time_s * 10, time_s, batch_size=batch)
    return with_(run, model=model, parameters=1000 if model == "vit-s" else 2000)


def matrix() -> list[ArmResults]:
    return [
        matrix_run(model, batch, precision, seed)
        for (model, batch, precision) in MATRIX_TIMES
        for seed in range(3)
    ]


def test_a_matrix_compares_each_arm_with_its_own_groups_baseline(tmp_path: Path) -> None:
    comparison = compare_runs(matrix())
    assert set(comparison.arms) == {
        f"{model} b{batch} {precision}" for model, batch, precision in MATRIX_TIMES
    }
    assert comparison.groups == [
        "resnet18, batch 128",
        "resnet18, batch 512",
        "vit-s, batch 128",
        "vit-s, batch 512",
    ]
    for (model, batch, precision), time_s in MATRIX_TIMES.items():
        if precision == "fp32":
            continue
        this = comparison.comparisons[f"{model} b{batch} bf16"]
        assert this.baseline == f"{model} b{batch} fp32"
        base = MATRIX_TIMES[(model, batch, "fp32")]
        per_seed = [base / (time_s * (1 + 0.01 * seed)) for seed in range(3)]
        assert this.per_seed["speedup"] == pytest.approx(per_seed)
        assert this.speedup.low < this.speedup.value < this.speedup.high
    # Fastest per model: the arm with the most images/s (no arm loses accuracy here).
    assert comparison.best_per_model == {
        "resnet18": "resnet18 b512 bf16",
        "vit-s": "vit-s b512 bf16",
    }
    assert "Fastest per model without a significant accuracy loss: resnet18: bf16 at batch 512" in (
        comparison.verdict
    )
    assert comparison.settings["models"] == "resnet18, vit-s"
    assert comparison.settings["batch sizes"] == "128, 512"
    assert "model" not in comparison.settings and "parameters" not in comparison.settings
    assert "a matrix of 8 arms (published: fp32 and amp)" in comparison.published_differences
    header, rows = tables(comparison)["At a glance"]
    assert header[:4] == ["model", "batch", "images/s fp32", "images/s bf16"]
    assert rows[1][:2] == ["resnet18", "512"] and rows[1][4] == (
        f"{comparison.comparisons['resnet18 b512 bf16'].speedup.value:.2f}x"
    )
    outputs = CompareOutputs.in_directory(tmp_path / "out")
    paths = [write_results(tmp_path / f"{i}.json", run) for i, run in enumerate(matrix())]
    written = run_comparison(paths, outputs)
    assert written.best_per_model == comparison.best_per_model
    assert sorted(p.name for p in outputs.plots.iterdir()) == sorted([*PLOTS, BATCH_PLOT])
    assert "## At a glance" in outputs.report.read_text()
    assert "Every arm against its group's fp32 baseline:" in render_text(written)


def test_a_matrix_refuses_a_group_without_baseline_and_other_differences() -> None:
    runs = [run for run in matrix() if run.model != "vit-s" or run.precision.requested != "fp32"]
    with pytest.raises(
        AmpbenchError, match=r"no results for the baseline arm 'fp32' in group vit-s"
    ):
        compare_runs(runs)
    other = [
        with_(run, hyperparameters={**run.hyperparameters, "epochs": 5})
        if run.model == "vit-s"
        else run
        for run in matrix()
    ]
    with pytest.raises(AmpbenchError, match=r"epochs \(.*2/5|epochs \(.*: 5"):
        compare_runs(other)


def test_the_fastest_arm_is_not_one_that_loses_accuracy_significantly() -> None:
    runs = [
        with_(run, accuracy=0.5 + 0.001 * run.seed)
        if (run.model, run.precision.requested, batch_size_of(run)) == ("resnet18", "bf16", 512)
        else run
        for run in matrix()
    ]
    comparison = compare_runs(runs)
    assert comparison.comparisons["resnet18 b512 bf16"].accuracy_delta_pp.excludes(0.0)
    assert comparison.best_per_model == {
        "resnet18": "resnet18 b128 bf16",
        "vit-s": "vit-s b512 bf16",
    }


@pytest.mark.parametrize(
    ("deltas_pp", "eligible"),
    [
        ((-1.0, 0.5, -0.25), True),  # a loss within noise: the interval holds 0
        ((-0.3, -0.2, -0.1), True),  # the same, the interval just above 0 (and below 1)
        ((0.4, 0.5, 0.6), True),  # a significant gain, below 1 pp
        ((-0.6, -0.5, -0.4), False),  # a significant loss
    ],
)
def test_only_a_significant_accuracy_loss_rules_the_fastest_arm_out(
    deltas_pp: tuple[float, ...], eligible: bool
) -> None:
    fp32 = [arm_result("fp32", s, 0.7, 1.0, 200.0) for s in range(3)]
    bf16 = [arm_result("bf16", s, 0.7 + d / 100, 1.0, 100.0) for s, d in enumerate(deltas_pp)]
    comparison = compare_arms({"fp32": fp32, "bf16": bf16})
    assert comparison.best_per_model == {"resnet18": "bf16" if eligible else "fp32"}


def test_of_arms_equally_fast_the_first_stays_the_fastest() -> None:
    fp32 = [arm_result("fp32", s, 0.7, 1.0, 100.0) for s in range(2)]
    bf16 = [arm_result("bf16", s, 0.7, 1.0, 100.0) for s in range(2)]
    assert compare_arms({"fp32": fp32, "bf16": bf16}).best_per_model == {"resnet18": "fp32"}


def test_time_to_target_is_compared_where_both_got_there_and_misses_are_named() -> None:
    def reached(run: ArmResults, time_s: float | None) -> ArmResults:
        return with_(run, time_to_target=TimeToTarget(0.7, time_s is not None, time_s, 1))

    fp32 = [reached(arm_result("fp32", s, 0.70, 3000.0, 300.0), 100.0 + s) for s in range(3)]
    amp = [
        reached(arm_result("amp", s, 0.70, 1500.0, 100.0), t)
        for s, t in enumerate((50.0, 40.0, None))
    ]
    comparison = compare_arms({"fp32": fp32, "amp": amp})
    this = comparison.comparisons["amp"]
    assert this.time_to_target_ratio is not None and this.time_to_target_ratio.n == 2
    assert this.time_to_target_ratio.value == pytest.approx(math.sqrt(100.0 / 50.0 * 101.0 / 40.0))
    assert comparison.arms["amp"].target_reached == [0, 1]
    assert comparison.arms["amp"].time_to_target_s.value == pytest.approx(45.0)
    assert any(
        "Never reached the target accuracy 0.7: amp seed 2" in w for w in comparison.warnings
    )
    header, rows = tables(comparison)["Arms"]
    assert (
        "time to target (s)" in header
        and "(2 of 3 seeds)" in rows[1][header.index("time to target (s)")]
    )
    assert "Time-to-target ratio (fp32 / amp): " in render_text(comparison)


def test_tflops_are_averaged_and_mfu_omitted_where_the_peak_is_unknown() -> None:
    def computed(run: ArmResults, tflops: float, peak: float | None) -> ArmResults:
        return with_(run, compute=Compute(10**9, tflops, peak, tflops / peak if peak else None))

    fp32 = [computed(arm_result("fp32", s, 0.7, 1.0, 1.0), 40.0 + s, 60.0) for s in range(2)]
    amp = [computed(arm_result("amp", s, 0.7, 1.0, 1.0), 400.0, None) for s in range(2)]
    comparison = compare_arms({"fp32": fp32, "amp": amp})
    assert comparison.arms["fp32"].achieved_tflops.value == pytest.approx(40.5)
    assert comparison.arms["fp32"].mfu.value == pytest.approx((40 / 60 + 41 / 60) / 2)
    assert comparison.arms["amp"].mfu is None
    assert "MFU not given: the device's peak is not known" in render_text(comparison)


def scaled_run(precision: str, world: int, seed: int, time_s: float) -> ArmResults:
    """A ResNet-18 run of batch 128 per process in `world` processes: world x 2 x IMAGES
    images in time_s."""
    run = arm_result(precision, seed, 0.7, 1000.0, time_s)
    images = world * 2 * IMAGES
    return with_(
        run,
        distributed=Distributed(world, 128, 128 * world, "nccl" if world > 1 else None, "fp32"),
        timing__trained_images=images,
        timing__throughput_img_s=images / time_s,
    )


def test_scaling_compares_each_world_size_with_one_process_and_its_baseline(
    tmp_path: Path,
) -> None:
    # Each process trains the same images, twice as many in all at 2 processes: fp32 takes
    # 100 s, then 120 s (83% efficient); amp 50 s, then 80 s (62.5%).
    times = {("fp32", 1): 100.0, ("fp32", 2): 120.0, ("amp", 1): 50.0, ("amp", 2): 80.0}
    runs = [
        scaled_run(precision, world, seed, time_s * (1 + 0.001 * seed))
        for (precision, world), time_s in times.items()
        for seed in range(2)
    ]
    comparison = compare_runs(runs)
    assert list(comparison.arms) == ["x1 fp32", "x1 amp", "x2 fp32", "x2 amp"]
    assert comparison.comparisons["x2 amp"].baseline == "x2 fp32"
    assert comparison.groups == [
        "resnet18, batch 128",
        "resnet18, batch 128 per process, 2 processes",
    ]
    rows = {(row.precision, row.world_size): row for row in comparison.scaling}
    assert rows[("fp32", 2)].scaling_efficiency == pytest.approx(100 / 120, rel=1e-3)
    assert rows[("amp", 2)].scaling_efficiency == pytest.approx(50 / 80, rel=1e-3)
    assert rows[("fp32", 1)].scaling_efficiency == pytest.approx(1.0)
    assert rows[("amp", 2)].speedup == pytest.approx(120 / 80, rel=1e-3)
    assert rows[("fp32", 2)].speedup is None
    header, table = tables(comparison)["Scaling"]
    assert header == [
        "model",
        "batch per process",
        "processes",
        "images/s fp32",
        "images/s amp",
        "speedup amp",
        "scaling fp32",
        "scaling amp",
    ]
    assert table[1][2] == "2" and table[1][5] == "1.50x" and table[1][6:] == ["83%", "63%"]
    outputs = CompareOutputs.in_directory(tmp_path / "out")
    written = run_comparison(
        [write_results(tmp_path / f"{i}.json", r) for i, r in enumerate(runs)], outputs
    )
    assert read_comparison(outputs.comparison).scaling == written.scaling == comparison.scaling
    assert SCALING_PLOT in {p.name for p in outputs.plots.iterdir()}
    assert "## Scaling" in outputs.report.read_text()
    # One world size: no scaling section.
    assert compare_runs([r for r in runs if r.world_size == 1]).scaling == []
    # One seed; and an arm at 2 processes with no one-process run has no efficiency.
    one_seed = compare_runs([r for r in runs if r.seed == 0])
    assert {(r.precision, r.world_size) for r in one_seed.scaling} == set(times)
    no_single = compare_runs(
        [r for r in runs if (r.precision.requested, r.world_size) != ("amp", 1)]
    )
    rows = {(row.precision, row.world_size): row for row in no_single.scaling}
    assert rows[("amp", 2)].scaling_efficiency is None
    assert rows[("fp32", 2)].scaling_efficiency == pytest.approx(100 / 120, rel=1e-3)


def test_arms_at_other_world_sizes_are_refused_outside_a_matrix() -> None:
    runs = [scaled_run("fp32", 1, 0, 100.0), scaled_run("amp", 2, 0, 80.0)]
    with pytest.raises(AmpbenchError, match=r"world size \(fp32: 1; amp: 2\)"):
        compare_arms({"fp32": runs[:1], "amp": runs[1:]})


def test_two_results_for_one_seed_in_an_arm_are_refused() -> None:
    # A retried training task can leave two results of one seed; taking either (or both, as
    # two samples) would change the figures without saying so.
    fp32 = [arm_result("fp32", 0, 0.70, 3000.0, 300.0), arm_result("fp32", 1, 0.70, 3000.0, 300.0)]
    amp = [arm_result("amp", 0, 0.68, 1500.0, 120.0), arm_result("amp", 0, 0.69, 1500.0, 121.0)]
    with pytest.raises(AmpbenchError, match=r"^arm amp: two results for seed 0$"):
        compare_arms({"fp32": fp32, "amp": amp})
    with pytest.raises(AmpbenchError, match=r"two results for seed 1"):
        compare_runs([*fp32, fp32[1], *amp[:1]])


def test_the_comparison_does_not_depend_on_the_order_the_runs_come_in() -> None:
    runs = matrix()
    expected = compare_runs(runs)
    # KFP collects the training tasks as they finish: any order of seeds, batch sizes and
    # precisions gives the same comparison (models keep the order they are first seen in).
    shuffled = sorted(runs, key=lambda run: (run.model, -run.seed, run.precision.requested))
    assert compare_runs(shuffled) == expected
    assert compare_runs(list(reversed(runs))).arms == expected.arms
    arms = {"fp32": [], "amp": []}
    for seed in (2, 0, 1):
        arms["fp32"].append(arm_result("fp32", seed, 0.70 + seed / 100, 3000.0, 300.0 + seed))
        arms["amp"].insert(0, arm_result("amp", seed, 0.68, 1500.0, 120.0 + 3 * seed))
    forward = compare_arms(arms)
    backward = compare_arms({name: list(reversed(runs)) for name, runs in reversed(arms.items())})
    assert backward.comparisons == forward.comparisons
    assert forward.comparisons["amp"].per_seed["speedup"] == pytest.approx(
        [300.0 / 120.0, 301.0 / 123.0, 302.0 / 126.0]
    )


def test_memory_ratios_below_one_megabyte_and_a_zero_peak() -> None:
    """Peaks of a fraction of a MB still make a ratio; a zero peak in any seed makes none (a
    ratio over some seeds only would pass for one over all)."""
    fp32 = [arm_result("fp32", s, 0.7, 0.5, 300.0) for s in range(2)]
    amp = [arm_result("amp", s, 0.7, 0.25, 100.0) for s in range(2)]
    this = compare_arms({"fp32": fp32, "amp": amp}).comparisons["amp"]
    assert this.memory_ratio is not None and this.memory_ratio.value == pytest.approx(0.5)
    # arm_result's total peak is the training peak + 300 MB.
    assert this.total_memory_ratio is not None
    assert this.total_memory_ratio.value == pytest.approx(300.25 / 300.5)
    assert this.note is None
    expected = {
        "speedup": [3.0, 3.0],
        "end_to_end_ratio": [310 / 110, 310 / 110],
        "memory_ratio": [0.5, 0.5],
        "accuracy_delta_pp": [0.0, 0.0],
    }
    assert list(this.per_seed) == list(expected)
    for key, values in expected.items():
        assert this.per_seed[key] == pytest.approx(values), key
    amp[1] = arm_result("amp", 1, 0.7, 0.0, 100.0)
    this = compare_arms({"fp32": fp32, "amp": amp}).comparisons["amp"]
    assert this.memory_ratio is None and this.per_seed["memory_ratio"] == [None, None]
    assert this.note == (
        "memory ratio not given: a training peak of 0 MB in some seed (on a CPU the resident "
        "set need not grow when freed pages are reused)"
    )


def test_pairing_refuses_lists_of_unequal_length() -> None:
    fp32 = [arm_result("fp32", s, 0.7, 1.0, 2.0) for s in range(2)]
    with pytest.raises(ValueError, match="zip"):
        pair("fp32", fp32, "amp", [arm_result("amp", 0, 0.7, 1.0, 1.0)])


def test_an_arm_is_named_by_its_precision_after_what_varies() -> None:
    run = with_(arm_result("bf16", 0, 0.7, 1.0, 1.0, batch_size=512), model="vit-s")
    assert arm_label(run, False, False) == "bf16"
    assert arm_label(run, True, True) == "vit-s b512 bf16"
    assert arm_label(run, False, True, world_sizes_vary=True) == "b512 x1 bf16"


def test_the_fastest_per_model_sentence_in_full() -> None:
    comparison = compare_runs(matrix())
    expected = []
    for model in ("resnet18", "vit-s"):
        name = f"{model} b512 bf16"
        images_s = comparison.arms[name].throughput_img_s.value
        speedup = comparison.comparisons[name].speedup.value
        expected.append(
            f"{model}: bf16 at batch 512 ({images_s:,.1f} images/s, {speedup:.2f}x its "
            f"{model} b512 fp32 baseline)"
        )
    sentence = "Fastest per model without a significant accuracy loss: " + "; ".join(expected)
    assert sentence + "." in comparison.verdict


def test_batch_sizes_are_listed_by_value() -> None:
    runs = [
        arm_result(precision, 0, 0.7, 1.0, time_s, batch_size=batch)
        for batch in (512, 64)
        for precision, time_s in (("fp32", 2.0), ("bf16", 1.0))
    ]
    assert compare_runs(runs).settings["batch sizes"] == "64, 512"  # not "512, 64"


def test_a_matrix_with_nothing_in_it_and_one_allowed_to_differ() -> None:
    with pytest.raises(AmpbenchError) as empty:
        compare_runs([])
    assert str(empty.value) == "no training results to compare"
    runs = [matrix_run("resnet18", 128, precision, 0) for precision in ("fp32", "bf16")]
    runs[1] = with_(runs[1], hyperparameters={**runs[1].hyperparameters, "epochs": 5})
    with pytest.raises(AmpbenchError, match="--allow-mismatch"):
        compare_runs(runs)
    assert compare_runs(runs, allow_mismatch=True).mismatches


def test_estimates_refuse_no_values_and_ratios_that_are_not_positive() -> None:
    with pytest.raises(ValueError) as empty:
        mean_estimate([])
    assert str(empty.value) == "no values to estimate from"
    for ratios in ([1.5, 0.0], [1.5, -2.0]):
        with pytest.raises(ValueError) as refused:
            ratio_estimate(ratios)
        assert str(refused.value) == f"ratios must be positive: {ratios}"
