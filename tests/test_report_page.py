"""The report page of a real small run, rendered in headless Chromium (Debian's package, driven
by Playwright): its headline figures are the comparison's, its charts are there and loaded,
and nothing is wider than a 1280 px viewport. The screenshot is kept as a test output."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import require

from ampbench.compare.report import headline_figures
from ampbench.compare.step import CompareOutputs, run_comparison
from ampbench.comparison import Prices
from ampbench.train.config import TrainConfig
from ampbench.train.step import run_training

CHROMIUM = Path("/usr/bin/chromium")
VIEWPORT = {"width": 1280, "height": 900}
# Where the screenshot is kept (ignored by git), beside the run's own copy in tmp_path.
SCREENSHOT = Path(__file__).resolve().parent.parent / "test-output" / "report-page.png"
# As the environment runs Chromium headless as root, with the network's background calls off.
ARGUMENTS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def report(synthetic_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """Two arms trained for real (small-cnn, a few steps), compared with a price."""
    work = tmp_path_factory.mktemp("report-page")
    results = []
    for precision in ("fp32", "bf16"):
        config = TrainConfig(
            dataset_dir=synthetic_dataset, precision=precision, model="small-cnn", device="cpu",
            epochs=2, batch_size=50, subset=300, profile_steps=3, allow_emulated=True,
        )  # fmt: skip
        out = work / precision
        run_training(config, out / "results.json", out / "model.pt", trace_path=out / "trace")
        results.append(out / "results.json")
    outputs = CompareOutputs.in_directory(work / "compare")
    comparison = run_comparison(results, outputs, prices=Prices(2.5, None))
    return comparison, outputs.html


def test_the_page_opens_with_the_comparison_s_answer_and_fits_1280_px(
    report: tuple, tmp_path: Path
) -> None:
    require(CHROMIUM.is_file(), f"{CHROMIUM} is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    comparison, html = report
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGUMENTS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(html.as_uri())
            shown = {
                key: page.inner_text(f'[data-figure="{key}"] .value')
                for key, _, _ in headline_figures(comparison)
            }
            charts = {
                name: page.evaluate(
                    f"() => {{ const i = document.getElementById('plot-{name}');"
                    " return i ? i.complete && i.naturalWidth : 0; }"
                )
                for name in ("throughput", "time_spent", "curves")
            }
            widest = page.evaluate(
                "() => Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)"
            )
            first = page.evaluate("() => document.querySelector('h1').nextElementSibling.id")
            settings_open = page.evaluate("() => document.getElementById('settings').open")
            shot = tmp_path / "report-page.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    SCREENSHOT.parent.mkdir(exist_ok=True)
    shutil.copyfile(shot, SCREENSHOT)
    this = comparison.comparisons[comparison.headline_arm]
    # The headline figures are the comparison's own, as the page prints them.
    assert shown["speedup"].startswith(f"{this.speedup.value:.2f}x")
    assert shown["accuracy_delta"].startswith(f"{this.accuracy_delta_pp.value:+.2f} pp")
    assert shown["energy_ratio"].startswith("n/a")  # no energy counter on this machine
    assert this.cost_saved is not None
    assert (
        shown["cost_saved"]
        == dict((k, v) for k, _, v in headline_figures(comparison))["cost_saved"]
    )
    assert first == "headline"  # the page opens with the answer
    assert all(width > 0 for width in charts.values()), charts
    assert widest <= VIEWPORT["width"], widest
    assert settings_open is False  # the settings are folded, at the end
    assert shot.stat().st_size > 10_000
