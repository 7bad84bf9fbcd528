"""The comparison as a person reads it: the RESULTS block, Markdown and self-contained HTML.

Everything here reads a comparison.Comparison; the figures' definitions are comparison.DEFINITIONS.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path

from ampbench.compare.published import PUBLISHED, PUBLISHED_ARMS
from ampbench.compare.wording import amount, interval, prices_text, saving_text
from ampbench.comparison import ArmSummary, Comparison, Estimate, ScalingRow, TimeSpent

TITLE = "ampbench: mixed precision against FP32"


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


def _interval(estimate: Estimate | None, fmt: str, unit: str = "") -> str:
    ci = interval(estimate, fmt, unit)
    return f" ({ci})" if ci else ""


def _figure(estimate: Estimate | None, fmt: str, unit: str = "") -> str:
    if estimate is None:
        return "n/a"
    return f"{estimate.value:{fmt}}{unit}{_interval(estimate, fmt, unit)}"


def render_text(comparison: Comparison) -> str:
    """The RESULTS block (our figures, the published labels) and the lines that say what they
    mean, as `ampbench run` prints them."""
    headline = comparison.headline_arm
    this = comparison.comparisons[headline]
    baseline = this.baseline
    base, arm = comparison.arms[baseline], comparison.arms[headline]

    def published_terms(summary: ArmSummary) -> dict[str, float]:
        return {
            "accuracy": summary.accuracy.value,
            "peak_memory_mb": summary.train_peak_memory_mb.value,
            "train_time_s": summary.train_time_s.value,
        }

    lines = [results_block(published_terms(base), published_terms(arm))]
    if (baseline, headline) != PUBLISHED_ARMS:
        named = [f"FP32 is arm {baseline}"] if baseline != PUBLISHED_ARMS[0] else []
        named += [f"Mixed is arm {headline}"] if headline != PUBLISHED_ARMS[1] else []
        lines.append(f"({', '.join(named)})")
    lines += [
        "",
        f"Steady-state speedup (images/s, {headline} / {baseline}): "
        + _figure(this.speedup, ".2f", "x"),
        f"End-to-end time ratio ({baseline} / {headline}, warm-up and evaluation included): "
        + _figure(this.end_to_end_ratio, ".2f", "x"),
        f"Memory ratio (training peak, {headline} / {baseline}): "
        + _figure(this.memory_ratio, ".2f"),
        f"Total peak memory: {baseline} {base.total_peak_memory_mb.value:.2f} MB, "
        f"{headline} {arm.total_peak_memory_mb.value:.2f} MB",
        f"Accuracy delta ({headline} - {baseline}): "
        + _figure(this.accuracy_delta_pp, "+.2f", " pp"),
    ]
    lines += _optional_lines(comparison)
    lines += [
        f"Time spent, {name}: {time_spent_text(comparison.arms[name].time_spent)}"
        for name in (baseline, headline)
    ]
    lines += why_lines(comparison)
    lines += [
        "",
        f"Verdict: {comparison.verdict}",
    ]
    if len(comparison.arms) > 2:
        lines += ["", f"Every arm against its group's {comparison.baseline} baseline:"]
        header, rows = matrix_table(comparison)
        lines += _text_table(header, rows)
    lines += [f"WARNING: {warning}" for warning in comparison.warnings]
    return "\n".join(lines)


def _optional_lines(comparison: Comparison) -> list[str]:
    """The headline pair's FLOP/s (where counted) and time to target (where one was set)."""
    headline = comparison.headline_arm
    this = comparison.comparisons[headline]
    baseline = this.baseline
    base, arm = comparison.arms[baseline], comparison.arms[headline]
    lines = []
    if base.achieved_tflops and arm.achieved_tflops:
        lines.append(
            f"Achieved TFLOP/s: {baseline} {base.achieved_tflops.value:.3g}, "
            f"{headline} {arm.achieved_tflops.value:.3g}"
            + (
                f" (MFU {base.mfu.value:.1%} and {arm.mfu.value:.1%})"
                if base.mfu and arm.mfu
                else " (MFU not given: the device's peak is not known)"
            )
        )
    if arm.target_reached is not None:
        lines.append(
            f"Time-to-target ratio ({baseline} / {headline}): "
            + _figure(this.time_to_target_ratio, ".2f", "x")
            + ("" if this.time_to_target_ratio else " (not both reached the target)")
        )
    lines += nvidia_smi_lines(comparison)
    lines.append(energy_line(comparison))
    lines += cost_lines(comparison)
    lines += numerics_lines(comparison)
    lines += profile_lines(comparison)
    return lines


def profile_lines(comparison: Comparison) -> list[str]:
    """Each arm's profile, off the clock (its first seed's), in one line."""
    lines = []
    for name, arm in comparison.arms.items():
        profile = arm.per_seed[0].profile
        if profile is None:
            continue
        how = "CUDA-graph replays" if profile.replayed else "eager"
        parts = [
            f"device busy {profile.device_busy_share:.0%} of wall time",
            f"matmul and convolution {profile.matmul_conv_share:.0%} of device time",
        ]
        if profile.tensor_core_share is not None:
            parts.append(f"tensor-core kernels {profile.tensor_core_share:.0%}")
        if profile.low_precision_flop_share is not None:
            parts.append(
                f"{profile.low_precision_flop_share:.0%} of matmul FLOPs in "
                f"{arm.precision.autocast_dtype or arm.precision.resolved}"
            )
        lines.append(
            f"Profile, {name} ({profile.steps} steps, {how}, off the clock): " + ", ".join(parts)
        )
    return lines


def top_ops_table(comparison: Comparison) -> Table:
    """The top ops by device time, each arm beside the others (ms a step, share)."""
    profiles = {
        name: arm.per_seed[0].profile
        for name, arm in comparison.arms.items()
        if arm.per_seed[0].profile is not None
    }
    ops = list(dict.fromkeys(op.name for p in profiles.values() for op in p.top_ops))  # type: ignore[union-attr]
    cells = {
        name: {op.name: f"{op.ms_per_step:.2f} ({op.share:.0%})" for op in p.top_ops}  # type: ignore[union-attr]
        for name, p in profiles.items()
    }
    rows = [[op, *(cells[name].get(op, "-") for name in profiles)] for op in ops]
    return ["op (ms a step, share of device time)", *profiles], rows


def numerics_lines(comparison: Comparison) -> list[str]:
    """Each fp16 arm's loss scale and what fp16 makes of its gradients (its first seed)."""
    lines = []
    for name, arm in comparison.arms.items():
        run = arm.per_seed[0]
        found = run.fp16_numerics
        if found is None:
            continue
        skipped = ", ".join(str(epoch.skipped_steps) for epoch in run.epochs)
        lines.append(
            f"fp16 numerics, {name} seed {run.seed}: loss {found.loss:.4g} before scaling, "
            f"{found.scaled_loss:.4g} after (scale {found.loss_scale:g}); "
            f"{found.underflow_share:.2%} of {found.gradient_elements:,} nonzero gradient "
            f"elements would flush to zero in fp16 without the scale, "
            f"{found.overflow_share:.2%} overflow at it; skipped steps per epoch: {skipped}"
        )
    return lines


def why_lines(comparison: Comparison) -> list[str]:
    """One sentence per compared arm: what limits its gain, and what its figures cannot carry."""
    lines = []
    for name, found in comparison.why.items():
        if found:
            text = "; ".join(finding.sentence for finding in found)
        else:
            text = "no rule of the table finds a limit in its figures"
        lines.append(f"Why, {name}: {text[0].upper()}{text[1:]}.")
    return lines


def nvidia_smi_lines(comparison: Comparison) -> list[str]:
    """On CUDA, memory as nvidia-smi shows it beside the allocator's figures, and why the
    two differ (each arm's first seed)."""
    lines = []
    for name, arm in comparison.arms.items():
        memory = arm.per_seed[0].memory
        if memory.nvml_used_mb is None:
            continue
        lines.append(
            f"Memory as nvidia-smi shows it, {name}: {memory.nvml_used_mb:,.0f} MB (NVML) against "
            f"{memory.train_peak_mb:,.0f} MB allocated above resident and "
            f"{memory.train_peak_reserved_mb or 0:,.0f} MB reserved at the training peak"
        )
    if lines:
        lines.append(
            "  (nvidia-smi counts the CUDA context and everything the caching allocator "
            "reserved, which it keeps once grown; what AMP saves is allocated memory)"
        )
    return lines


def energy_line(comparison: Comparison) -> str:
    """The headline pair's energy (DEFINITIONS["Energy"]), or why there is none."""
    this = comparison.comparisons[comparison.headline_arm]
    names = (this.baseline, this.arm)
    arms = [comparison.arms[name] for name in names]
    energies = [arm.energy for arm in arms]
    if energies[0] is None or energies[1] is None:
        reason = next(
            (arm.energy_unavailable for arm in arms if arm.energy_unavailable), "not recorded"
        )
        return f"Energy: not measured: {reason}"
    parts = [
        f"{name} {_figure(energy.train_j, ',.1f', ' J')}, "
        f"{_figure(energy.j_per_image, '.4g', ' J/image')}"
        for name, energy in zip(names, energies, strict=True)
    ]
    line = f"Energy (training, {energies[0].counter}): " + "; ".join(parts)
    line += f"; energy ratio (J/image, {this.arm} / {this.baseline}): " + _figure(
        this.energy_ratio, ".2f", "x"
    )
    if not all(energy.reliable for energy in energies):
        line += " - UNRELIABLE: a timed window shorter than the counter resolves"
    return line


def cost_lines(comparison: Comparison) -> list[str]:
    """Each arm's cost of one run and, for an arm against its baseline, what it saves; none
    without a price (DEFINITIONS["Cost"])."""
    prices = comparison.prices
    if prices is None:
        return []
    lines = []
    for name, arm in comparison.arms.items():
        if arm.cost is None:
            lines.append(
                f"Cost, {name}: not given (nothing of it can be priced at {prices_text(prices)})"
            )
            continue
        line = (
            f"Cost, {name} (at {prices_text(prices)}): {amount(arm.cost.train.value)} per run of "
            f"training, {amount(arm.cost.end_to_end.value)} end to end"
        )
        if not arm.cost.energy_included:
            line += " (energy not measured: the device-hours only)"
        this = comparison.comparisons.get(name)
        if this is not None and this.cost_saved is not None:
            line += f"; {saving_text(this.cost_saved)} against {this.baseline}"
        lines.append(line)
    return lines


def time_spent_text(spent: TimeSpent) -> str:
    """Where an arm's time went, in one line (DEFINITIONS["Start-up"])."""
    if spent.startup_s is None:
        startup = "start-up not recorded"
    else:
        startup = (
            f"start-up {spent.startup_s:.2f} s (imports and device {spent.imports_s:.2f}, "
            f"data and model {spent.state_s:.2f})"
        )
    warmup = f"warm-up {spent.warmup_s:.2f} s"
    if spent.compile_s:
        warmup += f" (compilation {spent.compile_s:.2f}{compile_cache_text(spent)})"
    parts = [startup, warmup, f"training {spent.train_s:.2f} s", f"evaluation {spent.eval_s:.2f} s"]
    if spent.checkpoint_s:
        parts.append(f"checkpoints {spent.checkpoint_s:.2f} s")
    return ", ".join(parts)


def _text_table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    return [
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]


def matrix_table(comparison: Comparison) -> tuple[list[str], list[list[str]]]:
    """The experiment at a glance, laid out as NVIDIA's DeepLearningExamples results tables:
    a row per (model, batch size), throughput and accuracy per precision, each arm's
    speedup over its row's baseline."""
    precisions = list(dict.fromkeys(arm.precision.requested for arm in comparison.arms.values()))
    mixed = [p for p in precisions if p != comparison.baseline]
    header = ["model", "batch"]
    header += [f"images/s {p}" for p in precisions]
    header += [f"speedup {p}" for p in mixed]
    header += [f"accuracy {p}" for p in precisions]
    rows = []
    for group in comparison.groups:
        members = {a.precision.requested: a for a in comparison.arms.values() if a.group == group}
        first = next(iter(members.values()))
        row = [first.model, str(first.batch_size)]
        row += [
            f"{members[p].throughput_img_s.value:,.1f}" if p in members else "-" for p in precisions
        ]
        row += [
            f"{comparison.comparisons[members[p].name].speedup.value:.2f}x" if p in members else "-"
            for p in mixed
        ]
        row += [f"{members[p].accuracy.value:.4f}" if p in members else "-" for p in precisions]
        rows.append(row)
    return header, rows


Table = tuple[list[str], list[list[str]]]


def scaling_table(comparison: Comparison) -> Table:
    """Scaling, as DeepLearningExamples lays it out: a row per (model, batch per process,
    processes), images/s per precision, each precision's speedup at that scale and its
    scaling efficiency against one process."""
    precisions = list(dict.fromkeys(row.precision for row in comparison.scaling))
    mixed = [p for p in precisions if p != comparison.baseline]
    header = ["model", "batch per process", "processes"]
    header += [f"images/s {p}" for p in precisions]
    header += [f"speedup {p}" for p in mixed]
    header += [f"scaling {p}" for p in precisions]
    keyed: dict[tuple[str, int, int], dict[str, ScalingRow]] = {}
    for row in comparison.scaling:
        keyed.setdefault((row.model, row.per_rank_batch, row.world_size), {})[row.precision] = row
    rows = []
    for (model, batch, world), members in keyed.items():
        line = [model, str(batch), str(world)]
        line += [f"{members[p].throughput_img_s:,.1f}" if p in members else "-" for p in precisions]
        line += [
            f"{members[p].speedup:.2f}x" if p in members and members[p].speedup else "-"
            for p in mixed
        ]
        line += [
            f"{members[p].scaling_efficiency:.0%}"
            if p in members and members[p].scaling_efficiency is not None
            else "-"
            for p in precisions
        ]
        rows.append(line)
    return header, rows


def tables(comparison: Comparison) -> dict[str, Table]:
    """The report's tables as (header, rows) of text, shared by Markdown and HTML."""
    matrix = len(comparison.groups) > 1  # else model, batch and baseline are one each
    arms = [
        [
            name,
            *([arm.model, str(arm.batch_size)] if matrix else []),
            arm.precision.resolved + (" (emulated)" if arm.precision.emulated else ""),
            arm.precision.autocast_dtype or "none",
            _figure(arm.accuracy, ".4f"),
            _figure(arm.throughput_img_s, ",.1f"),
            _figure(arm.train_time_s, ".2f"),
            _figure(arm.end_to_end_s, ".2f"),
            _figure(arm.train_peak_memory_mb, ",.1f"),
            _figure(arm.total_peak_memory_mb, ",.1f"),
        ]
        for name, arm in comparison.arms.items()
    ]
    ratios = [
        [
            name,
            *([this.baseline] if matrix else []),
            _figure(this.speedup, ".2f", "x"),
            _figure(this.end_to_end_ratio, ".2f", "x"),
            _figure(this.memory_ratio, ".2f"),
            _figure(this.total_memory_ratio, ".2f"),
            _figure(this.accuracy_delta_pp, "+.2f"),
        ]
        for name, this in comparison.comparisons.items()
    ]
    arm_header = ["arm", *(["model", "batch"] if matrix else []), "precision", "autocast"]
    arm_header += ["accuracy", "images/s", "train time (s)"]
    arm_header += ["end-to-end (s)", "training peak (MB)", "total peak (MB)"]
    ratio_header = ["arm", *(["against"] if matrix else []), "steady-state speedup"]
    ratio_header += ["end-to-end ratio", "memory ratio"]
    ratio_header += ["total memory ratio", "accuracy delta (pp)"]
    _add_optional_columns(comparison, (arm_header, arms), (ratio_header, ratios))
    settings = [[key, value] for key, value in comparison.settings.items()]
    found = {
        "Settings": (["setting", "value"], settings),
        "Arms": (arm_header, arms),
        f"Against {comparison.baseline}": (ratio_header, ratios),
        "Where the time went (s, mean over seeds)": time_spent_table(comparison),
    }
    if matrix:
        found = {"At a glance": matrix_table(comparison), **found}
    if comparison.scaling:
        found["Scaling"] = scaling_table(comparison)
    if any(arm.per_seed[0].profile for arm in comparison.arms.values()):
        found["Top ops by device time (profile, off the clock)"] = top_ops_table(comparison)
    return found


def _add_optional_columns(comparison: Comparison, arms: Table, ratios: Table) -> None:
    """FLOP/s, MFU and time to target, as columns of the arms' and ratios' tables where any
    arm has them."""
    (arm_header, arm_rows), (ratio_header, ratio_rows) = arms, ratios
    summaries = list(comparison.arms.values())
    if any(arm.achieved_tflops for arm in summaries):
        arm_header.append("TFLOP/s")
        for row, arm in zip(arm_rows, summaries, strict=True):
            row.append(_figure(arm.achieved_tflops, ".3g"))
    if any(arm.mfu for arm in summaries):
        arm_header.append("MFU")
        for row, arm in zip(arm_rows, summaries, strict=True):
            row.append(_figure(arm.mfu, ".1%"))
    if any(arm.target_reached is not None for arm in summaries):
        arm_header.append("time to target (s)")
        for row, arm in zip(arm_rows, summaries, strict=True):
            reached = arm.target_reached or []
            text = _figure(arm.time_to_target_s, ".2f") if arm.time_to_target_s else "never"
            if 0 < len(reached) < len(arm.seeds):
                text += f" ({len(reached)} of {len(arm.seeds)} seeds)"
            row.append(text)
        ratio_header.append("time-to-target ratio")
        for row, this in zip(ratio_rows, comparison.comparisons.values(), strict=True):
            row.append(_figure(this.time_to_target_ratio, ".2f", "x"))
    if any(arm.energy for arm in summaries):
        arm_header.append("energy (J/image)")
        for row, arm in zip(arm_rows, summaries, strict=True):
            row.append(_figure(arm.energy.j_per_image, ".4g") if arm.energy else "-")
        ratio_header.append("energy ratio")
        for row, this in zip(ratio_rows, comparison.comparisons.values(), strict=True):
            row.append(_figure(this.energy_ratio, ".2f", "x"))
    if comparison.prices is not None:
        arm_header.append("cost per run")
        for row, arm in zip(arm_rows, summaries, strict=True):
            row.append(amount(arm.cost.train.value) if arm.cost else "-")
        ratio_header.append("saved per run")
        for row, this in zip(ratio_rows, comparison.comparisons.values(), strict=True):
            saved = this.cost_saved
            row.append(amount(saved.value) if saved else "-")


def compile_cache_text(spent: TimeSpent) -> str:
    """How the compiled step was had: from the shared compile cache, compiled, or both."""
    hits, misses = spent.compile_cache_hits, spent.compile_cache_misses
    if hits == spent.seeds:
        return ", fetched from the compile cache"
    if misses == spent.seeds:
        return ", compiled: a compile cache miss"
    if hits == 0:
        return ""
    return f", fetched from the compile cache in {hits} of {spent.seeds} seeds"


def time_spent_table(comparison: Comparison) -> Table:
    """Each arm's time by phase; the start-up "-" where a seed did not record it."""

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    header = ["arm", "start-up", "imports and device", "data and model", "warm-up"]
    header += ["compilation", "training", "evaluation", "checkpoints"]
    rows = [
        [
            name,
            *(seconds(v) for v in (t.startup_s, t.imports_s, t.state_s, t.warmup_s)),
            *(seconds(v) for v in (t.compile_s, t.train_s, t.eval_s, t.checkpoint_s)),
        ]
        for name, t in ((name, arm.time_spent) for name, arm in comparison.arms.items())
    ]
    return header, rows


def published_heading(comparison: Comparison) -> str:
    if comparison.unlike_published:
        return f"Not set beside the published run: {comparison.unlike_published}."
    if not comparison.published_differences:
        return "The published run this reproduces"
    return (
        "Published run, for reference only: not a reproduction ("
        + "; ".join(comparison.published_differences)
        + ")"
    )


def _published_block() -> str:
    return results_block(*(PUBLISHED[arm] for arm in PUBLISHED_ARMS))


def _notes(comparison: Comparison) -> list[str]:
    notes = [f"{term}: {meaning}." for term, meaning in comparison.definitions.items()]
    notes += [this.note for this in comparison.comparisons.values() if this.note]
    return notes


def render_markdown(comparison: Comparison) -> str:
    lines = [f"# {TITLE}", "", f"**Verdict.** {comparison.verdict}", ""]
    lines += [f"> **WARNING:** {warning}" for warning in comparison.warnings]
    if comparison.warnings:
        lines.append("")
    lines += ["## Our run", "", "```"]
    lines += [render_text(comparison), "```", ""]
    for heading, (header, rows) in tables(comparison).items():
        lines += [f"## {heading}", "", "| " + " | ".join(header) + " |"]
        lines.append("|" + "---|" * len(header))
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        lines.append("")
    if comparison.unlike_published:
        lines += ["## The published run", "", published_heading(comparison), ""]
    else:
        lines += [f"## {published_heading(comparison)}", "", "```", _published_block(), "```", ""]
    lines += ["## What the figures mean", ""]
    lines += [f"- {note}" for note in _notes(comparison)]
    lines.append("")
    return "\n".join(lines)


def headline_figures(comparison: Comparison) -> list[tuple[str, str, str]]:
    """The answer in a row: (key, label, figure with its interval) of the headline arm's
    speedup, memory ratio, accuracy delta, energy ratio and cost saved."""
    this = comparison.comparisons[comparison.headline_arm]
    versus = f"{this.arm} / {this.baseline}"
    saved = this.cost_saved
    return [
        ("speedup", f"Speedup ({versus}, images/s)", _figure(this.speedup, ".2f", "x")),
        ("memory_ratio", f"Memory ratio ({versus})", _figure(this.memory_ratio, ".2f", "x")),
        (
            "accuracy_delta",
            f"Accuracy delta ({this.arm} - {this.baseline})",
            _figure(this.accuracy_delta_pp, "+.2f", " pp"),
        ),
        (
            "energy_ratio",
            f"Energy ratio ({versus}, J/image)",
            _figure(this.energy_ratio, ".2f", "x"),
        ),
        (
            "cost_saved",
            "Cost saved per run (per 1,000 runs)",
            f"{amount(saved.value)} ({amount(1000 * saved.value)})" + _interval(saved, ".3g")
            if saved is not None
            else "n/a (no price given)",
        ),
    ]


STYLE = (
    "body{font-family:sans-serif;margin:1.5em auto;max-width:75em;padding:0 1em}"
    ".scroll{overflow-x:auto}table{border-collapse:collapse;margin:.5em 0}"
    "td,th{border:1px solid #bbb;padding:.25em .6em;text-align:right}"
    "td:first-child,th{text-align:left}"
    "pre{background:#f4f4f4;padding:.8em;white-space:pre-wrap;overflow-wrap:anywhere}"
    "img{max-width:100%}.warning{background:#fff3cd;border:1px solid #e0b000;padding:.6em}"
    "#headline{display:flex;flex-wrap:wrap;gap:.8em;margin:1em 0}"
    "#headline div{border:1px solid #bbb;border-radius:.4em;padding:.6em .9em;flex:1 1 12em}"
    "#headline .label{font-size:.85em;color:#555}#headline .value{font-size:1.4em}"
)
# The plots the page shows first, in its order; any other follows the curves.
LEAD_PLOTS = ("throughput", "time_spent")


def _html_table(heading: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    cells = ["<tr>" + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr>"]
    cells += ["<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows]
    return f'<h2>{escape(heading)}</h2><div class="scroll"><table>{"".join(cells)}</table></div>'


def _image(plot: Path) -> str:
    data = base64.b64encode(Path(plot).read_bytes()).decode("ascii")
    name = escape(Path(plot).stem)
    return f'<p><img id="plot-{name}" alt="{name}" src="data:image/png;base64,{data}"></p>'


def render_html(comparison: Comparison, plots: Sequence[Path]) -> str:
    """One self-contained page (plots inlined as data: URIs, no external URL), as the KFP UI
    shows it in an iframe: the answer first (the headline row, the verdict), then images/s and
    where the time went, why, the curves, the figures in full, and the settings folded last."""
    by_name = {Path(plot).stem: plot for plot in plots}
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(TITLE)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{escape(TITLE)}</h1>",
        '<section id="headline">',
    ]
    parts += [
        f'<div data-figure="{key}"><div class="label">{escape(label)}</div>'
        f'<div class="value">{escape(value)}</div></div>'
        for key, label, value in headline_figures(comparison)
    ]
    parts.append("</section>")
    parts.append(f'<p id="verdict"><strong>Verdict.</strong> {escape(comparison.verdict)}</p>')
    parts += [
        f'<p class="warning"><strong>WARNING:</strong> {escape(w)}</p>' for w in comparison.warnings
    ]
    parts += [_image(by_name[name]) for name in LEAD_PLOTS if name in by_name]
    parts.append('<h2>Why</h2><ul id="why">')
    parts += [f"<li>{escape(line.removeprefix('Why, '))}</li>" for line in why_lines(comparison)]
    parts.append("</ul><h2>Curves and the rest</h2>")
    parts += [_image(plot) for name, plot in by_name.items() if name not in LEAD_PLOTS]
    parts += ["<h2>Our run</h2>", f"<pre>{escape(render_text(comparison))}</pre>"]
    found = tables(comparison)
    settings = found.pop("Settings")
    parts += [_html_table(heading, *table) for heading, table in found.items()]
    if comparison.unlike_published:
        parts.append(f"<h2>The published run</h2><p>{escape(published_heading(comparison))}</p>")
    else:
        parts.append(f"<h2>{escape(published_heading(comparison))}</h2>")
        parts.append(f"<pre>{escape(_published_block())}</pre>")
    parts.append("<h2>What the figures mean</h2><ul>")
    parts += [f"<li>{escape(note)}</li>" for note in _notes(comparison)]
    parts.append("</ul>")
    parts.append(
        f'<details id="settings"><summary>Settings ({len(settings[1])}, shared by every run '
        f"compared)</summary>{_html_table('Settings', *settings)}</details>"
    )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
