"""The compare step as plain functions: arms' results in, the comparison and its report out.

Arms are compared with the baseline arm (strict FP32 unless chosen otherwise): speedup is
baseline time / arm time, memory ratio arm / baseline, accuracy delta arm - baseline in
percentage points. With several seeds every figure is a mean with a 95 % t-interval; the
intervals of the ratios come from the per-seed ratios of runs paired by seed.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from ampbench.components.compare.stats import estimate
from ampbench.errors import AmpbenchError

COMPARISON_SCHEMA_VERSION = 1
# The published experiment this project starts from (ResNet-18, CIFAR-10, 2 epochs).
PUBLISHED = {
    "fp32": {"accuracy": 0.7114, "peak_memory_mb": 3219.65, "train_time_s": 309.41},
    "amp": {"accuracy": 0.6969, "peak_memory_mb": 1916.57, "train_time_s": 252.56},
}
FIGURES = ("accuracy", "peak_memory_mb", "train_time_s", "throughput_img_s")
ARM_FIELDS = ("precision", "resolved_precision", "device", "device_name", "autocast_dtype", "model")


def results_block(fp32: Mapping[str, float], mixed: Mapping[str, float]) -> str:
    """The published RESULTS block's exact layout, filled with the given figures."""
    return "\n".join(
        [
            "===== RESULTS =====",
            f"FP32 Accuracy: {fp32['accuracy']:.4f}",
            f"FP32 Memory : {fp32['peak_memory_mb']:.2f} MB",
            f"FP32 Time   : {fp32['train_time_s']:.2f} sec",
            "",
            f"Mixed Accuracy: {mixed['accuracy']:.4f}",
            f"Mixed Memory  : {mixed['peak_memory_mb']:.2f} MB",
            f"Mixed Time    : {mixed['train_time_s']:.2f} sec",
        ]
    )


def _by_seed(runs: Sequence[Mapping[str, Any]], arm: str) -> dict[int, Mapping[str, Any]]:
    by_seed: dict[int, Mapping[str, Any]] = {}
    for run in runs:
        seed = int(run["hyperparameters"]["seed"])
        if seed in by_seed:
            raise AmpbenchError(f"arm {arm}: two results for seed {seed}")
        by_seed[seed] = run
    return by_seed


def _mean_epochs(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per-epoch records averaged over seeds (values missing in some seeds are left out)."""
    epochs = []
    for index in range(min(len(run["epochs"]) for run in runs)):
        records = [run["epochs"][index] for run in runs]
        keys = [k for k, v in records[0].items() if isinstance(v, (int, float))]
        epochs.append(
            {
                key: estimate([r[key] for r in records if r.get(key) is not None]).mean
                for key in keys
                if any(r.get(key) is not None for r in records)
            }
        )
    return epochs


def summarize_arm(runs: Sequence[Mapping[str, Any]], arm: str) -> dict[str, Any]:
    if not runs:
        raise AmpbenchError(f"arm {arm}: no training results")
    by_seed = _by_seed(runs, arm)
    first = runs[0]
    summary: dict[str, Any] = {field: first.get(field) for field in ARM_FIELDS}
    for field in FIGURES:
        values = [run[field] for run in runs if run.get(field) is not None]
        result = estimate(values) if values else None
        summary[field] = result.mean if result else None
        summary[f"{field}_ci95"] = result.as_dict() if result else None
    summary["memory_kind"] = first.get("memory_kind")
    summary["seeds"] = sorted(by_seed)
    summary["epochs"] = _mean_epochs(runs)
    summary["per_seed"] = [dict(by_seed[seed]) for seed in sorted(by_seed)]
    return summary


def _paired(
    baseline: dict[int, Mapping[str, Any]], arm: dict[int, Mapping[str, Any]], name: str
) -> list[int]:
    seeds = sorted(set(baseline) & set(arm))
    if not seeds:
        raise AmpbenchError(f"arm {name}: no seed in common with the baseline arm")
    return seeds


# What must be the same in every run compared, whatever its arm or seed.
COMMON = {
    "model": lambda r: r["model"],
    "dataset": lambda r: r["dataset"].get("sha256"),
    "train images": lambda r: r["dataset"].get("train_images"),
    "epochs": lambda r: r["hyperparameters"].get("epochs"),
    "batch size": lambda r: r["hyperparameters"].get("batch_size"),
    "learning rate": lambda r: r["hyperparameters"].get("lr"),
    "device": lambda r: r.get("device"),
}


def check_comparable(arms: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
    """Refuse to average or compare runs that are not the same experiment."""
    for name, runs in arms.items():
        precisions = {run["precision"] for run in runs}
        if len(precisions) > 1:
            raise AmpbenchError(f"arm {name}: results of several precisions {sorted(precisions)}")
    everything = [run for runs in arms.values() for run in runs]
    for what, value_of in COMMON.items():
        values = {str(value_of(run)) for run in everything}
        if len(values) > 1:
            raise AmpbenchError(
                f"the results differ in {what} ({', '.join(sorted(values))}): not one experiment"
            )


def compare_arms(
    arms: Mapping[str, Sequence[Mapping[str, Any]]], baseline: str = "fp32"
) -> dict[str, Any]:
    """The comparison of every arm with `baseline`; see the module docstring."""
    if baseline not in arms:
        raise AmpbenchError(f"no results for the baseline arm '{baseline}'")
    check_comparable(arms)
    summaries = {name: summarize_arm(runs, name) for name, runs in arms.items()}
    base_runs = _by_seed(arms[baseline], baseline)
    comparisons: dict[str, Any] = {}
    for name, runs in arms.items():
        if name == baseline:
            continue
        arm_runs = _by_seed(runs, name)
        seeds = _paired(base_runs, arm_runs, name)
        base, this = summaries[baseline], summaries[name]
        per_seed = {
            "speedup": [base_runs[s]["train_time_s"] / arm_runs[s]["train_time_s"] for s in seeds],
            "memory_ratio": [
                arm_runs[s]["peak_memory_mb"] / base_runs[s]["peak_memory_mb"]
                for s in seeds
                if base_runs[s]["peak_memory_mb"]
            ],
            "accuracy_delta_pp": [
                100.0 * (arm_runs[s]["accuracy"] - base_runs[s]["accuracy"]) for s in seeds
            ],
        }
        comparisons[name] = {
            # Ratios of the arm means, so that they agree with the table's figures.
            "speedup": base["train_time_s"] / this["train_time_s"],
            "memory_ratio": (
                this["peak_memory_mb"] / base["peak_memory_mb"] if base["peak_memory_mb"] else None
            ),
            "accuracy_delta_pp": 100.0 * (this["accuracy"] - base["accuracy"]),
            "paired_seeds": seeds,
            "per_seed": per_seed,
            "ci95": {
                key: estimate(values).as_dict() if values else None
                for key, values in per_seed.items()
            },
        }
    headline = next(iter(comparisons), None)
    result: dict[str, Any] = {
        "schema_version": COMPARISON_SCHEMA_VERSION,
        "baseline": baseline,
        "headline_arm": headline,
        "runs": summaries,
        "comparisons": comparisons,
        "published": PUBLISHED,
    }
    if headline is not None:
        for key in ("speedup", "memory_ratio", "accuracy_delta_pp"):
            result[key] = comparisons[headline][key]
    return result


def _pm(estimate_dict: Mapping[str, Any] | None, fmt: str) -> str:
    if not estimate_dict:
        return "n/a"
    text = format(estimate_dict["mean"], fmt)
    if estimate_dict.get("ci95_half_width") is not None:
        text += " ± " + format(estimate_dict["ci95_half_width"], fmt)
    return text


def _ratio_cell(value: float | None, ci: Mapping[str, Any] | None, fmt: str) -> str:
    if value is None:
        return "n/a"
    half = (ci or {}).get("ci95_half_width")
    return format(value, fmt) + (f" (± {format(half, fmt)})" if half is not None else "")


def render_text(comparison: Mapping[str, Any]) -> str:
    """The RESULTS block (our numbers) and the headline ratios, as printed by `ampbench run`."""
    baseline, headline = comparison["baseline"], comparison["headline_arm"]
    if headline is None:
        raise AmpbenchError("nothing to compare: only the baseline arm has results")
    runs = comparison["runs"]
    this = comparison["comparisons"][headline]
    memory_ratio = this["memory_ratio"]
    lines = [results_block(runs[baseline], runs[headline])]
    if (baseline, headline) != ("fp32", "amp"):
        lines.append(f"(FP32 is arm {baseline}, Mixed is arm {headline})")
    lines += [
        "",
        f"Speedup ({baseline} time / {headline} time): {this['speedup']:.2f}x",
        "Memory ratio ({} / {}): {}".format(
            headline, baseline, "n/a" if memory_ratio is None else f"{memory_ratio:.2f}"
        ),
        f"Accuracy delta ({headline} - {baseline}): {this['accuracy_delta_pp']:+.2f} pp",
    ]
    return "\n".join(lines)


Table = tuple[list[str], list[list[str]]]


def tables(comparison: Mapping[str, Any]) -> dict[str, Table]:
    """The report's tables as (header, rows) of text, shared by Markdown and HTML."""
    arms = [
        [
            name,
            arm["resolved_precision"],
            arm["autocast_dtype"] or "none",
            _pm(arm["accuracy_ci95"], ".4f"),
            _pm(arm["peak_memory_mb_ci95"], ".1f"),
            _pm(arm["train_time_s_ci95"], ".2f"),
            _pm(arm["throughput_img_s_ci95"], ".1f"),
        ]
        for name, arm in comparison["runs"].items()
    ]
    ratios = [
        [
            name,
            _ratio_cell(this["speedup"], this["ci95"]["speedup"], ".2f") + "x",
            _ratio_cell(this["memory_ratio"], this["ci95"]["memory_ratio"], ".2f"),
            _ratio_cell(this["accuracy_delta_pp"], this["ci95"]["accuracy_delta_pp"], "+.2f"),
        ]
        for name, this in comparison["comparisons"].items()
    ]
    arm_header = ["arm", "precision", "autocast", "accuracy", "peak memory (MB)"]
    arm_header += ["train time (s)", "images/s"]
    ratio_header = ["arm", "speedup", "memory ratio", "accuracy delta (pp)"]
    return {"Arms": (arm_header, arms), f"Against {comparison['baseline']}": (ratio_header, ratios)}


def _description(comparison: Mapping[str, Any]) -> str:
    first = comparison["runs"][comparison["baseline"]]
    return (
        f"Model {first['model']} on {first['device_name']} ({first['device']}); "
        f"seeds {', '.join(map(str, first['seeds']))}; baseline arm: {comparison['baseline']}."
    )


def _notes(comparison: Mapping[str, Any]) -> list[str]:
    memory_kind = comparison["runs"][comparison["baseline"]].get("memory_kind")
    memory = (
        "torch.cuda.max_memory_allocated"
        if memory_kind == "cuda_max_allocated"
        else "growth of the process's peak RSS during the run (CPU)"
    ) + ", the data set held on the device included."
    return [
        "Figures are means over seeds; ± is the half-width of a 95 % Student-t interval "
        "(for ratios: over the per-seed ratios of runs paired by seed).",
        f"Training time excludes evaluation and compilation. Peak memory: {memory}",
    ]


TITLE = "ampbench: mixed precision against FP32"


def render_markdown(comparison: Mapping[str, Any]) -> str:
    lines = [f"# {TITLE}", "", _description(comparison), "", "## Our run", "", "```"]
    lines += [render_text(comparison), "```", "", "## The published run we reproduce", "", "```"]
    lines += [results_block(PUBLISHED["fp32"], PUBLISHED["amp"]), "```", ""]
    for heading, (header, rows) in tables(comparison).items():
        lines += [f"## {heading}", "", "| " + " | ".join(header) + " |"]
        lines.append("|" + "---|" * len(header))
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        lines.append("")
    lines += [*_notes(comparison), ""]
    return "\n".join(lines)


def render_html(comparison: Mapping[str, Any], plots: Sequence[Path]) -> str:
    """One self-contained page (plots inlined as data: URIs, no external URL), as the KFP UI
    shows it in an iframe."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(TITLE)}</title>",
        "<style>body{font-family:sans-serif;margin:1.5em;max-width:70em}"
        "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #bbb;"
        "padding:.25em .6em;text-align:right}td:first-child,th{text-align:left}"
        "pre{background:#f4f4f4;padding:.8em}img{max-width:100%}</style></head><body>",
        f"<h1>{escape(TITLE)}</h1>",
        f"<p>{escape(_description(comparison))}</p>",
        "<h2>Our run</h2>",
        f"<pre>{escape(render_text(comparison))}</pre>",
        "<h2>The published run we reproduce</h2>",
        f"<pre>{escape(results_block(PUBLISHED['fp32'], PUBLISHED['amp']))}</pre>",
    ]
    for heading, (header, rows) in tables(comparison).items():
        parts.append(f"<h2>{escape(heading)}</h2><table>")
        parts.append("<tr>" + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr>")
        for row in rows:
            parts.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>")
        parts.append("</table>")
    parts.append("<h2>Plots</h2>")
    for plot in plots:
        data = base64.b64encode(Path(plot).read_bytes()).decode("ascii")
        parts.append(
            f'<p><img alt="{escape(Path(plot).stem)}" src="data:image/png;base64,{data}"></p>'
        )
    parts += [f"<p>{escape(note)}</p>" for note in _notes(comparison)]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
