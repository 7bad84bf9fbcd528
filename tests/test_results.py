"""Results files read back: upgrades from earlier schema versions (a CUDA run of schema 1
among them), version checks, and the one-line errors for files that are not results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ampbench import schema
from ampbench.comparison import COMPARISON_SCHEMA_VERSION, Estimate, read_comparison
from ampbench.errors import AmpbenchError
from ampbench.old_results import UNRECORDED
from ampbench.results import RESULTS_SCHEMA_VERSION, read_arm_results, write_json

DATA = Path(__file__).parent / "data"


def schema_1_cuda_fp16() -> dict:
    """The schema-1 bf16 file as a CUDA fp16 run of two epochs would have written it."""
    old = json.loads((DATA / "results-v1-bf16.json").read_text())
    epoch = old["epochs"][0]
    old.update(
        precision="amp",
        resolved_precision="fp16",
        autocast_dtype="float16",
        grad_scaler=True,
        device="cuda",
        device_name="NVIDIA A100-SXM4-80GB",
        memory_kind="cuda_max_allocated",
        peak_memory_mb=1900.5,
        peak_memory_reserved_mb=2100.0,
        train_time_s=40.0,
        throughput_img_s=None,
        eval_time_s=3.0,
        compile_time_s=7.0,
        checkpoint_time_s=None,
        loss_scale=32768.0,
        skipped_steps=2,
        epochs=[
            {**epoch, "epoch": 1, "time_s": 25.0, "loss_scale": 65536.0, "skipped_steps": 1},
            {**epoch, "epoch": 2, "time_s": 15.0, "loss_scale": 32768.0, "skipped_steps": 1},
        ],
    )
    old["hyperparameters"].update(precision="amp", epochs=2, batch_size=30)
    return old


def test_a_schema_3_result_is_read_as_compiled_without_a_shared_cache(tmp_path: Path) -> None:
    """Schema 3 had no compile cache: its results read as schema 4's with none, the rest
    unchanged (schema 2's fixture, upgraded once, is a schema 3 document)."""
    from ampbench.old_results import upgrade_v2

    fixture = Path(__file__).parent / "data" / "results-v2-bf16.json"
    version_3 = upgrade_v2(json.loads(fixture.read_text()))
    version_3.pop("upgraded_from_schema")
    (tmp_path / "v3.json").write_text(json.dumps(version_3))
    run = read_arm_results(tmp_path / "v3.json")
    assert run.schema_version == 4 == RESULTS_SCHEMA_VERSION and run.upgraded_from_schema == 3
    assert schema.dump(run.timing) == {**version_3["timing"], "compile_cache": None}


def test_a_schema_1_cuda_result_is_upgraded_with_its_figures_kept(tmp_path: Path) -> None:
    (tmp_path / "v1.json").write_text(json.dumps(schema_1_cuda_fp16()))
    run = read_arm_results(tmp_path / "v1.json")
    assert run.schema_version == RESULTS_SCHEMA_VERSION and run.upgraded_from_schema == 1
    assert (run.device.type, run.device.name) == ("cuda", "NVIDIA A100-SXM4-80GB")
    assert run.device.capability == run.precision.support == UNRECORDED
    assert schema.dump(run.precision) == {
        "requested": "amp", "resolved": "fp16", "autocast_dtype": "float16",
        "grad_scaler": True, "tf32": False, "emulated": False, "support": UNRECORDED,
    }  # fmt: skip
    # CUDA's allocated peak keeps its kind; the reserved peak is the only one recorded.
    assert schema.dump(run.memory) == {
        "kind": "cuda_allocated", "train_peak_mb": 1900.5, "total_peak_mb": 1900.5,
        "resident_mb": 0.0, "train_peak_reserved_mb": 2100.0, "total_peak_reserved_mb": 2100.0,
        "nvml_used_mb": None,  # not recorded then
    }  # fmt: skip
    # 100 images at batch 30: 3 full steps an epoch, 90 images, 2 epochs.
    timing = run.timing
    assert timing.trained_images == 180
    assert timing.throughput_img_s == pytest.approx(180 / 40.0)
    assert timing.end_to_end_s == pytest.approx(7.0 + 40.0 + 3.0)
    assert (timing.warmup_s, timing.compile_s, timing.warmup_steps) == (7.0, 7.0, 0)
    assert (timing.eval_s, timing.checkpoint_s, timing.startup) == (3.0, 0.0, None)
    assert [e.throughput_img_s for e in run.epochs] == pytest.approx([90 / 25.0, 90 / 15.0])
    assert [(e.loss_scale, e.skipped_steps) for e in run.epochs] == [(65536.0, 1), (32768.0, 1)]
    assert (run.skipped_steps, run.loss_scale) == (2, 32768.0)
    assert run.dataset.image_shape == [] and run.dataset.train_images == 100


def test_a_schema_1_cpu_result_keeps_its_recorded_throughput_and_memory_kind() -> None:
    original = json.loads((DATA / "results-v1-fp32.json").read_text())
    run = read_arm_results(DATA / "results-v1-fp32.json")
    assert run.memory.kind == "cpu_rss" and run.memory.train_peak_reserved_mb is None
    assert run.timing.throughput_img_s == original["throughput_img_s"]
    assert run.epochs[0].train_peak_memory_mb == original["epochs"][0]["peak_memory_mb"]
    assert run.epochs[0].lr == original["epochs"][0]["lr"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{broken", r"bad\.json: not a readable results file"),
        ("[1, 2]", r"bad\.json: not the results of an ampbench training run \(no schema_version"),
        ('{"schema_version": 99}', r"bad\.json: schema version 99 is not one this ampbench reads"),
        ('{"schema_version": 2}', r"bad\.json: not valid ampbench results of schema version 2"),
        (
            json.dumps({"schema_version": RESULTS_SCHEMA_VERSION, "model": "x"}),
            r"bad\.json: not valid ampbench results \(",
        ),
    ],
)
def test_a_file_that_is_not_results_is_one_line_naming_it(
    tmp_path: Path, content: str, message: str
) -> None:
    (tmp_path / "bad.json").write_text(content)
    with pytest.raises(AmpbenchError, match=message) as caught:
        read_arm_results(tmp_path / "bad.json")
    assert "\n" not in str(caught.value)


def test_a_comparison_file_of_another_version_is_refused(tmp_path: Path) -> None:
    (tmp_path / "comparison.json").write_text('{"schema_version": 1}')
    with pytest.raises(AmpbenchError, match=r"comparison\.json: schema version 1 is not one"):
        read_comparison(tmp_path / "comparison.json")
    (tmp_path / "comparison.json").write_text("{")
    with pytest.raises(AmpbenchError, match=r"comparison\.json: not a readable comparison"):
        read_comparison(tmp_path / "comparison.json")


def test_records_are_written_as_indented_json_into_new_folders(tmp_path: Path) -> None:
    write_json(tmp_path / "new" / "folder" / "estimate.json", Estimate(1.5, 1.2, 1.8, 3))
    text = (tmp_path / "new" / "folder" / "estimate.json").read_text()
    assert json.loads(text) == {"value": 1.5, "low": 1.2, "high": 1.8, "n": 3}
    assert text.startswith('{\n  "value"') and text.endswith("}\n")


@pytest.mark.parametrize(
    ("low", "high", "reference", "expected"),
    [
        (1.1, 1.3, 1.0, True),
        (0.7, 0.9, 1.0, True),
        (0.9, 1.1, 1.0, False),
        (1.0, 1.2, 1.0, False),  # an end of the interval is inside it
        (0.8, 1.0, 1.0, False),
        (None, None, 1.0, None),
        (None, 1.2, 1.0, None),  # half an interval is none
        (0.8, None, 1.0, None),
    ],
)
def test_an_interval_excludes_a_reference_only_when_wholly_on_one_side(
    low: float | None, high: float | None, reference: float, expected: bool | None
) -> None:
    assert Estimate(1.0, low, high, 3).excludes(reference) is expected


def test_a_schema_1_result_keeps_what_it_recorded_beyond_the_figures(tmp_path: Path) -> None:
    old = schema_1_cuda_fp16()
    old.update(
        compile_time_s=None, eval_time_s=None, checkpoint_time_s=2.5,
        mlflow={"tracking_uri": "http://mlflow:5000", "experiment": "ampbench", "run_id": "abc"},
        requested_resources={"gpu_type": "a100", "gpu_count": 1, "cpu": "4", "memory": "16Gi"},
    )  # fmt: skip
    old["epochs"][0].update(val_loss=1.25, val_accuracy=0.5)
    (tmp_path / "v1.json").write_text(json.dumps(old))
    run = read_arm_results(tmp_path / "v1.json")
    timing = run.timing
    assert (timing.warmup_s, timing.compile_s, timing.eval_s, timing.checkpoint_s) == (
        0.0, 0.0, 0.0, 2.5
    )  # fmt: skip
    assert timing.end_to_end_s == pytest.approx(40.0 + 2.5)
    assert [(e.val_loss, e.val_accuracy) for e in run.epochs] == [(1.25, 0.5), (None, None)]
    assert schema.dump(run.mlflow) == old["mlflow"]
    assert schema.dump(run.requested_resources) == old["requested_resources"]
    assert run.hyperparameters == old["hyperparameters"]
    assert (run.model, run.parameters, run.accuracy, run.test_loss) == (
        old["model"], old["parameters"], old["accuracy"], old["test_loss"]
    )  # fmt: skip


@pytest.mark.parametrize("content", ['{"model": "x"}', '["schema_version"]'])
def test_json_without_a_schema_version_is_named(tmp_path: Path, content: str) -> None:
    (tmp_path / "bad.json").write_text(content)
    with pytest.raises(AmpbenchError) as results:
        read_arm_results(tmp_path / "bad.json")
    assert str(results.value) == (
        f"{tmp_path / 'bad.json'}: not the results of an ampbench training run (no schema_version)"
    )
    with pytest.raises(AmpbenchError) as comparison:
        read_comparison(tmp_path / "bad.json")
    assert str(comparison.value) == (
        f"{tmp_path / 'bad.json'}: not an ampbench comparison (no schema_version)"
    )


def test_the_errors_of_files_that_are_not_results_in_full(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"schema_version": 99}')
    with pytest.raises(AmpbenchError) as unknown:
        read_arm_results(path)
    assert str(unknown.value) == (
        f"{path}: schema version 99 is not one this ampbench reads ({RESULTS_SCHEMA_VERSION}); "
        "produce it again with this version"
    )
    path.write_text('{"schema_version": 1}')
    with pytest.raises(AmpbenchError) as malformed:
        read_arm_results(path)
    assert str(malformed.value) == (
        f"{path}: not valid ampbench results of schema version 1 (KeyError('hyperparameters') "
        "missing or malformed)"
    )
    path.write_text(json.dumps({"schema_version": COMPARISON_SCHEMA_VERSION, "fp32": 1}))
    with pytest.raises(AmpbenchError) as invalid:
        read_comparison(path)
    assert str(invalid.value).startswith(f"{path}: not a valid ampbench comparison (")
