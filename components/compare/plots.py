"""The comparison's figures (matplotlib, PNG): curves per epoch, throughput, peak memory."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display, in a pod or on a CI machine

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

PLOTS = ("curves.png", "throughput.png", "memory.png")


COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]


def _bars(ax: Any, runs: Mapping[str, Any], field: str, ylabel: str, title: str) -> None:
    names = list(runs)
    means = [runs[name][field] or 0.0 for name in names]
    errors = [(runs[name][f"{field}_ci95"] or {}).get("ci95_half_width") or 0.0 for name in names]
    colors = COLORS[: len(names)]
    # Error bars (95 % intervals) only where there are several seeds to make one.
    bars = ax.bar(names, means, yerr=errors if any(errors) else None, capsize=6, color=colors)
    ax.bar_label(bars, fmt="%.1f", padding=3)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.margins(y=0.15)


def write_plots(comparison: Mapping[str, Any], directory: Path) -> list[Path]:
    """Write the figures into `directory`; return their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    runs = comparison["runs"]
    paths = []

    figure, (loss_ax, accuracy_ax) = plt.subplots(1, 2, figsize=(10, 4))
    # One colour per arm; solid lines for training, dashed for the test split.
    for color, (name, arm) in zip(COLORS, runs.items(), strict=False):
        epochs = [record["epoch"] for record in arm["epochs"]]
        losses = [r.get("train_loss") for r in arm["epochs"]]
        loss_ax.plot(epochs, losses, "o-", color=color, label=f"{name} train")
        test_losses = [r.get("test_loss") for r in arm["epochs"]]
        loss_ax.plot(epochs, test_losses, "o--", color=color, label=f"{name} test")
        accuracies = [r.get("test_accuracy") for r in arm["epochs"]]
        accuracy_ax.plot(epochs, accuracies, "o--", color=color, label=f"{name} test")
    loss_ax.set(xlabel="epoch", ylabel="loss", title="Loss per epoch")
    accuracy_ax.set(xlabel="epoch", ylabel="accuracy", title="Test accuracy per epoch")
    for ax in (loss_ax, accuracy_ax):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend()
        ax.grid(alpha=0.3)
    figure.tight_layout()
    paths.append(directory / PLOTS[0])
    figure.savefig(paths[-1], dpi=100)
    plt.close(figure)

    for filename, field, ylabel, title in (
        (PLOTS[1], "throughput_img_s", "images/s", "Training throughput"),
        (PLOTS[2], "peak_memory_mb", "MB", "Peak memory"),
    ):
        figure, ax = plt.subplots(figsize=(5, 4))
        _bars(ax, runs, field, ylabel, title)
        figure.tight_layout()
        paths.append(directory / filename)
        figure.savefig(paths[-1], dpi=100)
        plt.close(figure)
    return paths
