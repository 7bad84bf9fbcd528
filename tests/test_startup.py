"""The process's own start-up in an arm's results: read from the kernel's start time, split at
the device's readiness, and recorded by a real training process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ampbench.cli import COMMANDS
from ampbench.process import StartupClock, process_age_s
from ampbench.results import Startup, read_arm_results

PROBE = "from ampbench.process import process_age_s; print(process_age_s())"


def test_a_process_age_counts_from_the_kernels_start_time() -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", f"import time; time.sleep(1.0); {PROBE}"],
        capture_output=True,
        text=True,
        check=True,
    )
    outside = time.monotonic() - started
    age = float(done.stdout)
    # The interpreter's start and the sleep count; the clock tick is 10 ms.
    assert 1.0 <= age <= outside + 0.02


def test_a_command_name_with_spaces_and_parentheses_is_read_past(tmp_path: Path) -> None:
    ticks = os.sysconf("SC_CLK_TCK")
    boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    started = int((boot - 30.0) * ticks)
    after_name = ["S", "1", *["0"] * 17, str(started), "0"]  # fields 3 to 23
    stat = tmp_path / "stat"
    stat.write_text(f"4242 (a) b (c)) {' '.join(after_name)}\n")
    assert process_age_s(stat) == pytest.approx(30.0, abs=0.1)
    stat.write_text("4242 (truncated")
    assert process_age_s(stat) is None
    assert process_age_s(tmp_path / "missing") is None


def test_the_clock_splits_the_start_up_at_the_device() -> None:
    clock = StartupClock()
    assert clock.record() is None  # not ready yet
    time.sleep(0.05)
    clock.state_ready()
    record = clock.record()
    assert record is not None and record.state_s >= 0.04
    assert record.total_s == pytest.approx(record.imports_s + record.state_s)


# Runs `ampbench` and says, as the process ends, which of KFP and MLflow it imported.
AMPBENCH_AND_TELL = (
    "import atexit, sys\n"
    "from ampbench.cli import main\n"
    "atexit.register(lambda: print([m for m in ('kfp', 'mlflow') if m in sys.modules]))\n"
    "sys.exit(main(sys.argv[1:]))"
)


def test_the_list_of_commands_builds_no_command() -> None:
    """`ampbench --help` lists every command without importing what their options need
    (submit's would import KFP)."""
    done = subprocess.run(
        [sys.executable, "-c", AMPBENCH_AND_TELL, "--help"],
        check=True,
        capture_output=True,
        text=True,
    )
    assert done.stdout.splitlines()[-1] == "[]"
    for command in COMMANDS:
        assert re.search(rf"^ +{command} +\S", done.stdout, re.MULTILINE), command


def test_a_training_process_records_its_start_up(synthetic_dataset: Path, tmp_path: Path) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable, "-c", AMPBENCH_AND_TELL, "train", "--dataset", str(synthetic_dataset),
            "--precision", "fp32", "--model", "small-cnn", "--epochs", "1", "--subset", "64",
            "--batch-size", "32", "--no-tracking", "--output-dir", str(tmp_path),
        ],
        check=True,
        capture_output=True,
        text=True,
    )  # fmt: skip
    wall = time.monotonic() - started
    # Untracked, it needs neither, and their imports would be seconds of its start-up.
    assert done.stdout.splitlines()[-1] == "[]"
    results = read_arm_results(tmp_path / "results.json")
    startup = results.timing.startup
    assert isinstance(startup, Startup)
    # Importing torch alone takes longer than a tenth of a second; reading 64 images and
    # building a small CNN takes some time too.
    assert startup.imports_s > 0.1 and startup.state_s > 0
    assert startup.total_s == pytest.approx(startup.imports_s + startup.state_s)
    assert startup.total_s + results.timing.end_to_end_s < wall
