"""The comparison's figures (matplotlib, PNG): curves per epoch, throughput, peak memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display, in a pod or on a CI machine

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter

from ampbench.comparison import ArmSummary, Comparison, Estimate

PLOTS = ("curves.png", "throughput.png", "memory.png", "time_spent.png")
# Only for a matrix with several batch sizes: throughput and memory against batch size.
BATCH_PLOT = "batch_scaling.png"
# Only where arms ran at several world sizes: images/s against processes, with ideal scaling.
SCALING_PLOT = "gpu_scaling.png"
# Only where an arm trained with a GradScaler (fp16): its loss scale at every step.
LOSS_SCALE_PLOT = "loss_scale.png"
COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860"]


def _color(index: int) -> str:
    return COLORS[index % len(COLORS)]


def _error_bars(estimates: list[Estimate]) -> list[list[float]] | None:
    """Asymmetric 95 % bars (below, above), or None where no estimate has an interval."""
    if all(e.low is None for e in estimates):
        return None
    return [
        [e.value - (e.low if e.low is not None else e.value) for e in estimates],
        [(e.high if e.high is not None else e.value) - e.value for e in estimates],
    ]


def _bars(ax: Any, arms: dict[str, ArmSummary], estimates: list[Estimate], ylabel: str) -> None:
    names = list(arms)
    bars = ax.bar(
        names,
        [e.value for e in estimates],
        yerr=_error_bars(estimates),
        capsize=6,
        color=[_color(i) for i in range(len(names))],
    )
    ax.bar_label(bars, fmt="%.1f", padding=3)
    ax.set_ylabel(ylabel)
    ax.margins(y=0.15)
    if len(names) > 3:  # a matrix's arm names would overlap side by side
        ax.tick_params(axis="x", labelrotation=45)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")


def _batch_scaling(comparison: Comparison, path: Path) -> None:
    """Throughput and training peak memory against batch size, a line per precision, a row
    of panels per model: where each precision's gain grows or fades with the batch."""
    models = list(dict.fromkeys(arm.model for arm in comparison.arms.values()))
    precisions = list(dict.fromkeys(a.precision.requested for a in comparison.arms.values()))
    figure, axes = plt.subplots(len(models), 2, figsize=(10, 4 * len(models)), squeeze=False)
    for row, model in zip(axes, models, strict=True):
        for index, precision in enumerate(precisions):
            arms = sorted(
                (
                    a
                    for a in comparison.arms.values()
                    if a.model == model and a.precision.requested == precision
                ),
                key=lambda a: a.batch_size,
            )
            for ax, estimates in (
                (row[0], [a.throughput_img_s for a in arms]),
                (row[1], [a.train_peak_memory_mb for a in arms]),
            ):
                ax.errorbar(
                    [a.batch_size for a in arms],
                    [e.value for e in estimates],
                    yerr=_error_bars(estimates),
                    fmt="o-",
                    capsize=4,
                    color=_color(index),
                    label=precision,
                )
        for ax, ylabel in zip(row, ("images/s (after warm-up)", "training peak (MB)"), strict=True):
            ax.set(xlabel="batch size", ylabel=ylabel, title=f"{model}: {ylabel}")
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
            ax.grid(alpha=0.3, which="both")
            ax.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _gpu_scaling(comparison: Comparison, path: Path) -> None:
    """Images/s against processes (GPUs), a line per precision, a panel per (model, batch
    per process), beside the ideal: N times one process."""
    panels = list(dict.fromkeys((row.model, row.per_rank_batch) for row in comparison.scaling))
    precisions = list(dict.fromkeys(row.precision for row in comparison.scaling))
    figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (model, batch) in zip(axes[0], panels, strict=True):
        for index, precision in enumerate(precisions):
            rows = sorted(
                (
                    r
                    for r in comparison.scaling
                    if (r.model, r.per_rank_batch, r.precision) == (model, batch, precision)
                ),
                key=lambda r: r.world_size,
            )
            worlds = [r.world_size for r in rows]
            ax.plot(
                worlds,
                [r.throughput_img_s for r in rows],
                "o-",
                color=_color(index),
                label=precision,
            )
            one = next((r.throughput_img_s for r in rows if r.world_size == 1), None)
            if one is not None:
                ax.plot(worlds, [one * w for w in worlds], ":", color=_color(index), alpha=0.6)
        ax.set(
            xlabel="processes (GPUs)",
            ylabel="images/s",
            title=f"{model}, batch {batch} per process",
        )
        ax.grid(alpha=0.3)
        ax.legend(title="dotted: ideal")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _curves(comparison: Comparison, path: Path) -> None:
    """Train loss, test loss and test accuracy per epoch, each on its own axis: test loss can
    sit orders of magnitude above train loss early on, and a shared linear axis flattens one
    of them. Losses on a log scale."""
    figure, axes = plt.subplots(1, 3, figsize=(14, 4))
    panels = (
        ("train_loss", "Training loss", "loss (log scale)"),
        ("test_loss", "Test loss", "loss (log scale)"),
        ("test_accuracy", "Test accuracy", "accuracy"),
    )
    for ax, (key, title, ylabel) in zip(axes, panels, strict=True):
        values = []
        for index, (name, arm) in enumerate(comparison.arms.items()):
            color = _color(index)
            points = [(r["epoch"], r[key]) for r in arm.epochs if r.get(key) is not None]
            ax.plot(*zip(*points, strict=True), "o-", color=color, label=name)
            values += [value for _, value in points]
        if key.endswith("loss"):
            ax.set_yscale("log")
            # Plain numbers (4.6, 100), not 4.6x10^0; minor ticks labelled only where the axis
            # spans less than a decade (else they crowd).
            plain = FuncFormatter(lambda value, _: f"{value:g}")
            ax.yaxis.set_major_formatter(plain)
            short = max(values) < 10 * min(values)
            ax.yaxis.set_minor_formatter(plain if short else NullFormatter())
        ax.set(xlabel="epoch", ylabel=ylabel, title=title)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3, which="both")
        ax.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _loss_scales(comparison: Comparison, path: Path) -> bool:
    """Each fp16 arm's loss scale at every step (its first seed), on a log axis, with the
    skipped steps the halvings show; False where no arm has a GradScaler."""
    scaled = {
        name: [s for epoch in arm.per_seed[0].epochs for s in epoch.loss_scales or []]
        for name, arm in comparison.arms.items()
    }
    scaled = {name: scales for name, scales in scaled.items() if scales}
    if not scaled:
        return False
    figure, ax = plt.subplots(figsize=(8, 4))
    for index, (name, scales) in enumerate(scaled.items()):
        seed = comparison.arms[name].per_seed[0]
        ax.step(
            range(1, len(scales) + 1),
            scales,
            where="post",
            color=_color(index),
            label=f"{name} seed {seed.seed}: {seed.skipped_steps} skipped steps",
        )
    ax.set_yscale("log", base=2)
    ax.set(xlabel="training step", ylabel="loss scale (log2)", title="fp16 loss scale per step")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True


def _time_spent(comparison: Comparison, path: Path) -> None:
    """Where each arm's wall time went, a stacked bar per arm (means over its seeds)."""
    names = list(comparison.arms)
    spent = [comparison.arms[name].time_spent for name in names]
    phases = (
        ("start-up", [s.startup_s or 0.0 for s in spent]),
        ("warm-up", [s.warmup_s for s in spent]),
        ("training", [s.train_s for s in spent]),
        ("evaluation", [s.eval_s for s in spent]),
        ("checkpoints", [s.checkpoint_s for s in spent]),
    )
    figure, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(names) + 3), 4))
    bottom = [0.0] * len(names)
    for index, (phase, seconds) in enumerate(phases):
        if not any(seconds):
            continue
        ax.bar(names, seconds, bottom=bottom, color=_color(index), label=phase)
        bottom = [b + s for b, s in zip(bottom, seconds, strict=True)]
    ax.set(ylabel="seconds (mean over seeds)", title="Where each arm's wall time went")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if len(names) > 3:
        ax.tick_params(axis="x", labelrotation=45)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def write_plots(comparison: Comparison, directory: Path) -> list[Path]:
    """Write the figures into `directory`; return their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    arms = comparison.arms
    paths = [directory / name for name in PLOTS]
    _curves(comparison, paths[0])

    width = max(5.0, 0.9 * len(arms))  # room for a matrix's arms side by side
    figure, ax = plt.subplots(figsize=(width, 4))
    _bars(ax, arms, [a.throughput_img_s for a in arms.values()], "images/s")
    ax.set_title("Training throughput (after warm-up)")
    figure.tight_layout()
    figure.savefig(paths[1], dpi=100)
    plt.close(figure)

    figure, (train_ax, total_ax) = plt.subplots(1, 2, figsize=(max(9.0, 1.8 * len(arms)), 4))
    _bars(train_ax, arms, [a.train_peak_memory_mb for a in arms.values()], "MB")
    train_ax.set_title("Training peak (above resident)")
    _bars(total_ax, arms, [a.total_peak_memory_mb for a in arms.values()], "MB")
    total_ax.set_title("Total peak (whole run)")
    figure.tight_layout()
    figure.savefig(paths[2], dpi=100)
    plt.close(figure)
    _time_spent(comparison, paths[3])
    if len({arm.batch_size for arm in arms.values()}) > 1:
        paths.append(directory / BATCH_PLOT)
        _batch_scaling(comparison, paths[-1])
    if comparison.scaling:
        paths.append(directory / SCALING_PLOT)
        _gpu_scaling(comparison, paths[-1])
    if _loss_scales(comparison, directory / LOSS_SCALE_PLOT):
        paths.append(directory / LOSS_SCALE_PLOT)
    return paths
