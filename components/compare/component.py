"""The compare step as a KFP lightweight component: a thin wrapper over run_comparison."""

from kfp import dsl

from ampbench import DEFAULT_IMAGE


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def compare(
    baseline_results: dsl.Input[list[dsl.Artifact]],
    amp_results: dsl.Input[list[dsl.Artifact]],
    comparison: dsl.Output[dsl.Artifact],
    report: dsl.Output[dsl.Markdown],
    report_html: dsl.Output[dsl.HTML],
    plots: dsl.Output[dsl.Artifact],
    metrics: dsl.Output[dsl.Metrics],
    baseline_precision: str = "fp32",
    amp_precision: str = "amp",
    experiment: str = "ampbench",
    pipeline_run_id: str = "",
    tracking: bool = True,
    max_accuracy_drop: float = -1.0,
) -> None:
    """Compare the AMP arm with the baseline arm over all seeds; fail on a too-large drop."""
    from pathlib import Path

    from ampbench.components.compare.step import (
        CompareOutputs,
        ParentRunOptions,
        run_comparison,
    )
    from ampbench.errors import reported_as_step
    from ampbench.logs import setup_logging

    setup_logging()
    with reported_as_step("compare"):
        outcome = run_comparison(
            {
                baseline_precision: [Path(a.path) for a in baseline_results],
                amp_precision: [Path(a.path) for a in amp_results],
            },
            CompareOutputs(
                Path(comparison.path), Path(report.path), Path(report_html.path), Path(plots.path)
            ),
            baseline=baseline_precision,
            parent_run=ParentRunOptions(experiment, pipeline_run_id) if tracking else None,
            max_accuracy_drop_pp=max_accuracy_drop if max_accuracy_drop >= 0 else None,
        )
    for key in ("speedup", "memory_ratio", "accuracy_delta_pp"):
        if outcome.get(key) is not None:
            metrics.log_metric(key, outcome[key])
