"""The compare step as a plain function: read the arms' results, write the comparison."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ampbench import PIPELINE_NAME
from ampbench.compare.analysis import compare_runs
from ampbench.compare.plots import write_plots
from ampbench.compare.report import render_html, render_markdown
from ampbench.comparison import Comparison, Prices
from ampbench.errors import AmpbenchError
from ampbench.experiment import ComparisonSettings
from ampbench.logs import log
from ampbench.parent_run import finish_parent_run, open_parent_run
from ampbench.results import RESULTS_FILE, ArmResults, read_arm_results, write_json
from ampbench.tracking import (
    BASELINE_TAG,
    DEFAULT_EXPERIMENT,
    KFP_RUN_TAG,
    PIPELINE_RUN_TAG,
    PIPELINE_TAG,
)
from ampbench.train import BASELINE_PRECISION


@dataclass(frozen=True)
class ParentRunOptions:
    experiment: str = DEFAULT_EXPERIMENT
    pipeline_run_id: str = ""
    run_name: str = ""


# The files a report directory and the parent run's artifacts hold, beside RESULTS_FILE.
REPORT_FILE, HTML_FILE, PLOTS_DIR = "report.md", "report.html", "plots"


@dataclass(frozen=True)
class CompareOutputs:
    """Where the compare step writes: JSON, Markdown, self-contained HTML, a folder of PNGs."""

    comparison: Path
    report: Path
    html: Path
    plots: Path

    @classmethod
    def in_directory(cls, directory: Path) -> CompareOutputs:
        return cls(
            directory / RESULTS_FILE,
            directory / REPORT_FILE,
            directory / HTML_FILE,
            directory / PLOTS_DIR,
        )


def carried(value: float) -> float:
    """A figure to the 4 significant digits it carries (1.787, not 1.7873534340429158)."""
    return float(f"{value:.4g}")


def headline_metrics(comparison: Comparison) -> dict[str, float]:
    """The headline arm's figures and interval bounds, as MLflow and KFP metrics; in a matrix
    also every other arm's, prefixed with its name (`vit-s_b512_bf16.speedup`)."""
    metrics: dict[str, float] = {}
    for name, this in comparison.comparisons.items():
        prefix = "" if name == comparison.headline_arm else name.replace(" ", "_") + "."
        for key in (
            "speedup",
            "end_to_end_ratio",
            "memory_ratio",
            "accuracy_delta_pp",
            "time_to_target_ratio",
            "energy_ratio",
            "cost_saved",
            "end_to_end_cost_saved",
        ):
            estimate = getattr(this, key)
            if estimate is None:
                continue
            metrics[prefix + key] = carried(estimate.value)
            if estimate.low is not None and estimate.high is not None:
                metrics[f"{prefix}{key}_ci95_low"] = carried(estimate.low)
                metrics[f"{prefix}{key}_ci95_high"] = carried(estimate.high)
    return metrics


def run_comparison(
    results: Sequence[Path],
    outputs: CompareOutputs,
    *,
    baseline: str = BASELINE_PRECISION,
    parent_run: ParentRunOptions | None = None,
    max_accuracy_drop_pp: float = ComparisonSettings.max_accuracy_drop,
    allow_mismatch: bool = False,
    prices: Prices | None = None,
) -> Comparison:
    """Compare the training results (any arms and seeds, each arm against its group's
    `baseline` precision) and write the outputs; then fail if an arm lost too much accuracy
    (after writing, so that the evidence is kept)."""
    runs = [read_arm_results(path) for path in results]
    comparison = compare_runs(runs, baseline=baseline, allow_mismatch=allow_mismatch, prices=prices)
    for path in (outputs.comparison, outputs.report, outputs.html):
        path.parent.mkdir(parents=True, exist_ok=True)
    plots = write_plots(comparison, outputs.plots)
    outputs.report.write_text(render_markdown(comparison), encoding="utf-8")
    outputs.html.write_text(render_html(comparison, plots), encoding="utf-8")
    write_json(outputs.comparison, comparison)
    # The outputs are written before MLflow is asked anything: if it fails, they stay.
    if parent_run is not None:
        comparison = _track(comparison, runs, parent_run, outputs, plots)
    log.info("compare: wrote %s, %s and %s", outputs.comparison, outputs.report, outputs.html)
    if max_accuracy_drop_pp >= 0:  # negative: off
        for name, this in comparison.comparisons.items():
            if -this.accuracy_delta_pp.value > max_accuracy_drop_pp:
                raise AmpbenchError(
                    f"--max-accuracy-drop {max_accuracy_drop_pp:g}: arm {name} lost "
                    f"{-this.accuracy_delta_pp.value:.2f} pp of accuracy against {this.baseline}"
                )
    return comparison


def _track(
    comparison: Comparison,
    runs: Sequence[ArmResults],
    parent_run: ParentRunOptions,
    outputs: CompareOutputs,
    plots: Sequence[Path],
) -> Comparison:
    """The comparison as the MLflow parent run of the arms' runs: tags, params, the outputs as
    artifacts and the headline metrics; the comparison JSON rewritten to name the run."""
    baseline = comparison.baseline
    children = [run.mlflow.run_id for run in runs if run.mlflow and run.mlflow.run_id]
    tags = {PIPELINE_TAG: PIPELINE_NAME, BASELINE_TAG: baseline}
    if parent_run.pipeline_run_id:
        tags[PIPELINE_RUN_TAG] = parent_run.pipeline_run_id
        tags[KFP_RUN_TAG] = parent_run.pipeline_run_id
    # What the pipeline run compared, and how: MLflow names params without spaces.
    params = {
        "baseline": baseline,
        "arms": ",".join(comparison.arms),
        **{key.replace(" ", "_"): value for key, value in comparison.settings.items()},
    }
    run_id, experiment_id = open_parent_run(
        parent_run.experiment,
        parent_run.run_name or f"{PIPELINE_NAME}-{parent_run.pipeline_run_id or 'run'}",
        tags,
        params,
        children,
    )
    comparison = dataclasses.replace(
        comparison,
        mlflow={
            "experiment": parent_run.experiment,
            "experiment_id": experiment_id,
            "parent_run_id": run_id,
            "arm_run_ids": ",".join(children),
        },
    )
    write_json(outputs.comparison, comparison)
    artifacts = {
        RESULTS_FILE: outputs.comparison,
        REPORT_FILE: outputs.report,
        HTML_FILE: outputs.html,
        **{f"{PLOTS_DIR}/{plot.name}": plot for plot in plots},
    }
    finish_parent_run(run_id, artifacts, headline_metrics(comparison))
    return comparison
