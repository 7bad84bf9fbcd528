"""The compare step as a KFP lightweight component: a thin wrapper over run_comparison."""

from kfp import dsl

from ampbench import DEFAULT_IMAGE
from ampbench.components.defaults import with_defaults
from ampbench.experiment import ArmSettings, ComparisonSettings, TrackingSettings, section_defaults

# Each parameter's default is the experiment's (ampbench/experiment.py).
DEFAULTS = {
    "baseline_precision": ArmSettings.baseline_precision,
    "experiment": TrackingSettings.experiment,
    "tracking": TrackingSettings.tracking,
    **section_defaults(ComparisonSettings),
}


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
@with_defaults(DEFAULTS)
def compare(
    results: dsl.Input[list[dsl.Artifact]],
    comparison: dsl.Output[dsl.Artifact],
    report: dsl.Output[dsl.Markdown],
    report_html: dsl.Output[dsl.HTML],
    plots: dsl.Output[dsl.Artifact],
    metrics: dsl.Output[dsl.Metrics],
    baseline_precision: str,
    experiment: str,
    tracking: bool,
    max_accuracy_drop: float,
    allow_mismatch: bool,
    gpu_hour_price: float,
    energy_price: float,
    pipeline_run_id: str = "",
) -> None:
    """Compare every arm with its (model, batch size) group's baseline arm over all seeds;
    fail on a too-large drop.

    allow_mismatch: compare arms that differ in more than precision (say, GPU models), with a
    warning in the report, instead of refusing.
    gpu_hour_price, energy_price: what each arm's cost is priced at (0: no price).
    """
    from pathlib import Path

    from ampbench.compare.step import (
        CompareOutputs,
        ParentRunOptions,
        headline_metrics,
        run_comparison,
    )
    from ampbench.comparison import Prices
    from ampbench.errors import reported_as_step
    from ampbench.logs import setup_logging

    with reported_as_step("compare"):
        setup_logging()  # a malformed $RANK is one line too
        outcome = run_comparison(
            [Path(artifact.path) for artifact in results],
            CompareOutputs(
                Path(comparison.path), Path(report.path), Path(report_html.path), Path(plots.path)
            ),
            baseline=baseline_precision,
            parent_run=ParentRunOptions(experiment, pipeline_run_id) if tracking else None,
            max_accuracy_drop_pp=max_accuracy_drop,
            allow_mismatch=allow_mismatch,
            prices=Prices.given(gpu_hour_price, energy_price),
        )
    for key, value in headline_metrics(outcome).items():
        metrics.log_metric(key, value)
