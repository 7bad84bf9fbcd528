"""The compare step's files: results validated against the schema and upgraded from older
ones, the outputs written and the accuracy gate, the report, a comparison's round trip."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from arms import SCHEMA_1, SCHEMA_2, arm_result, write_results

from ampbench import schema
from ampbench.compare.analysis import (
    compare_arms,
)
from ampbench.compare.plots import PLOTS
from ampbench.compare.report import render_text
from ampbench.compare.step import CompareOutputs, ParentRunOptions, run_comparison
from ampbench.comparison import read_comparison
from ampbench.errors import AmpbenchError
from ampbench.old_results import UNRECORDED
from ampbench.results import (
    RESULTS_SCHEMA_VERSION,
    read_arm_results,
)


def test_results_files_are_validated_against_the_schema(tmp_path: Path) -> None:
    good = write_results(tmp_path / "good.json", arm_result("fp32", 0, 0.7, 1.0, 1.0))
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
    fp32 = write_results(tmp_path / "fp32.json", arm_result("fp32", 0, 0.70, 3000.0, 300.0))
    amp = write_results(tmp_path / "amp.json", arm_result("amp", 0, 0.65, 1500.0, 100.0))
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
    paths = [
        write_results(tmp_path / f"{r.precision.requested}{r.seed}.json", r) for r in fp32 + amp
    ]
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
    fp32 = write_results(tmp_path / "fp32.json", arm_result("fp32", 0, 0.70, 3000.0, 300.0))
    amp = write_results(tmp_path / "amp.json", arm_result("amp", 0, 0.65, 1500.0, 100.0))
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
