"""A newcomer's first hour: their own small ImageFolder set (3 classes, 90 training images) run
with no option but --data and --model (and --allow-emulated, so that any CPU runs the amp arm),
its content prepared earlier from another path; one log format on the terminal, the line count
the README states, the provenance they passed, and MLflow's compare page one address away,
opened in headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import require
from datagen import make_image_folder
from test_report_page import ARGUMENTS, CHROMIUM

from ampbench.comparison import read_comparison
from ampbench.results import read_arm_results

REPO = Path(__file__).resolve().parent.parent
LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d (INFO|WARNING|ERROR) ")
PROGRESS = re.compile(r"^\d\d:\d\d:\d\d INFO (?P<what>.+): \d+/\d+ \w+ \(\d+%\), .* ETA ")
# The README's statement of what a one-seed run of two arms prints.
README_COUNT = re.compile(r"prints (\d+) lines\s+besides\s+its\s+WARNING\s+lines")


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("first-hour")
    make_image_folder(
        work / "elsewhere" / "flowers", ["daisy", "rose", "tulip"], {"train": 30, "test": 10},
        size=(48, 48),
    )  # fmt: skip
    shutil.copytree(work / "elsewhere" / "flowers", work / "flowers")
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}",
        "XDG_CACHE_HOME": str(work / "cache"),
    }
    ampbench = [sys.executable, "-m", "ampbench.cli"]
    # The same content, prepared before from another path: the run's prepare is a cache hit.
    earlier = [*ampbench, "prepare", "--data", str(work / "elsewhere" / "flowers")]
    subprocess.run(
        [*earlier, "--output-dir", str(work / "earlier")], env=env, check=True, timeout=300
    )
    command = [*ampbench, "run", "--data", "flowers", "--model", "small-cnn", "--allow-emulated"]
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (out,) = (work / "runs").iterdir()
    # The terminal: ampbench's lines on stderr, the steps' (through the runner) and the results
    # on stdout; the log ends where the RESULTS block starts.
    terminal = done.stderr.splitlines() + done.stdout.splitlines()
    end = terminal.index("===== RESULTS =====")
    return {
        "work": work, "env": env, "out": out, "stdout": done.stdout,
        "log": terminal[:end], "results": terminal[end:],
    }  # fmt: skip


def test_a_small_set_of_ones_own_runs_with_the_defaults(first_run: dict[str, Any]) -> None:
    """No --batch-size: the 90 training images get batches of 8 (11 steps an epoch), said in
    each train task's log; 128 is named nowhere as if it had been asked for."""
    log = "\n".join(first_run["log"])
    assert log.count("batch 8 (automatic): 11 steps an epoch of the 90 training images") == 2
    assert "--batch-size 128" not in log
    comparison = read_comparison(first_run["out"] / "results.json")
    assert list(comparison.arms) == ["fp32", "amp"]
    arms = sorted((first_run["out"] / "pipeline-root").rglob("results"))
    assert arms and {read_arm_results(path).hyperparameters["batch_size"] for path in arms} == {8}


def test_the_terminal_has_one_format_and_the_readme_s_line_count(
    first_run: dict[str, Any],
) -> None:
    """Every log line is ampbench's (the runner's task lines rewritten so), every arm shows its
    progress in every epoch, and the lines the README says a run prints are the lines it prints
    (a progress line every 10 s of a long epoch, and WARNING lines, come on top)."""
    logged = first_run["log"]
    assert logged and all(LOG_LINE.match(line) for line in logged), "\n".join(logged)
    assert not any(" - INFO - " in line for line in logged)
    progress = [match["what"] for line in logged if (match := PROGRESS.match(line))]
    for arm in ("fp32", "bf16"):
        assert {f"train {arm} epoch 1/2", f"train {arm} epoch 2/2"} <= set(progress), progress
    printed = logged + first_run["results"]
    repeated = len(progress) - len(set(progress))  # the interval's lines after each first one
    warnings = [line for line in printed if line.startswith("WARNING:") or " WARNING " in line]
    (stated,) = README_COUNT.findall((REPO / "README.md").read_text())
    assert len(printed) - repeated - len(warnings) == int(stated), "\n".join(printed)


def test_the_report_names_what_was_passed(first_run: dict[str, Any]) -> None:
    """The data source the user typed (not the earlier preparer's path, which is named apart),
    the subset in effect, "off" for what is off, and no CIFAR figures beside 3 classes."""
    assert "cache hit for flowers" in "\n".join(first_run["log"])
    comparison = read_comparison(first_run["out"] / "results.json")
    settings = comparison.settings
    assert settings["dataset source"] == "flowers"
    assert settings["dataset cached from"] == str(first_run["work"] / "elsewhere" / "flowers")
    assert settings["subset"] == "all"
    assert (settings["target accuracy"], settings["image size"]) == ("off", "as prepared")
    report = (first_run["out"] / "report.md").read_text()
    assert "| dataset source | flowers |" in report and "| target accuracy | off |" in report
    assert "Not set beside the published run: this run trained on 3 classes of 48x48" in report
    assert "0.7114" not in report and "309.41" not in report


def test_the_printed_compare_address_opens_mlflow_s_compare_page_with_both_arms(
    first_run: dict[str, Any],
) -> None:
    require(CHROMIUM.is_file(), f"{CHROMIUM} is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright
    from services import free_port

    printed = re.search(r"^compare : (http://\S+) ", first_run["stdout"], re.MULTILINE)
    assert printed, first_run["stdout"][-2000:]
    port = free_port()
    ui = subprocess.Popen(
        [sys.executable, "-m", "ampbench.cli", "ui", "--port", str(port)],
        cwd=first_run["work"], env=first_run["env"], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        lines = []
        while not any("side by side" in line for line in lines):
            line = ui.stdout.readline()  # type: ignore[union-attr]
            assert line, "".join(lines)
            lines.append(line)
        address = lines[-1].rsplit(" ", 1)[-1].strip()
        # The run printed the same page, at the default port of `ampbench ui`.
        assert address.split("/#/")[1] == printed[1].split("/#/")[1]
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline and ui.poll() is None, "the UI did not answer"
                time.sleep(0.5)
        arm_runs = sorted(
            read_arm_results(path).mlflow.run_id  # type: ignore[union-attr]
            for path in (first_run["out"] / "pipeline-root").rglob("results")
        )
        assert len(arm_runs) == 2 and all(arm_runs)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGUMENTS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(address)
                page.get_by_text("Comparing 2 Runs").first.wait_for(timeout=60_000)
                for run_id in arm_runs:  # the page's Run ID row
                    page.get_by_text(run_id).first.wait_for(timeout=30_000)
                page.screenshot(path=str(first_run["work"] / "compare.png"))
            finally:
                browser.close()
    finally:
        os.killpg(ui.pid, 15)
        ui.wait(timeout=60)
