"""The compare step: paired seeds, ratio intervals centred on the figure shown, comparisons
of arms that differ in more than precision refused, the verdict, the schema, the report."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from ampbench import schema
from ampbench.compare.analysis import (
    arm_label,
    batch_size_of,
    compare_arms,
    compare_runs,
    pair,
)
from ampbench.compare.plots import BATCH_PLOT, PLOTS, SCALING_PLOT
from ampbench.compare.published import PUBLISHED, published_differences
from ampbench.compare.report import render_markdown, render_text, results_block, tables
from ampbench.compare.stats import mean_estimate, ratio_estimate
from ampbench.compare.step import CompareOutputs, ParentRunOptions, run_comparison
from ampbench.compare.wording import precision_label
from ampbench.comparison import read_comparison
from ampbench.errors import AmpbenchError
from ampbench.old_results import UNRECORDED
from ampbench.results import (
    RESULTS_SCHEMA_VERSION,
    ArmResults,
    Compute,
    DatasetRecord,
    DeviceRecord,
    Distributed,
    EpochRecord,
    Memory,
    PrecisionRecord,
    Startup,
    TimeToTarget,
    Timing,
    Versions,
    read_arm_results,
    write_json,
)
from ampbench.train import PRECISIONS

PUBLISHED_BLOCK = """===== RESULTS =====
FP32 Accuracy: 0.7114
FP32 Memory : 3219.65 MB
FP32 Time   : 309.41 sec

Mixed Accuracy: 0.6969
Mixed Memory  : 1916.57 MB
Mixed Time    : 252.56 sec"""
IMAGES = 50_000
# Results files written by earlier versions (small-cnn, 100 synthetic images, one epoch, fp32
# and bf16 on a CPU): schema 1 by commit 1f5d895, schema 2 by commit 6e1a056.
SCHEMA_1 = SCHEMA_2 = Path(__file__).parent / "data"
T_975_DF2 = 4.302653  # Student's t, 97.5th percentile, 2 degrees of freedom


def arm_result(
    precision: str,
    seed: int,
    accuracy: float,
    memory: float,
    time_s: float,
    *,
    emulated: bool = False,
    resumed: bool = False,
    **hyperparameters: Any,
) -> ArmResults:
    """A training run's results with the given headline figures (CUDA, full CIFAR-10)."""
    resolved = "fp16" if precision == "amp" else precision
    return ArmResults(
        schema_version=RESULTS_SCHEMA_VERSION,
        precision=PrecisionRecord(
            requested=precision,
            resolved=resolved,
            autocast_dtype={"fp16": "float16", "bf16": "bfloat16"}.get(resolved),
            grad_scaler=resolved == "fp16",
            tf32=resolved == "tf32",
            emulated=emulated,
            support="EMULATED: no tensor cores" if emulated else "native",
        ),
        device=DeviceRecord("cuda", "NVIDIA H200", "compute capability 9.0"),
        model="resnet18",
        parameters=11_173_962,
        hyperparameters={
            "seed": seed,
            "epochs": 2,
            "batch_size": 128,
            "lr": 0.1,
            "compile": False,
            "precision": precision,
            **hyperparameters,
        },
        dataset=DatasetRecord("/d", "cifar10", "ab" * 32, 10, [32, 32, 3], IMAGES, 10_000),
        accuracy=accuracy,
        test_loss=1.0,
        timing=Timing(
            train_time_s=time_s,
            throughput_img_s=2 * IMAGES / time_s,
            trained_images=2 * IMAGES,
            end_to_end_s=time_s + 10.0,
            warmup_s=5.0,
            warmup_steps=3,
            compile_s=0.0,
            compile_cache=None,
            eval_s=5.0,
            checkpoint_s=0.0,
            startup=Startup(total_s=6.0 + seed, imports_s=4.0, state_s=2.0 + seed),
        ),
        memory=Memory("cuda_allocated", memory, memory + 300.0, 250.0, memory + 50.0, None),
        skipped_steps=0,
        loss_scale=None,
        resumed_from="/ckpt/ckpt-000000007.pt" if resumed else None,
        versions=Versions("0.1.0", "2.14.1", "0.29.1", "13.0", 91000, "3.12.3"),
        epochs=[
            EpochRecord(
                epoch,
                1.0 + seed,
                0.5,
                1.2,
                accuracy,
                None,
                None,
                time_s / 2,
                IMAGES / (time_s / 2),
                memory,
                0.1,
                1.0,
                0,
            )
            for epoch in (1, 2)
        ],
    )


def with_(run: ArmResults, **changes: Any) -> ArmResults:
    """The run with nested fields replaced: with_(run, device__name="A100")."""
    for path, value in changes.items():
        outer, _, inner = path.partition("__")
        if inner:
            value = dataclasses.replace(getattr(run, outer), **{inner: value})
        run = dataclasses.replace(run, **{outer: value})
    return run


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


def _write(path: Path, run: ArmResults) -> Path:
    write_json(path, run)
    return path


def test_results_files_are_validated_against_the_schema(tmp_path: Path) -> None:
    good = _write(tmp_path / "good.json", arm_result("fp32", 0, 0.7, 1.0, 1.0))
    assert read_arm_results(good) == arm_result("fp32", 0, 0.7, 1.0, 1.0)
    data = json.loads(good.read_text())
    cases = {
        "new.json": ({**data, "schema_version": 7}, r"new\.json: schema version 7 is not one"),
        "none.json": ([1, 2], r"none\.json: not the results of an ampbench training run"),
        "type.json": (
            {**data, "memory": {**data["memory"], "train_peak_mb": "a lot"}},
            r"memory\.train_peak_mb: expected a number, not 'a lot'",
        ),
        "missing.json": (
            {**data, "timing": {k: v for k, v in data["timing"].items() if k != "warmup_s"}},
            r"timing\.warmup_s: missing",
        ),
        "unknown.json": ({**data, "speed": 3}, r"speed: not a field of this schema"),
        "epoch.json": (
            {**data, "epochs": [{**data["epochs"][0], "epoch": 1.5}]},
            r"epochs\[0\]\.epoch: expected a whole number, not 1\.5",
        ),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).write_text(json.dumps(content))
        with pytest.raises(AmpbenchError, match=message):
            read_arm_results(tmp_path / name)


def test_results_of_schema_1_are_upgraded_and_flagged(tmp_path: Path) -> None:
    fp32 = read_arm_results(SCHEMA_1 / "results-v1-fp32.json")
    bf16 = read_arm_results(SCHEMA_1 / "results-v1-bf16.json")
    original = json.loads((SCHEMA_1 / "results-v1-bf16.json").read_text())
    assert bf16.upgraded_from_schema == 1 and bf16.precision.support == UNRECORDED
    assert bf16.timing.train_time_s == original["train_time_s"]
    assert bf16.memory.train_peak_mb == original["peak_memory_mb"]
    assert bf16.precision.resolved == "bf16" and bf16.device.name == original["device_name"]
    comparison = compare_arms({"fp32": [fp32], "bf16": [bf16]})
    assert comparison.speedup == pytest.approx(
        bf16.timing.throughput_img_s / fp32.timing.throughput_img_s
    )
    assert any("schema version 1 (an earlier ampbench" in w for w in comparison.warnings)
    original["hyperparameters"]["batch_size"] = 25
    (tmp_path / "other.json").write_text(json.dumps(original))
    with pytest.raises(AmpbenchError, match=r"batch size \(fp32: 50; bf16: 25\)"):
        compare_arms({"fp32": [fp32], "bf16": [read_arm_results(tmp_path / "other.json")]})
    # Measured by another protocol (schema 2 records its warm-up): refused too.
    protocol_2 = dataclasses.replace(
        bf16, hyperparameters={**bf16.hyperparameters, "warmup_steps": 3}
    )
    with pytest.raises(AmpbenchError, match=r"warmup steps \(fp32: unrecorded; bf16: 3\)"):
        compare_arms({"fp32": [fp32], "bf16": [protocol_2]})
    del original["accuracy"]
    (tmp_path / "broken.json").write_text(json.dumps(original))
    with pytest.raises(AmpbenchError, match=r"broken\.json: not valid ampbench results of schema"):
        read_arm_results(tmp_path / "broken.json")


def test_results_of_schema_2_are_read_without_a_start_up() -> None:
    fp32 = read_arm_results(SCHEMA_2 / "results-v2-fp32.json")
    bf16 = read_arm_results(SCHEMA_2 / "results-v2-bf16.json")
    original = json.loads((SCHEMA_2 / "results-v2-bf16.json").read_text())
    assert original["schema_version"] == 2 and "startup" not in original["timing"]
    assert bf16.schema_version == RESULTS_SCHEMA_VERSION and bf16.upgraded_from_schema == 2
    assert bf16.timing.startup is None
    assert schema.dump(bf16.timing) == {
        **original["timing"],
        "startup": None,
        "compile_cache": None,
    }
    assert bf16.precision.support == original["precision"]["support"]
    comparison = compare_arms({"fp32": [fp32], "bf16": [bf16]})
    # Measured as this version measures: no warning, only the start-up is not known.
    assert not any("schema version" in warning for warning in comparison.warnings)
    assert "Time spent, bf16: start-up not recorded, warm-up " in render_text(comparison)


def test_run_comparison_writes_outputs_and_gates(tmp_path: Path) -> None:
    fp32 = _write(tmp_path / "fp32.json", arm_result("fp32", 0, 0.70, 3000.0, 300.0))
    amp = _write(tmp_path / "amp.json", arm_result("amp", 0, 0.65, 1500.0, 100.0))
    outputs = CompareOutputs.in_directory(tmp_path / "out")
    comparison = run_comparison([fp32, amp], outputs)
    assert read_comparison(outputs.comparison) == comparison
    assert comparison.speedup == pytest.approx(3.0)
    assert "===== RESULTS =====" in outputs.report.read_text()
    assert comparison.accuracy_delta_pp == pytest.approx(-5.0)
    assert sorted(p.name for p in outputs.plots.iterdir()) == sorted(PLOTS)
    for plot in outputs.plots.iterdir():
        assert plot.read_bytes().startswith(b"\x89PNG")
    run_comparison([fp32, amp], outputs, max_accuracy_drop_pp=6.0)
    run_comparison([fp32, amp], outputs, max_accuracy_drop_pp=-1.0)  # -1: no limit
    outputs.comparison.unlink()
    with pytest.raises(AmpbenchError, match=r"lost 5\.00 pp"):
        run_comparison([fp32, amp], outputs, max_accuracy_drop_pp=1.0)
    # The gate fails after the outputs are written, so that the evidence is kept.
    assert outputs.comparison.is_file()


def test_report_states_settings_definitions_and_verdict(tmp_path: Path) -> None:
    fp32 = [arm_result("fp32", s, 0.70, 3000.0, 300.0 + s) for s in range(2)]
    amp = [arm_result("amp", s, 0.69, 1500.0, 100.0 + s) for s in range(2)]
    paths = [_write(tmp_path / f"{r.precision.requested}{r.seed}.json", r) for r in fp32 + amp]
    outputs = CompareOutputs.in_directory(tmp_path / "out")
    comparison = run_comparison(paths, outputs)
    markdown = outputs.report.read_text()
    assert markdown.splitlines()[2] == f"**Verdict.** {comparison.verdict}"  # it opens with it
    settings = ["| model | resnet18 |", "| batch size | 128 |", "| torch | 2.14.1 |"]
    settings += ["| device | NVIDIA H200 (cuda) |", "| seeds | 0, 1 |", "| CUDA | 13.0 |"]
    for setting in settings:
        assert setting in markdown, setting
    assert "Steady-state speedup: training images/s of the arm over" in markdown
    page = outputs.html.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert page.count('src="data:image/png;base64,') == len(PLOTS)
    # Nothing the KFP UI's sandboxed iframe would have to fetch.
    assert not re.search(r"""(src|href)=["'](https?:)?//""", page)
    assert "http://" not in page and "https://" not in page
    assert "===== RESULTS =====" in page and "<table>" in page and "95% CI" in page


def test_mlflow_down_keeps_the_outputs_and_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://user:hunter2@127.0.0.1:9")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    fp32 = _write(tmp_path / "fp32.json", arm_result("fp32", 0, 0.70, 3000.0, 300.0))
    amp = _write(tmp_path / "amp.json", arm_result("amp", 0, 0.65, 1500.0, 100.0))
    outputs = CompareOutputs.in_directory(tmp_path / "out")
    with pytest.raises(AmpbenchError) as raised:
        run_comparison([fp32, amp], outputs, parent_run=ParentRunOptions())
    message = str(raised.value)
    assert message.startswith("MLflow at http://127.0.0.1:9: creating the pipeline's parent run")
    assert "hunter2" not in message and "\n" not in message
    assert read_comparison(outputs.comparison).speedup == pytest.approx(3.0)
    assert outputs.html.is_file()


def test_unreadable_results_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(AmpbenchError, match=r"bad\.json: not a readable results file"):
        run_comparison([bad, bad], CompareOutputs.in_directory(tmp_path))


def test_schema_round_trips_a_comparison() -> None:
    comparison = compare_arms(
        {
            "fp32": [arm_result("fp32", s, 0.7, 3000.0, 300.0 + s) for s in range(2)],
            "amp": [arm_result("amp", s, 0.7, 1500.0, 100.0 + s) for s in range(2)],
        }
    )
    data = json.loads(json.dumps(schema.dump(comparison)))
    assert schema.load(type(comparison), data) == comparison


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
    paths = [_write(tmp_path / f"{i}.json", run) for i, run in enumerate(matrix())]
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
        [_write(tmp_path / f"{i}.json", r) for i, r in enumerate(runs)], outputs
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
