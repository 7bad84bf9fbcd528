"""The compare step: the RESULTS block, the ratios, the statistics over seeds, the gate."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from ampbench.components.compare.plots import PLOTS
from ampbench.components.compare.report import (
    PUBLISHED,
    compare_arms,
    render_markdown,
    render_text,
    results_block,
)
from ampbench.components.compare.stats import estimate
from ampbench.components.compare.step import CompareOutputs, ParentRunOptions, run_comparison
from ampbench.errors import AmpbenchError

PUBLISHED_BLOCK = """===== RESULTS =====
FP32 Accuracy: 0.7114
FP32 Memory : 3219.65 MB
FP32 Time   : 309.41 sec

Mixed Accuracy: 0.6969
Mixed Memory  : 1916.57 MB
Mixed Time    : 252.56 sec"""


def arm_result(
    precision: str, seed: int, accuracy: float, memory: float, time_s: float
) -> dict[str, Any]:
    return {
        "precision": precision,
        "resolved_precision": "bf16" if precision == "amp" else precision,
        "autocast_dtype": "bfloat16" if precision == "amp" else None,
        "device": "cpu",
        "device_name": "test cpu",
        "model": "small-cnn",
        "memory_kind": "cpu_peak_rss_growth",
        "hyperparameters": {"seed": seed, "epochs": 1, "batch_size": 128, "lr": 0.1},
        "dataset": {"sha256": "ab" * 32, "train_images": 50000},
        "accuracy": accuracy,
        "peak_memory_mb": memory,
        "train_time_s": time_s,
        "throughput_img_s": 1000.0 / time_s,
        "epochs": [{"epoch": 1, "train_loss": 1.0 + seed, "test_accuracy": accuracy}],
    }


def test_results_block_matches_the_published_layout() -> None:
    assert results_block(PUBLISHED["fp32"], PUBLISHED["amp"]) == PUBLISHED_BLOCK


def test_single_seed_ratios_follow_from_the_arms() -> None:
    comparison = compare_arms(
        {
            "fp32": [arm_result("fp32", 0, 0.70, 3000.0, 300.0)],
            "amp": [arm_result("amp", 0, 0.68, 1500.0, 120.0)],
        }
    )
    assert comparison["speedup"] == pytest.approx(2.5)
    assert comparison["memory_ratio"] == pytest.approx(0.5)
    assert comparison["accuracy_delta_pp"] == pytest.approx(-2.0)
    assert comparison["runs"]["fp32"]["accuracy"] == 0.70
    assert comparison["runs"]["amp"]["train_time_s"] == 120.0
    text = render_text(comparison)
    assert "FP32 Time   : 300.00 sec" in text
    assert "Mixed Memory  : 1500.00 MB" in text
    assert "Speedup (fp32 time / amp time): 2.50x" in text
    assert "Accuracy delta (amp - fp32): -2.00 pp" in text


def test_student_t_interval_matches_hand_computation() -> None:
    result = estimate([1.0, 2.0, 3.0])
    # mean 2, sample sd 1, t(0.975, df=2) = 4.302653; half-width = 4.302653 / sqrt(3)
    assert result.mean == pytest.approx(2.0)
    assert result.ci95 == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert estimate([5.0]).ci95 is None


def test_several_seeds_give_means_and_paired_intervals() -> None:
    fp32 = [arm_result("fp32", s, 0.70 + 0.01 * s, 3000.0, 300.0 + 10 * s) for s in range(3)]
    amp = [arm_result("amp", s, 0.69 + 0.01 * s, 1500.0, 100.0 + 10 * s) for s in range(3)]
    comparison = compare_arms({"fp32": fp32, "amp": amp})
    assert comparison["runs"]["fp32"]["train_time_s"] == pytest.approx(310.0)
    assert comparison["runs"]["amp"]["seeds"] == [0, 1, 2]
    assert comparison["speedup"] == pytest.approx(310.0 / 110.0)
    per_seed = [300 / 100, 310 / 110, 320 / 120]
    expected = estimate(per_seed)
    ci = comparison["comparisons"]["amp"]["ci95"]["speedup"]
    assert ci["mean"] == pytest.approx(expected.mean)
    assert ci["ci95_half_width"] == pytest.approx(expected.ci95)
    assert comparison["comparisons"]["amp"]["per_seed"]["accuracy_delta_pp"] == pytest.approx(
        [-1.0, -1.0, -1.0]
    )
    assert "±" in render_markdown(comparison)


def test_runs_of_different_experiments_are_not_compared() -> None:
    other = arm_result("amp", 0, 0.7, 1.0, 1.0)
    other["hyperparameters"]["epochs"] = 5
    with pytest.raises(AmpbenchError, match=r"differ in epochs \(1, 5\)"):
        compare_arms({"fp32": [arm_result("fp32", 0, 0.7, 1.0, 1.0)], "amp": [other]})
    with pytest.raises(AmpbenchError, match=r"arm amp: results of several precisions"):
        compare_arms(
            {
                "fp32": [arm_result("fp32", 0, 0.7, 1.0, 1.0)],
                "amp": [arm_result("amp", 0, 0.7, 1.0, 1.0), arm_result("bf16", 1, 0.7, 1.0, 1.0)],
            }
        )


def test_other_arm_names_are_said_under_the_results_block() -> None:
    comparison = compare_arms(
        {
            "tf32": [arm_result("tf32", 0, 0.70, 3000.0, 300.0)],
            "bf16": [arm_result("bf16", 0, 0.68, 1500.0, 120.0)],
        },
        baseline="tf32",
    )
    assert "(FP32 is arm tf32, Mixed is arm bf16)" in render_text(comparison)


def test_missing_baseline_and_unpaired_seeds_are_errors() -> None:
    with pytest.raises(AmpbenchError, match="baseline arm 'fp32'"):
        compare_arms({"amp": [arm_result("amp", 0, 0.7, 1.0, 1.0)]})
    with pytest.raises(AmpbenchError, match="no seed in common"):
        compare_arms(
            {
                "fp32": [arm_result("fp32", 0, 0.7, 1.0, 1.0)],
                "amp": [arm_result("amp", 1, 0.7, 1.0, 1.0)],
            }
        )


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_run_comparison_writes_outputs_and_gates(tmp_path: Path) -> None:
    fp32 = _write(tmp_path / "fp32.json", arm_result("fp32", 0, 0.70, 3000.0, 300.0))
    amp = _write(tmp_path / "amp.json", arm_result("amp", 0, 0.65, 1500.0, 100.0))
    outputs = CompareOutputs.in_directory(tmp_path / "out")
    comparison = run_comparison({"fp32": [fp32], "amp": [amp]}, outputs)
    assert json.loads(outputs.comparison.read_text())["speedup"] == pytest.approx(3.0)
    assert "===== RESULTS =====" in outputs.report.read_text()
    assert comparison["accuracy_delta_pp"] == pytest.approx(-5.0)
    assert sorted(p.name for p in outputs.plots.iterdir()) == sorted(PLOTS)
    for plot in outputs.plots.iterdir():
        assert plot.read_bytes().startswith(b"\x89PNG")
    run_comparison({"fp32": [fp32], "amp": [amp]}, outputs, max_accuracy_drop_pp=6.0)
    outputs.comparison.unlink()
    with pytest.raises(AmpbenchError, match=r"lost 5\.00 pp"):
        run_comparison({"fp32": [fp32], "amp": [amp]}, outputs, max_accuracy_drop_pp=1.0)
    # The gate fails after the outputs are written, so that the evidence is kept.
    assert outputs.comparison.is_file()


def test_html_report_is_self_contained(tmp_path: Path) -> None:
    fp32 = [arm_result("fp32", s, 0.70, 3000.0, 300.0 + s) for s in range(2)]
    amp = [arm_result("amp", s, 0.69, 1500.0, 100.0 + s) for s in range(2)]
    paths = [_write(tmp_path / f"{r['precision']}{i}.json", r) for i, r in enumerate(fp32 + amp)]
    outputs = CompareOutputs.in_directory(tmp_path / "out")
    run_comparison({"fp32": paths[:2], "amp": paths[2:]}, outputs)
    page = outputs.html.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert page.count('src="data:image/png;base64,') == len(PLOTS)
    # Nothing the KFP UI's sandboxed iframe would have to fetch.
    assert not re.search(r"""(src|href)=["'](https?:)?//""", page)
    assert "http://" not in page and "https://" not in page
    assert "===== RESULTS =====" in page and "<table>" in page and "±" in page


def test_mlflow_down_keeps_the_outputs_and_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://user:hunter2@127.0.0.1:9")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    fp32 = _write(tmp_path / "fp32.json", arm_result("fp32", 0, 0.70, 3000.0, 300.0))
    amp = _write(tmp_path / "amp.json", arm_result("amp", 0, 0.65, 1500.0, 100.0))
    outputs = CompareOutputs.in_directory(tmp_path / "out")
    with pytest.raises(AmpbenchError) as raised:
        run_comparison({"fp32": [fp32], "amp": [amp]}, outputs, parent_run=ParentRunOptions())
    message = str(raised.value)
    assert message.startswith("MLflow at http://127.0.0.1:9: creating the pipeline's parent run")
    assert "hunter2" not in message and "\n" not in message
    assert json.loads(outputs.comparison.read_text())["speedup"] == pytest.approx(3.0)
    assert outputs.html.is_file()


def test_unreadable_results_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(AmpbenchError, match=r"bad\.json"):
        run_comparison({"fp32": [bad], "amp": [bad]}, CompareOutputs.in_directory(tmp_path))
    incomplete = _write(tmp_path / "partial.json", {"train_time_s": 1.0})
    with pytest.raises(AmpbenchError, match=r"partial\.json: not the results .* \(no precision"):
        run_comparison({"fp32": [incomplete]}, CompareOutputs.in_directory(tmp_path))
