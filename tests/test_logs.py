"""Progress and logging: rate and ETA in plain lines under KFP, one voice per data-parallel job."""

from __future__ import annotations

import logging

import pytest

from ampbench.logs import Progress, log, setup_logging


def test_plain_progress_speaks_at_once_then_every_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """However short the work (an epoch of one step), its first update is a line; the next
    waits for the interval."""
    setup_logging()
    log.propagate = True
    try:
        with caplog.at_level(logging.INFO, logger="ampbench"):
            with Progress(1, "short", "step", interval=3600) as bar:
                bar.update()
            with Progress(10, "long", "step", interval=3600) as bar:
                for _ in range(10):
                    bar.update()
        lines = [r.getMessage() for r in caplog.records]
        assert [line.split(":")[0] for line in lines] == ["short", "long"]
        assert lines[0].startswith("short: 1/1 step (100%)")
        assert lines[1].startswith("long: 1/10 step (10%)")
    finally:
        log.propagate = False


def test_plain_progress_lines_carry_count_rate_and_eta(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup_logging()
    log.propagate = True
    try:
        with (
            caplog.at_level(logging.INFO, logger="ampbench"),
            Progress(100, "decoding", "img", interval=0) as bar,
        ):
            for _ in range(4):
                bar.update(10)
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("decoding")]
        assert lines and lines[-1].startswith("decoding: 40/100 img (40%)")
        assert "img/s" in lines[-1] and "ETA " in lines[-1] and "ETA ?" not in lines[-1]
    finally:
        log.propagate = False


def test_only_rank_zero_speaks_at_info(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    setup_logging()
    try:
        assert log.level == logging.WARNING
        assert "[rank 1/2]" in log.handlers[0].formatter._fmt  # type: ignore[union-attr]
        progress = Progress(10, "x")
        assert progress._bar is None and not progress._plain
    finally:
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(name)
        setup_logging()
    assert log.level == logging.INFO


def test_credentials_never_leave_in_uris_or_error_lines() -> None:
    from ampbench.tracking import describe, without_credentials

    assert without_credentials("http://u:p@ss@mlflow:5000/x?a=@b") == "http://mlflow:5000/x?a=@b"
    assert without_credentials("sqlite:////tmp/mlflow.db") == "sqlite:////tmp/mlflow.db"
    error = RuntimeError("API request to https://bob:s3cret@mlflow.example/api failed")
    line = describe(error)
    assert "s3cret" not in line and "bob" not in line
    assert line == "RuntimeError: API request to https://mlflow.example/api failed"


def test_a_malformed_torchrun_environment_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ampbench.cli import main

    monkeypatch.setenv("RANK", "zero")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    code = main(["train", "--dataset", "d", "--precision", "fp32", "--output-dir", "o"])
    assert code == 1
    assert capsys.readouterr().err == (
        "ampbench: error: $RANK: 'zero' is not a whole number (torchrun sets it)\n"
    )
