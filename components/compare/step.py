"""The compare step as a plain function: read the arms' results, write the comparison."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ampbench.components.compare.report import compare_arms, render_markdown
from ampbench.errors import AmpbenchError
from ampbench.logs import log
from ampbench.tracking import (
    DEFAULT_EXPERIMENT,
    PIPELINE_RUN_TAG,
    finish_parent_run,
    open_parent_run,
)

PIPELINE_NAME = "ampbench"


@dataclass(frozen=True)
class ParentRunOptions:
    experiment: str = DEFAULT_EXPERIMENT
    pipeline_run_id: str = ""
    run_name: str = ""


def load_results(path: Path) -> dict[str, Any]:
    try:
        results = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise AmpbenchError(f"{path}: not a readable results file ({error})") from None
    if not isinstance(results, dict) or "train_time_s" not in results:
        raise AmpbenchError(f"{path}: not the results of an ampbench training run")
    return results


def run_comparison(
    arm_results: Mapping[str, Sequence[Path]],
    comparison_path: Path,
    report_path: Path,
    *,
    baseline: str = "fp32",
    parent_run: ParentRunOptions | None = None,
    max_accuracy_drop_pp: float | None = None,
) -> dict[str, Any]:
    """Compare the arms; write comparison JSON and Markdown report; gate on accuracy drop."""
    arms = {name: [load_results(path) for path in paths] for name, paths in arm_results.items()}
    comparison = compare_arms(arms, baseline=baseline)
    comparison_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    markdown = render_markdown(comparison)
    report_path.write_text(markdown, encoding="utf-8")
    if parent_run is not None:
        children = [
            run["mlflow"]["run_id"]
            for runs in arms.values()
            for run in runs
            if run.get("mlflow", {}).get("run_id")
        ]
        tags = {"ampbench.pipeline": PIPELINE_NAME}
        if parent_run.pipeline_run_id:
            tags[PIPELINE_RUN_TAG] = parent_run.pipeline_run_id
            tags["kfp.run_id"] = parent_run.pipeline_run_id
        run_id = open_parent_run(
            parent_run.experiment,
            parent_run.run_name or f"{PIPELINE_NAME}-{parent_run.pipeline_run_id or 'run'}",
            tags,
            children,
        )
        comparison["mlflow"] = {"experiment": parent_run.experiment, "parent_run_id": run_id}
    comparison_path.write_text(json.dumps(comparison, indent=2) + "\n", encoding="utf-8")
    if parent_run is not None:
        headline = {
            key: comparison[key]
            for key in ("speedup", "memory_ratio", "accuracy_delta_pp")
            if comparison.get(key) is not None
        }
        finish_parent_run(
            comparison["mlflow"]["parent_run_id"],
            {"results.json": comparison_path, "report.md": report_path},
            headline,
        )
    log.info("compare: wrote %s and %s", comparison_path, report_path)
    if max_accuracy_drop_pp is not None:
        for name, this in comparison["comparisons"].items():
            if -this["accuracy_delta_pp"] > max_accuracy_drop_pp:
                raise AmpbenchError(
                    f"--max-accuracy-drop {max_accuracy_drop_pp:g}: arm {name} lost "
                    f"{-this['accuracy_delta_pp']:.2f} pp of accuracy against {baseline}"
                )
    return comparison
