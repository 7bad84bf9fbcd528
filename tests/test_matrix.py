"""The experiment matrix's run list: made once (matrix_runs), checked before training
(check_runs), one line per mistake."""

from __future__ import annotations

import pytest

from ampbench.errors import AmpbenchError
from ampbench.matrix import DEFAULT_RUNS, check_runs, matrix_runs


def test_the_default_is_the_published_pair() -> None:
    assert DEFAULT_RUNS == [
        {"model": "resnet18", "batch_size": 128, "precision": "fp32", "seed": 0},
        {"model": "resnet18", "batch_size": 128, "precision": "amp", "seed": 0},
    ]


def test_every_group_gets_its_baseline_first() -> None:
    runs = matrix_runs(["resnet18", "vit-s"], [128, 512], ["bf16", "fp32", "fp16"], [0, 1])
    assert len(runs) == 2 * 2 * 3 * 2
    groups: dict[tuple[str, int], list[str]] = {}
    for run in runs:
        groups.setdefault((run["model"], run["batch_size"]), []).append(run["precision"])
    assert list(groups) == [("resnet18", 128), ("resnet18", 512), ("vit-s", 128), ("vit-s", 512)]
    assert all(p == ["fp32", "fp32", "bf16", "bf16", "fp16", "fp16"] for p in groups.values())
    assert check_runs(runs, "fp32")[0].precision == "fp32"
    with pytest.raises(AmpbenchError, match="only the baseline 'fp32' is listed"):
        matrix_runs(["resnet18"], [128], ["fp32"], [0])


BAD_RUNS = [
    ([], "runs: must be a non-empty list"),
    ("fp32", "runs: must be a non-empty list"),
    ([{"model": "resnet18"}], r"runs\[0\]: must have exactly the keys batch_size, model"),
    ([{**DEFAULT_RUNS[0], "batch_size": 12.5}], r"runs\[0\]: batch_size must be an integer"),
    ([{**DEFAULT_RUNS[0], "batch_size": True}], r"runs\[0\]: batch_size must be an integer"),
    ([{**DEFAULT_RUNS[0], "seed": "0"}], r"runs\[0\]: seed must be an integer"),
    ([{**DEFAULT_RUNS[0], "batch_size": -1}], r"runs\[0\]: batch_size must be at least 1"),
    ([{**DEFAULT_RUNS[0], "model": ""}], r"runs\[0\]: model must be a non-empty string"),
    ([DEFAULT_RUNS[0], {**DEFAULT_RUNS[1], "precision": "fp8x"}], r"runs\[1\]: precision 'fp8x'"),
    ([*DEFAULT_RUNS, DEFAULT_RUNS[1]], r"runs: MatrixRun\(.*'amp'.*\) is listed twice"),
    ([DEFAULT_RUNS[1]], r"runs: model resnet18 at batch size 128 has no fp32 run"),
    ([DEFAULT_RUNS[0]], r"runs: only baseline \(fp32\) runs"),
]


@pytest.mark.parametrize(("runs", "message"), BAD_RUNS)
def test_a_bad_run_list_is_one_line(runs: object, message: str) -> None:
    with pytest.raises(AmpbenchError, match=message) as refused:
        check_runs(runs, "fp32")
    assert "\n" not in str(refused.value)


def test_kfp_floats_are_whole_numbers() -> None:
    # A JSON list passed through KFP may come back with 128.0 for 128.
    runs = [{**run, "batch_size": 128.0, "seed": 0.0} for run in DEFAULT_RUNS]
    parsed = check_runs(runs, "fp32")
    assert [type(run.batch_size) for run in parsed] == [int, int]
