"""The comparison's figures (matplotlib, PNG): curves per epoch, throughput, peak memory."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display, in a pod or on a CI machine

import matplotlib.pyplot as plt

PLOTS = ("curves.png", "throughput.png", "memory.png")


def _bars(ax: Any, runs: Mapping[str, Any], field: str, ylabel: str, title: str) -> None:
    names = list(runs)
    means = [runs[name][field] or 0.0 for name in names]
    errors = [(runs[name][f"{field}_ci95"] or {}).get("ci95_half_width") or 0.0 for name in names]
    bars = ax.bar(
        names, means, yerr=errors, capsize=6, color=["#4C72B0", "#DD8452", "#55A868"][: len(names)]
    )
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
    for name, arm in runs.items():
        epochs = [record["epoch"] for record in arm["epochs"]]
        loss_ax.plot(
            epochs, [r.get("train_loss") for r in arm["epochs"]], "o-", label=f"{name} train"
        )
        if any("test_loss" in r for r in arm["epochs"]):
            loss_ax.plot(
                epochs, [r.get("test_loss") for r in arm["epochs"]], "o--", label=f"{name} test"
            )
        accuracy_ax.plot(
            epochs, [r.get("test_accuracy") for r in arm["epochs"]], "o-", label=f"{name} test"
        )
    loss_ax.set(xlabel="epoch", ylabel="loss", title="Loss per epoch")
    accuracy_ax.set(xlabel="epoch", ylabel="accuracy", title="Test accuracy per epoch")
    for ax in (loss_ax, accuracy_ax):
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
